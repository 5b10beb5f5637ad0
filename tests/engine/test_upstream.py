"""The data-path client against real sockets: the emulator, a closed port and a garbage server."""

from __future__ import annotations

import asyncio
import email.utils
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from inferlb.config.settings import TimeoutConfig
from inferlb.engine.sse import SSERelay, Usage, extract_usage
from inferlb.engine.upstream import Upstream, parse_retry_after, strip_hop_by_hop
from inferlb.errors import (
    UpstreamConnectError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.node import EmulatedNode
from inferlb.simulator.spec import FaultSpec, NodeSpec
from inferlb.types import ManualClock

MODEL = "m1"
FAST = TimeoutConfig(connect_s=1.0, first_token_s=2.0, idle_s=2.0, total_s=5.0)
HEADERS = {"Content-Type": "application/json", "x-request-id": "rid-1"}


def chat(**kw: object) -> bytes:
    body: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}],
                               "max_tokens": 5}
    body.update(kw)
    return json.dumps(body).encode()


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    spec = NodeSpec(name="n1", models=[MODEL], base_ttft_s=0.002, tpot_s=0.001)
    async with SimFleet([spec]) as f:
        yield f


@pytest.fixture
def node(fleet: SimFleet) -> EmulatedNode:
    return fleet.nodes["n1"]


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    async with Upstream(limit=16, limit_per_host=8) as u:
        yield u


def url(node: EmulatedNode, path: str = "/v1/chat/completions") -> str:
    return node.url + path


async def test_stream_happy_path(upstream: Upstream, node: EmulatedNode) -> None:
    body = chat(stream=True, stream_options={"include_usage": True})
    async with await upstream.open(url(node), body, headers=HEADERS, timeouts=FAST, node="n1") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
        assert resp.first_chunk.startswith(b"data: ")
        assert resp.started_at <= resp.headers_at <= resp.first_chunk_at
        relay = SSERelay()
        relayed = [relay.feed(resp.first_chunk)]
        async for chunk in resp.chunks():
            relayed.append(relay.feed(chunk))
        relayed.append(relay.finish())
        assert resp.eof
    assert relay.done and not relay.incomplete and relay.usage == Usage(2, 5)
    assert relay.content_events == 5   # the tokens (not the role, finish-only, usage and [DONE] chunks)
    events = b"".join(relayed).split(b"\n\n")
    assert all(json.loads(e[6:]) for e in events[:-2] if e) and events[-2] == b"data: [DONE]"
    assert node.stats.completed == 1 and node.stats.attempts == {"rid-1": 1}


async def test_non_stream_read_rest(upstream: Upstream, node: EmulatedNode) -> None:
    async with await upstream.open(url(node), chat(max_tokens=50), headers=HEADERS, timeouts=FAST,
                                   node="n1") as resp:
        raw = await resp.read_rest()
    doc = json.loads(raw)
    assert doc["choices"][0]["message"]["content"].count("tok") == 50
    assert extract_usage(raw) == Usage(2, 50)


async def test_headers_are_sent_exactly(upstream: Upstream, node: EmulatedNode) -> None:
    sent = {**HEADERS, "Authorization": "Bearer node-key", "Connection": "keep-alive, x-hop",
            "x-hop": "1", "Keep-Alive": "timeout=5", "TE": "trailers", "Upgrade": "h2c", "Host": "evil"}
    async with await upstream.open(url(node), chat(), headers=sent, timeouts=FAST, node="n1") as resp:
        await resp.read_rest()
    seen = {k.lower(): v for k, v in node.stats.last_headers.items()}
    assert seen["authorization"] == "Bearer node-key"
    assert seen["x-request-id"] == "rid-1" and seen["content-type"] == "application/json"
    assert seen["host"] == f"127.0.0.1:{node.port}"
    for absent in ("x-hop", "keep-alive", "te", "upgrade", "user-agent", "accept-encoding", "accept",
                   "cookie"):
        assert absent not in seen, absent
    assert strip_hop_by_hop({"Proxy-Authorization": "x", "A": "1"}) == {"A": "1"}


