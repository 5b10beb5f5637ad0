"""The load generator: sends a plan's requests open loop (at their times, whatever happened to earlier
ones) or closed loop (a fixed number in flight).

Contract, open loop (``concurrency=None``): request *i* is sent at ``start + plan[i].t`` (the send
lag is recorded, so an overloaded generator shows in the figures instead of silently lowering the
load). Closed loop (``concurrency=c``): ``c`` workers each send the plan's next request as soon as
their previous one has been read to the end, ``t`` is when it was sent, and none starts after
``max_seconds``; the requests never sent are left out of the run. Either way each is read to the end and
checked (HTTP 200, the expected number of ``tok<i>`` tokens, ``data: [DONE]`` for streams); the
node that answered is read from ``system_fingerprint`` (the emulator puts its name there, and the
gateway passes bytes through). Nothing waits forever: every request has the workload's
``timeout_s``, and the run as a whole ends at most ``timeout_s + 10`` s after the last send, with
stragglers cancelled and counted as timeouts. While it runs, each node's ``/sim/stats`` is sampled
every ``sample_s`` for the engine figures (queue, KV use, preemptions, crashes).

A prompt of *N* tokens is *4N* bytes of text, which both the emulator and the gateway's byte
heuristic count as *N* tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from inferlb.bench.loadgen.procs import tree_cpu_seconds
from inferlb.bench.loadgen.sessions import chat_messages
from inferlb.bench.loadgen.workload import PlannedRequest, Workload
from inferlb.simulator.node import SIM_OUTPUT_FIELD

__all__ = ["Outcome", "RunData", "Sample", "run_plan"]

# Token text: "tok<i> " from the emulator, " tok<i>" from the peer bench's fake server.
_TOK = re.compile(rb"tok\d+")
_FINGERPRINT = re.compile(rb'"system_fingerprint":"([^"]{1,200})"')
_FILLER = ("The quick brown fox jumps over the lazy dog while the load balancer routes tokens. " * 400)


@dataclass(slots=True)
class Outcome:
    """One request as the client saw it; times in seconds, ``t`` from the start of the run."""

    i: int
    t: float
    prompt_tokens: int
    output_tokens: int
    stream: bool
    tenant: str | None
    priority: str | None
    lag: float = 0.0
    status: int | None = None
    ok: bool = False
    error: str | None = None
    ttft: float | None = None
    e2e: float = 0.0
    tokens: int = 0
    node: str | None = None
    code: str | None = None        # error.code of an error answer
    retry_after: bool = False      # the answer carried Retry-After

    @property
    def end(self) -> float:
        """When the answer was complete, from the start of the run."""
        return self.t + self.lag + self.e2e


@dataclass(slots=True)
class Sample:
    """One reading of one node's ``/sim/stats`` (``t`` from the start of the run)."""

    t: float
    node: str
    running: int
    waiting: int
    kv_usage: float
    preemptions: int
    oom_crashes: int
    crashes: int
    requests_total: int
    loading: bool


@dataclass
class RunData:
    """Everything one run produced, for :mod:`.results`."""

    label: str
    outcomes: list[Outcome]
    samples: list[Sample] = field(default_factory=list)
    duration_s: float = 0.0        # the arrival window
    wall_s: float = 0.0            # until the last answer
    started_at: float = 0.0        # epoch seconds
    cpu: list[tuple[float, dict[str, float]]] = field(default_factory=list)   # (t, CPU seconds per process)


def _body(p: PlannedRequest, w: Workload) -> bytes:
    body: dict[str, Any] = {"model": p.model or w.model,
                            "messages": [{"role": "user", "content": _FILLER[: 4 * p.prompt_tokens]}]}
    if p.chat is not None:   # a turn of a multi-turn session: system prompt + history + new message
        body["messages"] = chat_messages(p.chat)
        if p.chat.send_session:
            body["user"] = p.chat.session
    if w.max_tokens == "exact":
        body["max_tokens"] = p.output_tokens
    else:
        declared = p.max_tokens if w.max_tokens == "mix" else w.max_tokens if isinstance(w.max_tokens, int) else None
        if declared is not None:
            body["max_tokens"] = declared
        body[SIM_OUTPUT_FIELD] = p.output_tokens
    if p.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def _expected(p: PlannedRequest, w: Workload) -> int:
    if w.max_tokens == "mix":
        return p.answer_tokens
    return min(p.output_tokens, w.max_tokens) if isinstance(w.max_tokens, int) else p.output_tokens


