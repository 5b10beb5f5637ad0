"""Closed-loop load generator for OpenAI-compatible endpoints (asyncio + aiohttp).

Exactly ``concurrency`` requests are in flight: each worker sends its next request when the
previous one has been read to the end. After ``warmup`` unmeasured requests, ``n`` measured ones
run (or fewer: no new request starts after ``max_seconds``). Several base URLs are used
round-robin from the client side (the "direct" baseline). Every response is validated: HTTP 200,
the expected number of output tokens (the fake nodes emit ``tok<i>`` per token) and, for streams,
a final ``data: [DONE]``; anything else is an error.

CPU seconds of watched process trees (``watch``: name → PID) are read from ``/proc`` right before
and right after the measured phase, so start-up and warm-up are not counted; so are the busy and
total CPU seconds of the whole machine (``/proc/stat``), which tell how much else was running.

``bench overhead`` runs it as a subprocess (``python -m inferlb.bench.loadgen --spec
JSON``; one JSON object on stdout) so the generator's own CPU stays out of the measured process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from collections.abc import Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from .procs import system_busy, tree_cpu_seconds

__all__ = ["LoadSpec", "main", "percentile", "run_load", "summarize"]

_TOK = re.compile(rb"tok\d+")
_PROMPT = ("Write a short note about load testing inference gateways. " * 4).strip()


@dataclass
class LoadSpec:
    """One load run (one cell of the benchmark table)."""

    urls: list[str]                      # base URLs, round-robin
    n: int = 2000
    concurrency: int = 16
    stream: bool = False
    max_tokens: int = 32
    model: str = "fake-chat"
    warmup: int = 100
    max_seconds: float = 30.0            # cap on the measured phase (and, separately, the warm-up)
    timeout_s: float = 60.0              # per request
    watch: dict[str, int] = field(default_factory=dict)


def percentile(sorted_vals: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 1] of already sorted values (NaN when empty)."""
    if not sorted_vals:
        return float("nan")
    k = (len(sorted_vals) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def summarize(values: Sequence[float], scale: float = 1.0) -> dict[str, float]:
    """p50 / p90 / p99 / max / mean (times ``scale``) and the count ``n``."""
    s = sorted(v * scale for v in values)
    return {"p50": percentile(s, 0.5), "p90": percentile(s, 0.9), "p99": percentile(s, 0.99),
            "max": s[-1] if s else float("nan"), "mean": sum(s) / len(s) if s else float("nan"),
            "n": float(len(s))}


@dataclass
class _Result:
    ok: bool
    e2e: float
    ttft: float | None = None
    err: str | None = None


def _payload(spec: LoadSpec) -> bytes:
    body: dict[str, Any] = {"model": spec.model, "max_tokens": spec.max_tokens, "temperature": 0.7,
                            "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                         {"role": "user", "content": _PROMPT}]}
    if spec.stream:
        body["stream"] = True
    return json.dumps(body).encode()


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, spec: LoadSpec,
               timeout: aiohttp.ClientTimeout) -> _Result:
    t0 = time.perf_counter()
    ttft: float | None = None
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"},
                                timeout=timeout) as resp:
            if resp.status != 200:
                txt = await resp.read()
                return _Result(False, time.perf_counter() - t0, err=f"http {resp.status}: {txt[:100]!r}")
            if spec.stream:
                buf = bytearray()
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    if ttft is None and _TOK.search(buf):
                        ttft = time.perf_counter() - t0
                e2e = time.perf_counter() - t0
                data = bytes(buf)
                if not data.rstrip().endswith(b"data: [DONE]"):
                    return _Result(False, e2e, ttft, err="stream without [DONE]")
            else:
                data = await resp.read()
                e2e = time.perf_counter() - t0
            ntok = len(_TOK.findall(data))
            if ntok != spec.max_tokens:
                return _Result(False, e2e, ttft, err=f"tokens {ntok} != {spec.max_tokens}")
            return _Result(True, e2e, ttft)
    except TimeoutError:
        return _Result(False, time.perf_counter() - t0, err="timeout")
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        return _Result(False, time.perf_counter() - t0, err=f"{type(exc).__name__}: {exc}"[:160])


async def run_load(spec: LoadSpec) -> dict[str, Any]:
    """Run ``spec``; returns the figures (latencies in ms, CPU in seconds)."""
    urls = [u.rstrip("/") + "/v1/chat/completions" for u in spec.urls]
    body = _payload(spec)
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
    conn = aiohttp.TCPConnector(limit=spec.concurrency, limit_per_host=0)

    async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as session:
        async def phase(count: int, seconds: float) -> list[_Result]:
            results: list[_Result] = []
            deadline = time.perf_counter() + seconds
            counter = iter(range(count))

            async def worker() -> None:
                for i in counter:
                    if time.perf_counter() > deadline:
                        return
                    results.append(await _one(session, urls[i % len(urls)], body, spec, timeout))

            await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
            return results

        if spec.warmup > 0:
            await phase(spec.warmup, spec.max_seconds)
        cpu0 = {k: tree_cpu_seconds(p) for k, p in spec.watch.items()}
        sys0 = system_busy()
        self0 = os.times()
        t0 = time.perf_counter()
        results = await phase(spec.n, spec.max_seconds)
        wall = time.perf_counter() - t0
        self1 = os.times()
        sys1 = system_busy()
        cpu1 = {k: tree_cpu_seconds(p) for k, p in spec.watch.items()}

    ok = [r for r in results if r.ok]
    errs: dict[str, int] = {}
    for r in results:
        if not r.ok and r.err is not None:
            errs[r.err] = errs.get(r.err, 0) + 1
    done = len(results)
    cpu_s: dict[str, float | None] = {}
    for k in spec.watch:
        a, b = cpu0.get(k), cpu1.get(k)
        cpu_s[k] = (b - a) if a is not None and b is not None else None
    busy = busy_s = total_s = None
    if sys0 is not None and sys1 is not None and sys1[1] > sys0[1]:
        busy_s, total_s = sys1[0] - sys0[0], sys1[1] - sys0[1]
        busy = busy_s / total_s
    return {
        "spec": asdict(spec),
        "n_done": done, "n_ok": len(ok), "errors": done - len(ok),
        "error_kinds": dict(sorted(errs.items(), key=lambda kv: -kv[1])[:5]),
        "wall_s": wall, "rps": done / wall if wall > 0 else float("nan"),
        "e2e_ms": summarize([r.e2e for r in ok], 1e3),
        "ttft_ms": summarize([r.ttft for r in ok if r.ttft is not None], 1e3) if spec.stream else None,
        "cpu_s": cpu_s,
        "cpu_s_per_1k": {k: (v * 1000.0 / done if v is not None and done else None)
                         for k, v in cpu_s.items()},
        "loadgen_cpu_s": (self1.user - self0.user) + (self1.system - self0.system),
        "system_busy_frac": busy, "system_busy_cpu_s": busy_s, "system_total_cpu_s": total_s,
    }


def _run(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run on uvloop when it is installed (as the peer bench's generator does)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> int:
    """``--spec JSON`` (a :class:`LoadSpec` as JSON) → one JSON result line on stdout."""
    ap = argparse.ArgumentParser(prog="python -m inferlb.bench.closed_loop", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="LoadSpec as a JSON object")
    args = ap.parse_args(argv)
    spec = LoadSpec(**json.loads(args.spec))
    out = _run(run_load(spec))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