async def test_connection_refused(upstream: Upstream, fleet: SimFleet, node: EmulatedNode) -> None:
    await fleet.stop_node("n1")
    with pytest.raises(UpstreamConnectError) as info:
        await upstream.open(url(node), chat(), headers=HEADERS, timeouts=FAST, node="n1")
    assert info.value.node == "n1" and info.value.retryable
    assert isinstance(info.value.__cause__, aiohttp.ClientError)


async def test_status_error_with_retry_after(upstream: Upstream, node: EmulatedNode) -> None:
    await node.set_faults(FaultSpec(status=503, retry_after_s=2))
    with pytest.raises(UpstreamStatusError) as info:
        await upstream.open(url(node), chat(), headers=HEADERS, timeouts=FAST, node="n1")
    err = info.value
    assert err.status == 503 and err.retry_after_s == 2.0 and err.retryable and err.node == "n1"
    assert json.loads(err.body)["error"]["type"] == "server_error"
    await node.set_faults(FaultSpec(status=400))
    with pytest.raises(UpstreamStatusError) as info:
        await upstream.open(url(node), chat(), headers=HEADERS, timeouts=FAST, node="n1")
    assert not info.value.retryable and info.value.retry_after_s is None
    assert node.stats.live == 0


def test_parse_retry_after() -> None:
    clock = ManualClock()
    now = clock.time()
    assert parse_retry_after("7", now=now) == 7.0
    assert parse_retry_after(" 1.5 ", now=now) == 1.5
    assert parse_retry_after("-3", now=now) == 0.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    for bad in (None, "", "soon", "nan", "inf", "1e999"):
        assert parse_retry_after(bad, now=now) is None


async def test_hang_before_headers_is_a_first_token_timeout(upstream: Upstream, node: EmulatedNode) -> None:
    await node.set_faults(FaultSpec(hang_before_headers=True))
    timeouts = TimeoutConfig(connect_s=1.0, first_token_s=0.2, idle_s=5.0, total_s=5.0)
    with pytest.raises(UpstreamTimeout) as info:
        await upstream.open(url(node), chat(), headers=HEADERS, timeouts=timeouts, node="n1")
    assert info.value.phase == "first_token" and info.value.node == "n1"
    await node.wait_until(lambda s: s.live == 0)  # the hung connection was closed, not leaked
    timeouts = TimeoutConfig(connect_s=1.0, first_token_s=5.0, idle_s=5.0, total_s=0.1)
    with pytest.raises(UpstreamTimeout) as info:
        await upstream.open(url(node), chat(), headers=HEADERS, timeouts=timeouts, node="n1")
    assert info.value.phase == "total"


async def test_headers_without_first_chunk_are_not_committed(upstream: Upstream, node: EmulatedNode) -> None:
    # Stream headers come at once; the first token never does: still a retryable first-token timeout.
    await node.set_faults(FaultSpec(stall_after_tokens=0))
    timeouts = TimeoutConfig(connect_s=1.0, first_token_s=0.2, idle_s=5.0, total_s=5.0)
    with pytest.raises(UpstreamTimeout) as info:
        await upstream.open(url(node, "/v1/completions"),
                            json.dumps({"model": MODEL, "prompt": "x", "stream": True}).encode(),
                            headers=HEADERS, timeouts=timeouts, node="n1")
    assert info.value.phase == "first_token" and info.value.retryable
    await node.wait_until(lambda s: s.live == 0)


async def test_idle_stall_mid_stream(upstream: Upstream, node: EmulatedNode) -> None:
    await node.set_faults(FaultSpec(stall_after_tokens=2))
    timeouts = TimeoutConfig(connect_s=1.0, first_token_s=2.0, idle_s=0.2, total_s=5.0)
    got = []
    resp = await upstream.open(url(node), chat(stream=True), headers=HEADERS, timeouts=timeouts, node="n1")
    async with resp:
        with pytest.raises(UpstreamTimeout) as info:
            async for chunk in resp.chunks():
                got.append(chunk)
    assert info.value.phase == "idle"
    assert (resp.first_chunk + b"".join(got)).count(b'"content":"tok') == 2
    await node.wait_until(lambda s: s.live == 0)


