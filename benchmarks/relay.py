"""The streaming data path alone: CPU of the gateway's upstream reader and SSE relay per request.

``python -m benchmarks.relay [--n 320] [--tokens 256] [--concurrency 16]`` starts a bare aiohttp
server in a subprocess (one SSE event per write, no delay, so the figures are the client's cost,
not the node's) and reads ``n`` streams of ``tokens`` events through
:class:`~inferlb.engine.upstream.Upstream` and :class:`~inferlb.engine.sse.SSERelay`, ``concurrency``
at a time. It prints this process's CPU per request and per chunk received (the kernel coalesces
writes, so chunks < events). Bounded by count; every stream is checked to end with ``[DONE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

from inferlb.bench.loadgen.procs import free_port
from inferlb.config.settings import TimeoutConfig
from inferlb.engine.sse import SSERelay
from inferlb.engine.upstream import Upstream

__all__ = ["main", "measure"]

_SERVER = """
import asyncio, sys
from aiohttp import web
EVENT = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"tok "}}]}\\n\\n'
async def stream(request):
    await request.read()
    r = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await r.prepare(request)
    for _ in range(int(request.query["n"])):
        await r.write(EVENT)
        await asyncio.sleep(0)
    await r.write(b"data: [DONE]\\n\\n")
    await r.write_eof()
    return r
app = web.Application()
app.router.add_post("/stream", stream)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""
_TIMEOUTS = TimeoutConfig(connect_s=5.0, first_token_s=10.0, idle_s=10.0, total_s=60.0)


async def measure(port: int, *, n: int, tokens: int, concurrency: int) -> dict[str, float]:
    """CPU ms per request and µs per chunk of reading ``n`` streams from the server on ``port``."""
    url = f"http://127.0.0.1:{port}/stream?n={tokens}"
    async with Upstream(limit=concurrency * 2, limit_per_host=concurrency * 2) as up:
        for _ in range(100):   # wait for the server to listen (bounded)
            try:
                await _one(up, url)
                break
            except Exception:
                await asyncio.sleep(0.05)
        rounds = max(1, n // concurrency)
        chunks = 0
        c0 = time.process_time()
        for _ in range(rounds):
            chunks += sum(await asyncio.gather(*(_one(up, url) for _ in range(concurrency))))
        cpu = time.process_time() - c0
    requests = rounds * concurrency
    return {"requests": requests, "chunks": chunks, "cpu_ms_per_request": cpu / requests * 1e3,
            "cpu_us_per_chunk": cpu / chunks * 1e6}


async def _one(up: Upstream, url: str) -> int:
    resp = await up.open(url, b"{}", headers={}, timeouts=_TIMEOUTS, node="bench")
    relay = SSERelay()
    chunks = 1
    async with resp:
        relay.feed(resp.first_chunk)
        async for chunk in resp.chunks():
            relay.feed(chunk)
            chunks += 1
    relay.finish()
    if not relay.done:
        raise RuntimeError("a stream ended without [DONE]")
    return chunks


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.relay", description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=320)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16)
    a = p.parse_args(argv)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)])
    try:
        out = asyncio.run(measure(port, n=a.n, tokens=a.tokens, concurrency=a.concurrency))
    finally:
        server.terminate()
        server.wait(10)
    print(f"{out['requests']:.0f} streams of {a.tokens} events, c={a.concurrency}: "
          f"{out['cpu_ms_per_request']:.3f} ms CPU/request, {out['cpu_us_per_chunk']:.1f} µs CPU/chunk "
          f"({out['chunks']:.0f} chunks)")


if __name__ == "__main__":
    main()
