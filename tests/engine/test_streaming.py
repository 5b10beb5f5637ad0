"""engine/streaming.py: the gateway's streamed response and its disconnect watch (ASGI 2.3)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest

from inferlb.engine.streaming import WatchedStreamingResponse

SCOPE: dict[str, Any] = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "method": "POST"}


class Client:
    """ASGI receive/send of one connection: ``leave()`` makes receive() say http.disconnect;
    a complete response does too (uvicorn's behaviour)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self._event = asyncio.Event()

    def leave(self) -> None:
        self._event.set()

    async def receive(self) -> dict[str, Any]:
        await self._event.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._event.set()

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


async def test_relays_every_chunk_and_ends_without_cancelling() -> None:
    client = Client()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(3):
            yield b"data: %d\n\n" % i
            await asyncio.sleep(0)

    await WatchedStreamingResponse(chunks(), media_type="text/event-stream")(SCOPE, client.receive, client.send)
    await asyncio.sleep(0)   # the watcher sees the response complete: it must not cancel anything now
    assert client.body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_client_gone_mid_stream_cancels_the_iterator_and_returns() -> None:
    client = Client()
    stopped = asyncio.Event()
    ran: list[str] = []

    async def chunks() -> AsyncIterator[bytes]:
        try:
            yield b"data: first\n\n"
            client.leave()
            await stopped.wait()           # a node that never sends again
            yield b"data: never\n\n"
        finally:
            ran.append("finally")

    await WatchedStreamingResponse(chunks())(SCOPE, client.receive, client.send)
    assert ran == ["finally"]
    assert client.body == b"data: first\n\n"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_an_iterator_error_propagates() -> None:
    client = Client()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x"
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await WatchedStreamingResponse(chunks())(SCOPE, client.receive, client.send)


async def test_a_cancellation_from_elsewhere_propagates() -> None:
    client = Client()
    started = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        started.set()
        await asyncio.Event().wait()
        yield b"never"

    job = asyncio.ensure_future(WatchedStreamingResponse(chunks())(SCOPE, client.receive, client.send))
    await started.wait()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
async def test_sends_what_starlette_sends_and_notes_the_start(spec: str) -> None:
    """``stream_response`` is starlette's written out: the same messages (a ``str`` chunk
    encoded), and ``started`` set once the start goes to ``send``, for a caller that passes the
    server's ``send`` unwrapped (``api/edge.py`` ``HotRoutes``)."""
    from starlette.responses import StreamingResponse

    async def chunks() -> AsyncIterator[bytes | str]:
        yield b"data: 1\n\n"
        yield "data: é\n\n"

    scope = {**SCOPE, "asgi": {"version": "3.0", "spec_version": spec}}
    ours, theirs = Client(), Client()
    response = WatchedStreamingResponse(chunks(), media_type="text/event-stream", headers={"x-request-id": "r"})
    assert response.started is False
    await response(scope, ours.receive, ours.send)
    assert response.started is True
    await StreamingResponse(chunks(), media_type="text/event-stream", headers={"x-request-id": "r"})(
        scope, theirs.receive, theirs.send)
    assert ours.sent == theirs.sent and ours.body == "data: 1\n\ndata: é\n\n".encode()


async def test_started_is_set_as_the_start_is_handed_to_send() -> None:
    """``started`` is set as the start is handed to ``send``, before ``send`` returns, as a
    ``send`` wrapper watching for the start sets it: a start whose ``send`` failed counts."""
    client = Client()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x"

    async def refuse(message: MutableMapping[str, Any]) -> None:
        raise OSError("gone")

    response = WatchedStreamingResponse(chunks())
    with pytest.raises(OSError, match="gone"):
        await response(SCOPE, client.receive, refuse)
    assert response.started is True   # the start was handed to send (which failed)