async def test_total_timeout_mid_stream(upstream: Upstream, fleet: SimFleet) -> None:
    slow = EmulatedNode(NodeSpec(name="slow", models=[MODEL], base_ttft_s=0.0, tpot_s=0.05))
    await slow.start()
    try:
        timeouts = TimeoutConfig(connect_s=1.0, first_token_s=1.0, idle_s=1.0, total_s=0.25)
        resp = await upstream.open(url(slow), chat(stream=True, max_tokens=100), headers=HEADERS,
                                   timeouts=timeouts, node="slow")
        async with resp:
            with pytest.raises(UpstreamTimeout) as info:
                await resp.read_rest()
        assert info.value.phase == "total"
        await slow.wait_until(lambda s: s.live == 0)
    finally:
        await slow.stop()


async def test_drop_mid_stream_is_a_connect_error(upstream: Upstream, node: EmulatedNode) -> None:
    await node.set_faults(FaultSpec(drop_after_tokens=3))
    resp = await upstream.open(url(node), chat(stream=True, max_tokens=10), headers=HEADERS, timeouts=FAST,
                               node="n1")
    async with resp:
        with pytest.raises(UpstreamConnectError) as info:
            async for _ in resp.chunks():
                pass
    assert isinstance(info.value.__cause__, aiohttp.ClientPayloadError)


async def test_non_stream_cut_is_a_connect_error(upstream: Upstream, node: EmulatedNode) -> None:
    await node.set_faults(FaultSpec(drop_after_tokens=3))
    resp = await upstream.open(url(node), chat(max_tokens=10), headers=HEADERS, timeouts=FAST, node="n1")
    async with resp:
        with pytest.raises(UpstreamConnectError):
            await resp.read_rest()


async def test_aclose_frees_the_node(upstream: Upstream, node: EmulatedNode) -> None:
    await node.set_faults(FaultSpec(stall_after_tokens=1))
    resp = await upstream.open(url(node), chat(stream=True), headers=HEADERS, timeouts=FAST, node="n1")
    assert node.stats.live == 1
    await resp.aclose()
    await resp.aclose()  # idempotent
    await node.wait_until(lambda s: s.live == 0, timeout=1.0)
    assert node.stats.disconnects == 1
    with pytest.raises(UpstreamConnectError):
        await resp.read_rest()


