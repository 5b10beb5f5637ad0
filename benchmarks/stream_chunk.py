"""The gateway's own Python work per relayed read of a stream, two trees side by side.

::

    python -m benchmarks.stream_chunk --a ROOT_A --b ROOT_B [--pairs 6] [--tokens 256] [--requests 30]

Each measurement is a child process importing ``inferlb`` from one tree (``PYTHONPATH``): the app
from ``create_app`` (every middleware, ``HotRoutes``, the gateway and its request process, the SSE
relay, ``WatchedStreamingResponse``; SQLite audit) started by its lifespan and called as an ASGI
app, no server, in front of a fake upstream response whose every read awaits a future the event
loop resolves on its next turn, so that each read resumes the whole chain of awaiting frames as a
socket read does. The reads are the peer bench's fake node's events (a role chunk, one chat chunk
per token, the closing chunk, the usage chunk, ``[DONE]``), one event per read.

Per read, from streams of ``tokens + 2`` and of 2 tokens (the difference over ``tokens`` cancels
what every request costs once):

- ``calls``: Python function calls and coroutine resumes on the loop's thread
  (``sys.setprofile``), deterministic: the least of 3 windows of 5 requests, since a background
  loop ticking inside a window only adds calls;
- ``cpu µs``: process CPU, the least of ``--repeats`` runs of ``--requests`` requests each.

What it leaves out: aiohttp (the fake upstream stands in for it), uvicorn and the kernel's socket
calls, which these cuts do not change; ``request_profile ab`` measures the whole. The children
run A, B, B, A, A, B ... so neither tree always runs first; the B/A median is over the pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["main"]

_CHILD = r'''
import asyncio, json, sys, tempfile, time
from pathlib import Path

tokens, requests, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
from inferlb.app import create_app
from inferlb.config.settings import Settings, fleet_from_mapping

HEAD = (b'{"id":"chatcmpl-8f097b2c","object":"chat.completion.chunk","created":1764770000,"model":"m",'
        b'"system_fingerprint":"fake-0","choices":[{"index":0,')
ROLE = b"data: " + HEAD + b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
LAST = [b"data: " + HEAD + b'"delta":{},"logprobs":null,"finish_reason":"length"}]}\n\n',
        b'data: {"id":"chatcmpl-8f097b2c","object":"chat.completion.chunk","created":1764770000,"model":"m",'
        b'"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}}\n\n',
        b"data: [DONE]\n\n"]


def token(i):
    return b"data: " + HEAD + b'"delta":{"content":" tok%d"},"logprobs":null,"finish_reason":null}]}\n\n' % i


class FakeResponse:
    """What the gateway reads of an upstream response; each read waits one loop turn."""

    def __init__(self, n):
        self.first_chunk, self.status, self.headers, self.node, self.eof = ROLE, 200, {}, "n0", False
        self._rest = [token(i) for i in range(n)] + LAST[:1] + [LAST[1] % (n, n + 3)] + LAST[2:]

    async def next_chunk(self):
        loop = asyncio.get_running_loop()
        turn = loop.create_future()
        loop.call_soon(turn.set_result, None)
        await turn
        return self._rest.pop(0) if self._rest else b""

    def chunks(self):   # the iterator form, for a tree whose gateway reads through it
        return _Chunks(self)

    def close(self):
        pass

    async def aclose(self):
        pass


class _Chunks:
    def __init__(self, r):
        self.r = r

    def __aiter__(self):
        return self

    async def __anext__(self):
        data = await self.r.next_chunk()
        if not data:
            raise StopAsyncIteration
        return data


async def main():
    with tempfile.TemporaryDirectory() as tmp:
        fleet = fleet_from_mapping({
            "models": [{"name": "m", "max_output_tokens": 4096, "default_max_tokens": 8}],
            "nodes": [{"name": "n0", "url": "http://127.0.0.1:9", "models": ["m"]}],
            "routing": {"profile": "round-robin", "seed": 1}})
        settings = Settings(fleet=fleet, database_url=f"sqlite:///{tmp}/audit.db", journal_dir=Path(tmp) / "journal")
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            gw = app.state.gateway
            want = {"n": 2}

            async def fake_open(url, body, **kw):
                return FakeResponse(want["n"])

            gw.upstream.open = fake_open
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": tokens + 2, "stream": True}).encode()
            scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                     "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
                     "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
                     "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000),
                     "headers": [(b"content-type", b"application/json"), (b"host", b"gw")], "state": {}}

            async def one(n):
                want["n"] = n
                done = asyncio.Event()
                st = {"read": False, "body": []}

                async def receive():
                    if not st["read"]:
                        st["read"] = True
                        return {"type": "http.request", "body": body, "more_body": False}
                    await done.wait()
                    return {"type": "http.disconnect"}

                async def send(m):
                    if m["type"] == "http.response.body":
                        st["body"].append(m.get("body", b""))
                        if not m.get("more_body"):
                            done.set()

                await app(dict(scope), receive, send)
                out = b"".join(st["body"])
                assert out.endswith(b"data: [DONE]\n\n") and out.count(b"tok") == n, out[-200:]

            for _ in range(20):
                await one(tokens)
            cpu = {2: [], tokens + 2: []}
            for _ in range(repeats):
                for n in cpu:
                    t0 = time.process_time()
                    for _ in range(requests):
                        await one(n)
                    cpu[n].append((time.process_time() - t0) / requests)
            calls = {}
            for n in cpu:
                # The least of 3 windows of 5 requests: a background loop that ticks inside a
                # window (more of them the longer a loaded machine makes it) only adds calls.
                windows = []
                for _ in range(3):
                    count = [0]

                    def prof(frame, event, arg, count=count):
                        if event == "call":
                            count[0] += 1

                    sys.setprofile(prof)
                    for _ in range(5):
                        await one(n)
                    sys.setprofile(None)
                    windows.append(count[0] / 5)
                calls[n] = min(windows)
            big = tokens + 2
            print(json.dumps({"cpu_us_per_read": (min(cpu[big]) - min(cpu[2])) / tokens * 1e6,
                              "calls_per_read": (calls[big] - calls[2]) / tokens,
                              "cpu_us_request_2_tokens": min(cpu[2]) * 1e6}))


import uvloop
uvloop.run(main())
'''


def _child(root: Path, tokens: int, requests: int, repeats: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    with tempfile.TemporaryDirectory() as cwd:   # no tree on the path but ``root``
        r = subprocess.run([sys.executable, "-c", _CHILD, str(tokens), str(requests), str(repeats)], env=env,
                           cwd=cwd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"child for {root} failed:\n{r.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.stream_chunk", description=__doc__.splitlines()[0])
    p.add_argument("--a", type=Path, required=True)
    p.add_argument("--b", type=Path, required=True)
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--requests", type=int, default=30)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    print(f"A = {a.a.resolve()}\nB = {a.b.resolve()}\n")
    print("| pair | first | A cpu µs/read | B cpu µs/read | B/A | A calls/read | B calls/read |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    ratios, calls = [], []
    for i in range(a.pairs):
        order = ("A", "B") if i % 2 == 0 else ("B", "A")
        got = {k: _child((a.a if k == "A" else a.b).resolve(), a.tokens, a.requests, a.repeats) for k in order}
        ra, rb = got["A"], got["B"]
        ratios.append(rb["cpu_us_per_read"] / ra["cpu_us_per_read"])
        calls.append((ra["calls_per_read"], rb["calls_per_read"]))
        print(f"| {i + 1} | {order[0]} | {ra['cpu_us_per_read']:.2f} | {rb['cpu_us_per_read']:.2f} | "
              f"{ratios[-1]:.3f} | {ra['calls_per_read']:.2f} | {rb['calls_per_read']:.2f} |", flush=True)
    print(f"\nB/A cpu per read: median {statistics.median(ratios):.3f} (range {min(ratios):.3f}–{max(ratios):.3f}, "
          f"{len(ratios)} pairs); calls per read A {statistics.median(c[0] for c in calls):.2f}, "
          f"B {statistics.median(c[1] for c in calls):.2f}")


if __name__ == "__main__":
    main()
