"""Writing one generation to the client: the non-stream body or the SSE stream, with mid-body faults.

Contract: tokens are written as the :class:`~.driver.TokenSource` makes them available, never
earlier; a stream sends its first token alone and then up to ``stream_interval`` tokens per write
(vLLM's ``--stream-interval``). The faults read here (``drop_after_tokens``, ``stall_after_tokens``,
``malformed_sse_at``, ``error_event_at``) are the ones the request saw when it started, so changing
faults never alters a response already being written. Every write that happens counts in
:class:`~.stats.NodeStats` (``statuses``, ``faults_injected``, ``completed``, ``disconnects``);
``on_complete`` is called once, when (and only when) the body was written to its end, the moment
``completed`` counts it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from inferlb.simulator import openai_format as fmt
from inferlb.simulator.driver import TokenSource
from inferlb.simulator.spec import FaultSpec
from inferlb.simulator.stats import NodeStats

__all__ = ["HANG_CAP_S", "cut", "write_stream", "write_unary"]

# A hang or stall lasts until the client or the node goes away; this cap only keeps the wait bounded.
HANG_CAP_S = 3600.0
_JSON = "application/json"


def cut(request: web.Request) -> None:
    """Close the connection mid-body: buffered bytes are flushed, the body is never finished."""
    if request.transport is not None:
        request.transport.close()


async def write_unary(request: web.Request, payload: bytes, source: TokenSource, faults: FaultSpec,
                      stats: NodeStats, on_complete: Callable[[], None] | None = None) -> web.StreamResponse:
    """The non-stream answer, sent when the last token exists (or a cut / stall / broken body)."""
    n = source.output_tokens
    for at, stall in ((faults.drop_after_tokens, False), (faults.stall_after_tokens, True)):
        if at is None or at >= n:
            continue
        stats.faults_injected += 1
        await source.wait(at)
        resp = web.StreamResponse(status=200, headers={"Content-Type": _JSON})
        resp.content_length = len(payload)
        stats.statuses[200] += 1
        await resp.prepare(request)
        if stall:
            await asyncio.sleep(HANG_CAP_S)
            return resp
        await resp.write(payload[: len(payload) // 2])
        cut(request)
        return resp
    await source.wait(n)
    if faults.malformed_sse_at is not None:
        stats.faults_injected += 1
        payload = payload[: len(payload) // 2]
    stats.completed += 1
    stats.statuses[200] += 1
    if on_complete is not None:
        on_complete()
    return web.Response(status=200, body=payload, content_type=_JSON)


async def write_stream(request: web.Request, tmpl: fmt.ChunkTemplate, source: TokenSource, faults: FaultSpec,
                       stats: NodeStats, *, finish: str, include_usage: bool,
                       stream_interval: int = 1,
                       on_complete: Callable[[], None] | None = None) -> web.StreamResponse:
    """The SSE answer: headers at once (as vLLM does), then tokens as they are made."""
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    stats.statuses[200] += 1
    await resp.prepare(request)  # headers go out now; the first token comes at the TTFT
    n = source.output_tokens
    sent = 0
    try:
        while sent < n:  # bounded: each pass sends at least one token
            want = 1 if sent == 0 else min(n, sent + stream_interval)
            have = await source.wait(want)
            buf = bytearray()
            for i in range(sent, have):
                if i == faults.drop_after_tokens:
                    stats.faults_injected += 1
                    await _flush(resp, buf)
                    cut(request)
                    return resp
                if i == faults.stall_after_tokens:
                    stats.faults_injected += 1
                    await _flush(resp, buf)
                    await asyncio.sleep(HANG_CAP_S)
                    return resp
                if i == faults.error_event_at:
                    stats.faults_injected += 1
                    buf += fmt.sse({"error": {"message": "injected in-band error", "type": "server_error",
                                              "param": None, "code": "internal_error"}})
                    await _flush(resp, buf)
                    await resp.write_eof()  # a clean end of the body, but no [DONE]
                    return resp
                if i == faults.malformed_sse_at:
                    stats.faults_injected += 1
                    chunk = tmpl.malformed(i)
                else:
                    chunk = tmpl.token(i)
                if i == 0:
                    chunk = tmpl.opening() + chunk
                buf += chunk
            sent = max(sent, have)
            await _flush(resp, buf)
        if faults.drop_after_tokens == n:
            stats.faults_injected += 1
            cut(request)
            return resp
        tail = tmpl.finish(finish)
        if include_usage:
            tail += tmpl.usage(source.prompt_tokens, n)
        await resp.write(tail + tmpl.done())
        await resp.write_eof()
    except ConnectionResetError:
        # The client went away between two writes; aiohttp will not write to the dead socket.
        stats.disconnects += 1
        return resp
    stats.completed += 1
    if on_complete is not None:
        on_complete()
    return resp


async def _flush(resp: web.StreamResponse, buf: bytearray) -> None:
    if buf:
        await resp.write(bytes(buf))
        buf.clear()