async def test_cancel_while_waiting_for_first_token(upstream: Upstream, node: EmulatedNode) -> None:
    await node.set_faults(FaultSpec(hang_before_headers=True))
    task = asyncio.create_task(upstream.open(url(node), chat(), headers=HEADERS, timeouts=FAST, node="n1"))
    await node.wait_until(lambda s: s.live == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await node.wait_until(lambda s: s.live == 0, timeout=1.0)


async def test_connection_is_reused_after_a_full_read(upstream: Upstream, node: EmulatedNode) -> None:
    peers = set()
    for body in (chat(stream=True), chat(), chat(stream=True)):
        async with await upstream.open(url(node), body, headers=HEADERS, timeouts=FAST, node="n1") as resp:
            await resp.read_rest()
        peers.add(node.stats.last_peer)
    assert len(peers) == 1  # one pooled keep-alive connection served all three
    async with await upstream.open(url(node, "/v1/models"), b"", headers={}, timeouts=FAST, node="n1",
                                   method="GET") as resp:
        assert json.loads(await resp.read_rest())["data"][0]["id"] == MODEL


async def test_body_cap(upstream: Upstream, node: EmulatedNode) -> None:
    resp = await upstream.open(url(node), chat(max_tokens=20), headers=HEADERS, timeouts=FAST, node="n1")
    async with resp:
        with pytest.raises(UpstreamProtocolError, match="over 100 bytes"):
            await resp.read_rest(max_bytes=100)
    resp = await upstream.open(url(node), chat(max_tokens=50, stream=True), headers=HEADERS, timeouts=FAST,
                               node="n1")
    async with resp:
        with pytest.raises(UpstreamProtocolError, match="over 2000 bytes"):
            await resp.read_rest(max_bytes=2000)


async def _garbage_server(reply: bytes) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_malformed_http_response_is_a_protocol_error(upstream: Upstream) -> None:
    server, port = await _garbage_server(b"NOT HTTP AT ALL\r\n\r\n")
    try:
        with pytest.raises(UpstreamProtocolError):
            await upstream.open(f"http://127.0.0.1:{port}/v1/x", b"{}", headers={}, timeouts=FAST, node="g")
    finally:
        server.close()
        await server.wait_closed()


async def test_redirects_are_not_followed(upstream: Upstream) -> None:
    server, port = await _garbage_server(
        b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://169.254.169.254/\r\nContent-Length: 0\r\n\r\n")
    try:
        with pytest.raises(UpstreamStatusError) as info:
            await upstream.open(f"http://127.0.0.1:{port}/v1/x", b"{}", headers={}, timeouts=FAST, node="g")
        assert info.value.status == 307 and not info.value.retryable
    finally:
        server.close()
        await server.wait_closed()


async def test_requires_start() -> None:
    with pytest.raises(RuntimeError, match="start"):
        await Upstream().open("http://127.0.0.1:1/", b"", headers={}, timeouts=FAST, node="x")


async def test_idle_watchdog_only_times_out_a_waiting_read(upstream: Upstream, node: EmulatedNode) -> None:
    # One watchdog per response, not a timeout per chunk: when it fires with no read waiting (the
    # gateway is still handing the last chunk to a slow client) nothing is closed; a later read
    # re-arms it. Fired early (before its due time) it re-arms instead of closing.
    resp = await upstream.open(url(node), chat(stream=True, max_tokens=20), headers=HEADERS, timeouts=FAST,
                               node="n1")
    async with resp:
        it = resp.chunks()
        await it.__anext__()
        resp._watchdog()            # no read waiting
        assert not resp._closed and resp._timer is None
        rest = [c async for c in it]
        assert resp.eof and b"[DONE]" in (rest[-1] if rest else resp.first_chunk)
        assert resp._timer is None  # disarmed at the end of the body
    resp = await upstream.open(url(node), chat(stream=True, max_tokens=3), headers=HEADERS, timeouts=FAST,
                               node="n1")
    async with resp:
        resp._read_at = resp._loop.time()
        resp._watchdog()            # a read started just now: not idle yet
        assert not resp._closed and resp._timer is not None
        resp._read_at = None
        body = await resp.read_rest()
    assert body.endswith(b"data: [DONE]\n\n")


class _CutResponse:
    """An aiohttp response whose real StreamReader received a chunk, then lost its connection
    before anything read it (the order a node's last chunk and its close can arrive in)."""

    def __init__(self, reader: Any) -> None:
        self.status = 200
        self.headers: dict[str, str] = {}
        self.content = reader
        self.closed = False

    def release(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


async def test_the_bytes_a_node_sent_before_it_cut_are_relayed_then_the_cut() -> None:
    from aiohttp.streams import StreamReader

    from inferlb.engine.upstream import UpstreamResponse

    class _Proto:
        _reading_paused = False

        def pause_reading(self) -> None:
            pass

        def resume_reading(self) -> None:
            pass

    loop = asyncio.get_running_loop()
    reader = StreamReader(_Proto(), 2**16, loop=loop)  # type: ignore[arg-type]
    reader.feed_data(b"data: tok3\n\n")
    reader.set_exception(aiohttp.ClientPayloadError("Response payload is not completed"))
    resp = _CutResponse(reader)
    up = UpstreamResponse(resp, b"data: tok1\n\ndata: tok2\n\n", node="n0",  # type: ignore[arg-type]
                          timeouts=TimeoutConfig(), total_deadline=loop.time() + 60, started_at=0.0,
                          headers_at=0.0, first_chunk_at=0.0)
    got = []
    with pytest.raises(UpstreamConnectError):
        async for chunk in up.chunks():
            got.append(chunk)
    assert got == [b"data: tok3\n\n"] and resp.closed
