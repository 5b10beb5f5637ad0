"""The HTTP edge over real sockets (docs/reliability.md hostile-input rows 4, 6, 8, 35, 37, 38): slow
heads and bodies time out (408 or close), oversized heads are refused (431), POST bodies must be
declared JSON (415), ``/health``, ``HEAD``, ``Allow`` on 405 and CORS preflights.

The server is the one ``inferlb serve`` runs (``engine.server.build_server``), with the read
timeouts configured short (0.3 s): the tests assert what the server answers, never how long it
took; the ``wait_for`` bounds only keep a broken server from hanging the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from inferlb.app import create_app
from inferlb.config.settings import load_settings
from inferlb.server import build_server
from inferlb.server.listeners import as_admin
from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, fleet_for, free_port, settings_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

HANG_GUARD_S = 20.0     # only a broken server gets near this
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
ORIGIN = "https://app.example"


@contextlib.asynccontextmanager
async def edge_server(tmp: Path, **over: Any) -> AsyncIterator[tuple[str, int, Any]]:
    """(base URL, port, app) of ``build_server`` on a loopback port."""
    async with SimFleet(fast_specs(2, tpot_s=0.02)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        settings = settings_for(tmp, fleet_for(urls), **over)
        app = create_app(settings)
        port = free_port()
        server = build_server(app, settings, host="127.0.0.1", port=port, log_level="warning")
        task = asyncio.create_task(server.serve())
        for _ in range(1000):   # bounded: start-up
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "gateway did not start"
        try:
            yield f"http://127.0.0.1:{port}", port, app
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 30)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def edge(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[str, int, Any]]:
    async with edge_server(tmp_path_factory.mktemp("edge"), http_header_timeout_s=0.3, http_body_timeout_s=0.3,
                           cors_allow_origins=[ORIGIN]) as srv:
        yield srv


async def _exchange(port: int, data: bytes, *, trickle: bytes = b"", step_s: float = 0.05) -> bytes:
    """Send ``data``, then ``trickle`` one byte per ``step_s`` (a client's pace, stopped as soon as
    the server answers or closes); return everything the server sent until it closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send() -> None:
        with contextlib.suppress(ConnectionError):
            writer.write(data)
            await writer.drain()
            for i in range(len(trickle)):   # bounded by the trickle's length
                writer.write(trickle[i:i + 1])
                await writer.drain()
                await asyncio.sleep(step_s)

    sender = asyncio.create_task(send())
    try:
        out = bytearray()
        with contextlib.suppress(ConnectionError):
            while chunk := await asyncio.wait_for(reader.read(65536), HANG_GUARD_S):
                out += chunk
        return bytes(out)
    finally:
        sender.cancel()
        writer.close()


