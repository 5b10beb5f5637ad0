"""The listeners over TLS (server/listeners.py listener_contexts, config/tls.py) on real sockets,
with certificates made in the test: the public listener answers HTTPS to a client trusting the CA
and refuses plain HTTP; with a client CA, a client without a certificate is refused and one with
a certificate signed by it served; the loopback admin listener stays plain unless
``INFERLB_ADMIN_TLS=on``."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from inferlb.config.settings import Settings
from inferlb.config.tls import ListenerTLS
from inferlb.errors import ConfigError
from inferlb.server import build_server
from inferlb.server.lifecycle import GatewayServer
from inferlb.server.listeners import listener_contexts, listener_of
from tests.support import Certs, certs, free_port


@pytest.fixture
def pem(tmp_path: Path) -> Certs:
    return certs(tmp_path)


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/healthz")
    async def healthz(request: Request) -> dict[str, str]:
        return {"listener": listener_of(request.scope), "scheme": request.url.scheme}

    return app


@asynccontextmanager
async def _serving(settings: Settings, *, admin: int | None = None) -> AsyncIterator[tuple[int, GatewayServer]]:
    port = free_port()
    server = build_server(_app(), settings, admin=("127.0.0.1", admin) if admin else None, host="127.0.0.1",
                          port=port, log_level="warning", lifespan="off")
    task = asyncio.create_task(server.serve())
    for _ in range(1000):   # bounded: start-up
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    assert server.started
    try:
        yield port, server
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


def _client(pem: Certs, *, with_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pem.ca))
    if with_cert:
        ctx.load_cert_chain(pem.client_cert, pem.client_key)
    return ctx


async def _get(url: str, verify: Any = True) -> httpx.Response:
    async with httpx.AsyncClient(verify=verify, timeout=10) as http:
        return await http.get(url)


async def test_the_public_listener_serves_https_and_refuses_plain_http(pem: Certs) -> None:
    settings = Settings(tls=ListenerTLS(cert_file=pem.server_cert, key_file=pem.server_key))
    async with _serving(settings) as (port, _):
        r = await _get(f"https://127.0.0.1:{port}/healthz", _client(pem))
        assert r.json() == {"listener": "public", "scheme": "https"}
        r = await _get(f"https://localhost:{port}/healthz", _client(pem))   # the name in the certificate too
        assert r.status_code == 200
        with pytest.raises(httpx.TransportError):
            await _get(f"http://127.0.0.1:{port}/healthz")
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):   # a CA it does not trust
            await _get(f"https://127.0.0.1:{port}/healthz")


async def test_a_client_ca_requires_a_client_certificate(pem: Certs) -> None:
    settings = Settings(tls=ListenerTLS(cert_file=pem.server_cert, key_file=pem.server_key, client_ca_file=pem.ca))
    async with _serving(settings) as (port, _):
        with pytest.raises(httpx.TransportError):
            await _get(f"https://127.0.0.1:{port}/healthz", _client(pem))
        r = await _get(f"https://127.0.0.1:{port}/healthz", _client(pem, with_cert=True))
        assert r.status_code == 200 and r.json()["scheme"] == "https"


async def test_optional_client_auth_serves_both(pem: Certs) -> None:
    settings = Settings(tls=ListenerTLS(cert_file=pem.server_cert, key_file=pem.server_key, client_ca_file=pem.ca,
                                        client_auth="optional"))
    async with _serving(settings) as (port, _):
        assert (await _get(f"https://127.0.0.1:{port}/healthz", _client(pem))).status_code == 200
        assert (await _get(f"https://127.0.0.1:{port}/healthz", _client(pem, with_cert=True))).status_code == 200


async def test_the_loopback_admin_listener_stays_plain_unless_asked(pem: Certs) -> None:
    tls = ListenerTLS(cert_file=pem.server_cert, key_file=pem.server_key)
    admin = free_port()
    async with _serving(Settings(tls=tls), admin=admin) as (port, _):
        r = await _get(f"http://127.0.0.1:{admin}/healthz")
        assert r.json() == {"listener": "admin", "scheme": "http"}
    admin = free_port()
    async with _serving(Settings(tls=tls, admin_tls="on"), admin=admin) as (port, _):
        r = await _get(f"https://127.0.0.1:{admin}/healthz", _client(pem))
        assert r.json() == {"listener": "admin", "scheme": "https"}
        with pytest.raises(httpx.TransportError):
            await _get(f"http://127.0.0.1:{admin}/healthz")


def test_the_admin_listener_choice(pem: Certs) -> None:
    tls = ListenerTLS(cert_file=pem.server_cert, key_file=pem.server_key)
    auto = listener_contexts(Settings(tls=tls), ("127.0.0.1", 9))
    assert auto.public is not None and auto.admin is None
    wide = listener_contexts(Settings(tls=tls), ("0.0.0.0", 9))   # off loopback: the key never in the clear
    assert wide.admin is wide.public
    assert listener_contexts(Settings(tls=tls, admin_tls="off"), ("0.0.0.0", 9)).admin is None
    with pytest.raises(ConfigError, match="INFERLB_ADMIN_TLS"):
        listener_contexts(Settings(admin_tls="on"), ("127.0.0.1", 9))
    plain = listener_contexts(Settings(), ("0.0.0.0", 9))
    assert plain.public is None and plain.admin is None
