"""The streamed response of the gateway: starlette's ``StreamingResponse`` with a cheaper
disconnect watch.

Contract (what starlette's response does under ASGI spec 2.3, which uvicorn speaks): the body
iterator is relayed to the client; when the client disconnects (``receive()`` returns
``http.disconnect``) while it runs, the relay is cancelled at its pending await (the iterator's
``finally`` runs: the gateway audits the request as ``client_closed`` and closes the node's
connection), and the call returns normally. An error of the iterator propagates; so does a
cancellation that did not come from the watch.

Starlette does this with an anyio task group: the relay in a second task, a cancel scope that
formats ``repr(task)`` when cancelled. Here one watcher task cancels the handler's own task, as
``gateway._watch`` does before the response starts: 9 µs instead of 56–64 µs per streamed
response of four chunks (docs/benchmarks.md, "The request path profiled again").
"""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["WatchedStreamingResponse"]


class WatchedStreamingResponse(StreamingResponse):
    """``StreamingResponse`` whose disconnect watch is one task (module docstring).

    :attr:`started` is True once the response start has been handed to ``send`` (set just before,
    as a ``send`` wrapper watching for it would be): a caller that passes the server's ``send``
    unwrapped (``api/edge.py`` ``HotRoutes``) reads from it whether the answer had begun.
    """

    started = False

    async def stream_response(self, send: Send) -> None:
        """starlette's ``stream_response`` (the same messages), noting :attr:`started`. Written
        out rather than calling ``super()``: the relay's task resumes every frame of this chain
        at each chunk, and a wrapper frame would be one more."""
        self.started = True
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.body_iterator:
            if not isinstance(chunk, bytes | memoryview):
                chunk = chunk.encode(self.charset)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        spec = tuple(map(int, scope.get("asgi", {}).get("spec_version", "2.0").split(".")))
        if scope["type"] != "http" or task is None or spec >= (2, 4):
            await super().__call__(scope, receive, send)   # 2.4: a send to a gone client raises
            return
        state = _Watch()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    break
            # uvicorn also says http.disconnect once the response is complete: only a client
            # gone before the end stops the relay.
            if not state.done:
                state.gone = True
                task.cancel()

        watcher = asyncio.ensure_future(watch())
        watcher.add_done_callback(_retrieve)
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not (state.gone and task.uncancel() == 0):
                raise
            # The client left: nobody reads the rest; the call ends normally, as starlette's does.
        finally:
            state.done = True
            watcher.cancel()
        if self.background is not None:
            await self.background()


def _retrieve(watcher: asyncio.Future[None]) -> None:
    """Read a finished watcher's outcome: cancelled is its normal end; a failed ``receive()`` only
    ends the watch (the relay goes on, as with no watcher) and must not surface as an asyncio
    "exception was never retrieved" report."""
    if not watcher.cancelled():
        watcher.exception()


class _Watch:
    __slots__ = ("done", "gone")

    def __init__(self) -> None:
        self.done = False    # the relay has ended (completed, failed or cancelled)
        self.gone = False    # the watcher cancelled the relay: the client disconnected