def _status_and_body(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _error(raw: bytes, status: int) -> dict[str, Any]:
    got, headers, body = _status_and_body(raw)
    assert got == status, raw[:300]
    assert headers.get("connection") == "close"
    err: dict[str, Any] = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


# -- item 1: slow heads and bodies -------------------------------------------------------------------


async def test_slowloris_head_trickled_byte_by_byte_gets_408(edge: tuple[str, int, Any]) -> None:
    _, port, _ = edge
    # Each byte resets no clock: the head as a whole must arrive in time. The trickle (400 bytes at
    # 20/s) outlasts the configured 0.3 s by far, so only a head timeout ends this exchange early.
    raw = await _exchange(port, b"GET /healthz HTTP/1.1\r\n", trickle=b"x-pad: " + b"a" * 393)
    assert _error(raw, 408)["code"] == "request_timeout"


async def test_half_sent_head_then_silence_gets_408(edge: tuple[str, int, Any]) -> None:
    _, port, _ = edge
    raw = await _exchange(port, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: applic")
    assert _error(raw, 408)["code"] == "request_timeout"


async def test_silent_connection_is_closed_without_an_answer(edge: tuple[str, int, Any]) -> None:
    _, port, _ = edge
    assert await _exchange(port, b"") == b""


async def test_body_slower_than_promised_gets_408(edge: tuple[str, int, Any], caplog: pytest.LogCaptureFixture
                                                  ) -> None:
    _, port, _ = edge
    body = json.dumps(CHAT).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % (len(body) + 100))
    raw = await _exchange(port, head + body[:10], trickle=body[10:] + b" " * 100)   # ~4 s of bytes at 20/s
    assert _error(raw, 408)["code"] == "request_timeout"
    # The request that was reading the body ends quietly: no "Exception in ASGI application".
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_stalled_body_on_a_route_that_never_reads_it_is_closed(edge: tuple[str, int, Any]) -> None:
    _, port, _ = edge
    raw = await _exchange(port, b"POST /healthz HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{")
    status, headers, _ = _status_and_body(raw)
    assert status == 405 and headers["allow"] == "GET, HEAD"     # answered, then the connection ended


async def test_slow_answers_and_keep_alive_are_not_cut(edge: tuple[str, int, Any]) -> None:
    base, _, _ = edge
    async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD_S) as client:
        # A stream that outlasts both read timeouts (40 tokens × 20 ms), then a second request on the
        # same keep-alive connection: the timeouts bound reading the request, not the answer.
        body = {**CHAT, "max_tokens": 40, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            text = "".join([c async for c in r.aiter_text()])
        assert r.status_code == 200 and text.rstrip().endswith("data: [DONE]")
        r2 = await client.post("/v1/chat/completions", json=CHAT)
        assert r2.status_code == 200, r2.text


# -- item 2: header limits ---------------------------------------------------------------------------


async def test_one_64_kib_header_gets_431(edge: tuple[str, int, Any]) -> None:
    _, port, _ = edge
    raw = await _exchange(port, b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 65536 + b"\r\n\r\n")
    assert _error(raw, 431)["code"] == "request_header_fields_too_large"


async def test_ten_thousand_small_headers_get_431(edge: tuple[str, int, Any]) -> None:
    _, port, _ = edge
    many = b"".join(b"x%d: v\r\n" % i for i in range(10_000))
    raw = await _exchange(port, b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n")
    assert _error(raw, 431)["code"] == "request_header_fields_too_large"


async def test_header_count_cap_alone_gets_431(edge: tuple[str, int, Any]) -> None:
    _, port, _ = edge
    few_bytes = b"".join(b"h%d:\r\n" % i for i in range(150))    # 150 headers in ~1 KiB: the count trips
    raw = await _exchange(port, b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + few_bytes + b"\r\n")
    assert "more than 100 request headers" in _error(raw, 431)["message"]


async def test_headers_within_the_limits_are_served(edge: tuple[str, int, Any]) -> None:
    base, _, _ = edge
    headers = {f"x-h{i}": "v" * 100 for i in range(90)}
    async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD_S) as client:
        r = await client.get("/healthz", headers=headers)
    assert r.status_code == 200


# -- item 3: Content-Type and Content-Encoding -------------------------------------------------------


@pytest.mark.parametrize(("headers", "code"), [
    ({"content-type": "text/plain"}, "unsupported_media_type"),
    ({"content-type": "application/x-www-form-urlencoded"}, "unsupported_media_type"),
    ({}, "unsupported_media_type"),
    ({"content-type": "application/jsonx"}, "unsupported_media_type"),
    ({"content-type": "application/json", "content-encoding": "gzip"}, "unsupported_content_encoding"),
    ({"content-type": "application/json", "content-encoding": "deflate"}, "unsupported_content_encoding"),
], ids=["text_plain", "form", "missing", "jsonx", "gzip", "deflate"])
async def test_non_json_post_gets_415(edge: tuple[str, int, Any], headers: dict[str, str], code: str) -> None:
    base, _, _ = edge
    async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD_S) as client:
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/predict/m"):
            r = await client.post(path, content=json.dumps(CHAT).encode(), headers=headers)
            assert r.status_code == 415, (path, r.text)
            err = r.json()["error"]
            assert err["code"] == code and err["type"] == "invalid_request_error"
    if code == "unsupported_content_encoding":
        assert "unsupported content encoding" in err["message"]


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=utf-8",
                                   "Application/JSON;charset=UTF-8"])