async def _one(session: aiohttp.ClientSession, url: str, p: PlannedRequest, o: Outcome, w: Workload) -> None:
    deadline_s = w.deadline_s if w.deadline_s is not None else w.timeout_s
    headers = {"content-type": "application/json", "x-inferlb-deadline-ms": str(int(deadline_s * 1000))}
    if p.api_key:
        headers["authorization"] = f"Bearer {p.api_key}"     # the key names the tenant
    elif p.tenant:
        headers["x-inferlb-tenant"] = p.tenant
    if p.priority:
        headers["x-inferlb-priority"] = p.priority
    t0 = time.monotonic()
    want = _expected(p, w)
    try:
        async with session.post(url, data=_body(p, w), headers=headers,
                                timeout=aiohttp.ClientTimeout(total=w.timeout_s)) as resp:
            o.status = resp.status
            o.retry_after = "retry-after" in resp.headers
            if resp.status != 200:
                o.code = _error_code(await resp.read())
                o.error = f"http_{resp.status}"
                return
            buf = bytearray()
            if p.stream:
                async for chunk in resp.content.iter_any():
                    if o.ttft is None and _TOK.search(chunk):
                        o.ttft = time.monotonic() - t0
                    buf += chunk
            else:
                buf += await resp.read()
            o.e2e = time.monotonic() - t0
            m = _FINGERPRINT.search(buf)
            o.node = m.group(1).decode() if m else None
            o.tokens = len(_TOK.findall(buf))
            if p.stream and not bytes(buf[-64:]).rstrip().endswith(b"data: [DONE]"):
                o.error = "in_band_error" if b'"error"' in buf else "incomplete"
            elif o.tokens != want:
                o.error = "incomplete"
            else:
                o.ok = True
    except TimeoutError:
        o.error = "timeout"
    except aiohttp.ClientConnectorError:
        o.error = "connect"
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionResetError):
        o.error = "reset"
    except (aiohttp.ClientError, OSError) as exc:
        o.error = type(exc).__name__
    finally:
        if not o.ok and o.e2e == 0.0:
            o.e2e = time.monotonic() - t0


