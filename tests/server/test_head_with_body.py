"""server/protocol.py: an answer's head goes out with the write that follows it (``_HeadWithBody``).

Driven with a recording transport and uvicorn's real request cycle (no sockets): the bytes on the
connection and their order are what uvicorn's two writes sent, and one ``writelines`` carries
the head and a non-streamed body; a head alone (a stream's, before its first chunk) is sent by
the end of the event-loop iteration; a refusal written by the protocol itself comes after a
head held before it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.server import ServerState

from inferlb.server.protocol import EdgeLimits, GatewayConfig, GuardedHttpToolsProtocol, _HeadWithBody


class _Transport:
    """Records every call that sends bytes, in order: ("write", data) / ("writelines", [..]) / ("close",)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        assert not self.closing, "write after close"
        self.calls.append(("write", bytes(data)))

    def writelines(self, parts: Any) -> None:
        assert not self.closing, "write after close"
        self.calls.append(("writelines", [bytes(p) for p in parts]))

    def close(self) -> None:
        self.closing = True
        self.calls.append(("close",))

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def sent(self) -> bytes:
        out = b""
        for call in self.calls:
            if call[0] == "write":
                out += call[1]
            elif call[0] == "writelines":
                out += b"".join(call[1])
        return out


class _Cycle:
    transport: Any = None


async def _turns(n: int = 5) -> None:
    """Let the loop run ``n`` iterations (no wall-clock wait)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_head_and_body_written_in_the_same_iteration_leave_in_one_call() -> None:
    t, cycle = _Transport(), _Cycle()
    w = _HeadWithBody(t, cycle, asyncio.get_running_loop())   # type: ignore[arg-type]
    cycle.transport = w
    w.write(b"HEAD\r\n\r\n")
    assert t.calls == []                        # held
    w.write(b"body")
    assert t.calls == [("writelines", [b"HEAD\r\n\r\n", b"body"])]
    assert cycle.transport is t                 # later writes go straight through
    await _turns()
    assert t.calls == [("writelines", [b"HEAD\r\n\r\n", b"body"])]   # the cancelled flush wrote nothing


async def test_a_head_alone_is_sent_by_the_end_of_the_iteration() -> None:
    t, cycle = _Transport(), _Cycle()
    w = _HeadWithBody(t, cycle, asyncio.get_running_loop())   # type: ignore[arg-type]
    cycle.transport = w
    w.write(bytearray(b"HEAD"))
    await _turns(1)
    assert t.calls == [("write", b"HEAD")]
    assert cycle.transport is t


async def test_close_sends_the_held_head_first_and_a_closing_transport_drops_it() -> None:
    t, cycle = _Transport(), _Cycle()
    w = _HeadWithBody(t, cycle, asyncio.get_running_loop())   # type: ignore[arg-type]
    w.write(b"HEAD")
    w.close()
    assert t.calls == [("write", b"HEAD"), ("close",)]
    t2, cycle2 = _Transport(), _Cycle()
    w2 = _HeadWithBody(t2, cycle2, asyncio.get_running_loop())   # type: ignore[arg-type]
    w2.write(b"HEAD")
    t2.closing = True                           # the connection went away meanwhile
    await _turns()
    assert t2.calls == []
    assert w2.is_closing()
    assert w2.get_extra_info("peername") == ("127.0.0.1", 50000)   # the rest is the transport's


async def _json_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def _stream_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await asyncio.sleep(0)   # the node's first chunk is not there yet
    await asyncio.sleep(0)
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def _protocol(app: Any, transport: _Transport) -> GuardedHttpToolsProtocol:
    cfg = GatewayConfig(app, edge=EdgeLimits(), log_level="warning", lifespan="off", proxy_headers=False)
    cfg.load()
    p = GuardedHttpToolsProtocol(cfg, ServerState(), {}, asyncio.get_running_loop())
    p.connection_made(transport)   # type: ignore[arg-type]
    return p


REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"


async def test_a_json_answer_is_one_call_with_uvicorns_bytes() -> None:
    t = _Transport()
    p = _protocol(_json_app, t)
    p.data_received(REQUEST)
    await _turns()
    writes = [c for c in t.calls if c[0] != "close"]
    assert len(writes) == 1 and writes[0][0] == "writelines"
    head, body = writes[0][1]
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert b"content-length: 2\r\n" in head and body == b"{}"
    # a second request on the keep-alive connection: its own cycle, again one call
    p.data_received(REQUEST)
    await _turns()
    writes = [c for c in t.calls if c[0] != "close"]
    assert [c[0] for c in writes] == ["writelines", "writelines"]
    p.connection_lost(None)


async def test_a_streamed_answer_keeps_its_bytes_and_order() -> None:
    t = _Transport()
    p = _protocol(_stream_app, t)
    p.data_received(REQUEST)
    await _turns(10)
    kinds = [c[0] for c in t.calls]
    assert kinds[0] == "write"                  # the head went out alone, before the first chunk
    assert t.calls[0][1].startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"transfer-encoding: chunked\r\n" in t.calls[0][1]
    assert t.sent().endswith(b"9\r\ndata: 1\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
    p.connection_lost(None)


async def test_a_refusal_after_a_held_head_keeps_the_order() -> None:
    t = _Transport()
    p = _protocol(_json_app, t)
    p.data_received(REQUEST)
    cycle = p.cycle
    assert cycle is not None and isinstance(cycle.transport, _HeadWithBody)
    cycle.transport.write(b"HEAD-BEFORE")    # as uvicorn's send writes a head
    p._refuse(408, "late", "request_timeout")
    assert t.calls[0] == ("write", b"HEAD-BEFORE")
    assert t.calls[1][0] == "write" and t.calls[1][1].startswith(b"HTTP/1.1 408 ")
    assert t.calls[-1] == ("close",)
    p.connection_lost(None)


def test_uvicorn_still_has_the_cycle_attribute_this_wraps() -> None:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    assert "transport" in RequestResponseCycle.__init__.__code__.co_varnames