async def test_json_with_any_charset_is_served(edge: tuple[str, int, Any], ctype: str) -> None:
    base, _, _ = edge
    async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD_S) as client:
        r = await client.post("/v1/chat/completions", content=json.dumps(CHAT).encode(),
                              headers={"content-type": ctype, "content-encoding": "identity"})
    assert r.status_code == 200, r.text


async def test_415_is_audited(edge: tuple[str, int, Any]) -> None:
    base, _, app = edge
    async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD_S) as client:
        r = await client.post("/v1/embeddings", content=b'{"model": "emb", "input": "x"}',
                              headers={"content-type": "text/plain"})
        assert r.status_code == 415
        await app.state.store.writer.flush_once(force=True)
    # the audit is read as the admin listener serves it (no admin key: not on this public listener)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=as_admin(app)), base_url="http://admin") as adm:
        rows = (await adm.get("/audit/requests", params={"status": "rejected_invalid", "limit": 500})).json()
    assert any(row["http_status"] == 415 and row["endpoint"] == "embeddings" for row in rows["data"]), rows


# -- item 4: /health, HEAD, Allow, CORS --------------------------------------------------------------


async def test_health_is_readiness(edge: tuple[str, int, Any]) -> None:
    base, _, _ = edge
    async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD_S) as client:
        r, ready = await client.get("/health"), await client.get("/readyz")
    assert r.status_code == ready.status_code == 200
    assert r.json()["status"] == ready.json()["status"] == "ready"


@pytest.mark.parametrize("path", ["/health", "/readyz", "/healthz", "/v1/models", "/metrics"])
async def test_head_on_get_routes(edge: tuple[str, int, Any], path: str) -> None:
    base, _, _ = edge
    async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD_S) as client:
        get, head = await client.get(path), await client.head(path)
    assert head.status_code == get.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", "/v1/chat/completions", "POST"),
    ("HEAD", "/v1/embeddings", "POST"),
    ("DELETE", "/readyz", "GET, HEAD"),
    ("PUT", "/v1/models", "GET, HEAD"),
    ("DELETE", "/admin/keys", "GET, HEAD, POST"),      # two routes on one path: both listed
    ("OPTIONS", "/v1/chat/completions", "POST"),      # no preflight headers: an ordinary request
])
async def test_405_carries_allow(edge: tuple[str, int, Any], method: str, path: str, allow: str) -> None:
    base, _, _ = edge
    async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD_S) as client:
        r = await client.request(method, path)
    assert r.status_code == 405
    assert r.headers["allow"] == allow
    if method != "HEAD":
        assert r.json()["error"]["code"] == "method_not_allowed"


async def test_cors_preflight_for_a_configured_origin(edge: tuple[str, int, Any]) -> None:
    base, _, _ = edge
    pre = {"access-control-request-method": "POST", "access-control-request-headers": "authorization, content-type"}
    async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD_S) as client:
        ok = await client.options("/v1/chat/completions", headers={"origin": ORIGIN, **pre})
        other = await client.options("/v1/chat/completions", headers={"origin": "https://evil.example", **pre})
        simple = await client.post("/v1/chat/completions", json=CHAT, headers={"origin": ORIGIN})
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in ok.headers["access-control-allow-methods"]
    assert "authorization" in ok.headers["access-control-allow-headers"].lower()
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    assert simple.status_code == 200 and simple.headers["access-control-allow-origin"] == ORIGIN


async def test_cors_origins_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERLB_CORS_ALLOW_ORIGINS", "https://a.example, https://b.example")
    assert load_settings().cors_allow_origins == ["https://a.example", "https://b.example"]
    monkeypatch.delenv("INFERLB_CORS_ALLOW_ORIGINS")
    assert load_settings().cors_allow_origins == []


async def test_no_cors_by_default(tmp_path: Path) -> None:
    urls = {"n0": "http://127.0.0.1:9"}
    app = create_app(settings_for(tmp_path, fleet_for(urls)))   # routing only: no lifespan needed
    pre = {"origin": ORIGIN, "access-control-request-method": "POST"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        r = await client.options("/v1/chat/completions", headers=pre)
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
    assert r.headers["allow"] == "POST"