def _error_code(raw: bytes) -> str:
    """``error.code`` of an OpenAI error body (``"unreadable"`` when there is none)."""
    try:
        return str(json.loads(raw)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "unreadable"


async def _sampler(nodes: dict[str, str], out: list[Sample], start: float, every_s: float,
                   stop: asyncio.Event, cpu_watch: dict[str, int], cpu_out: list[tuple[float, dict[str, float]]]
                   ) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as s:
        async def read(name: str, url: str) -> None:
            try:
                async with s.get(url + "/sim/stats") as r:
                    d = await r.json()
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                return   # a crashed or stopped node: no sample, which the report shows as a gap
            e = d.get("engine", {})
            out.append(Sample(time.monotonic() - start, name, int(e.get("running", 0)), int(e.get("waiting", 0)),
                              float(e.get("kv_usage", 0.0)), int(e.get("preemptions", 0)),
                              int(e.get("oom_crashes", 0)), int(e.get("crashes", 0)),
                              int(d.get("requests_total", 0)), bool(d.get("loading", False))))

        def read_cpu() -> None:
            if not cpu_watch:
                return
            secs = {k: tree_cpu_seconds(pid) for k, pid in cpu_watch.items()}
            self_t = os.times()
            found = {k: v for k, v in secs.items() if v is not None}
            found["loadgen"] = self_t.user + self_t.system
            cpu_out.append((time.monotonic() - start, found))

        while not stop.is_set():  # until the run ends
            read_cpu()
            await asyncio.gather(*(read(n, u) for n, u in nodes.items()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
        await asyncio.gather(*(read(n, u) for n, u in nodes.items()))   # the final reading
        read_cpu()


async def run_plan(requests: Sequence[PlannedRequest], w: Workload, targets: Sequence[str], *, label: str,
                   nodes: dict[str, str] | None = None, sample_s: float = 1.0, progress: bool = False,
                   duration_s: float | None = None, cpu_watch: dict[str, int] | None = None,
                   concurrency: int | None = None, max_seconds: float | None = None) -> RunData:
    """Send ``requests`` to ``targets`` (base URLs; several: client-side round robin, "direct"),
    open loop, or closed loop with ``concurrency`` in flight (bounded by ``max_seconds``).
    ``cpu_watch`` (name → PID) adds CPU-time readings of those process trees to each sample."""
    if not targets:
        raise ValueError("no target URL")
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    urls = [u.rstrip("/") + "/v1/chat/completions" for u in targets]
    outcomes = [Outcome(i, p.t, p.prompt_tokens, _expected(p, w), p.stream, p.tenant, p.priority)
                for i, p in enumerate(requests)]
    data = RunData(label, outcomes, duration_s=duration_s if duration_s is not None else
                   (requests[-1].t if requests else 0.0), started_at=time.time())
    stop = asyncio.Event()
    start = time.monotonic()
    sampler = asyncio.create_task(_sampler(nodes or {}, data.samples, start, sample_s, stop, cpu_watch or {},
                                           data.cpu))
    bar = _Progress(label, len(requests)) if progress else None
    conn = aiohttp.TCPConnector(limit=concurrency or 0, limit_per_host=0)
    try:
        async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as session:
            if concurrency is None:
                await _open_loop(session, urls, requests, outcomes, w, start, bar)
            else:
                data.outcomes = await _closed_loop(session, urls, requests, outcomes, w, start, concurrency,
                                                   max_seconds, bar)
    finally:
        data.wall_s = time.monotonic() - start
        if concurrency is not None and duration_s is None:
            data.duration_s = data.wall_s
        stop.set()
        with contextlib.suppress(Exception):
            await sampler
        if bar is not None:
            bar.close()
    return data


async def _open_loop(session: aiohttp.ClientSession, urls: list[str], requests: Sequence[PlannedRequest],
                     outcomes: list[Outcome], w: Workload, start: float, bar: _Progress | None) -> None:
    tasks: list[asyncio.Task[None]] = []
    for p, o in zip(requests, outcomes, strict=True):
        delay = start + p.t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        o.lag = max(0.0, time.monotonic() - start - p.t)
        tasks.append(asyncio.create_task(_one(session, urls[o.i % len(urls)], p, o, w)))
        if bar is not None:
            bar.update(outcomes, len(tasks))
    pending = {t for t in tasks if not t.done()}
    end_by = time.monotonic() + w.timeout_s + 10.0
    while pending and time.monotonic() < end_by:   # bounded by end_by
        _, pending = await asyncio.wait(pending, timeout=0.5)
        if bar is not None:
            bar.update(outcomes, len(tasks))
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
        for o in outcomes:
            if o.status is None and o.error is None and not o.ok:
                o.error = "timeout"


async def _closed_loop(session: aiohttp.ClientSession, urls: list[str], requests: Sequence[PlannedRequest],
                       outcomes: list[Outcome], w: Workload, start: float, concurrency: int,
                       max_seconds: float | None, bar: _Progress | None) -> list[Outcome]:
    """The outcomes of the requests sent, in plan order (each worker is bounded by the plan's length,
    each request by ``w.timeout_s``)."""
    todo = iter(zip(requests, outcomes, strict=True))
    stop_at = start + max_seconds if max_seconds is not None else math.inf
    sent: list[Outcome] = []

    async def worker() -> None:
        for p, o in todo:
            if time.monotonic() > stop_at:
                return
            o.t = time.monotonic() - start
            sent.append(o)
            await _one(session, urls[o.i % len(urls)], p, o, w)
            if bar is not None:
                bar.update(outcomes, len(sent))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sorted(sent, key=lambda o: o.i)


class _Progress:
    """A rich progress bar on stderr (sent / answered / errors / in flight), refreshed at most 4×/s."""

    def __init__(self, label: str, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                           console=Console(stderr=True), transient=False)
        self._task = self._p.add_task(label, total=total, info="")
        self._p.start()
        self._last = 0.0

    def update(self, outcomes: Sequence[Outcome], sent: int) -> None:
        now = time.monotonic()
        if now - self._last < 0.25:
            return
        self._last = now
        done = sum(1 for o in outcomes[:sent] if o.ok or o.error is not None)
        errors = sum(1 for o in outcomes[:sent] if o.error is not None)
        self._p.update(self._task, completed=done,
                       info=f"sent {sent}  errors {errors}  in flight {sent - done}")

    def close(self) -> None:
        self._p.stop()
