"""The gateway reaches https nodes with each node's ``tls`` block (engine/upstream.py, config/tls.py):
a node with a private CA, a node requiring the gateway's client certificate (mTLS); a TLS failure
is a 502/503 in the OpenAI envelope, never a 500, and names the TLS reason, never a key. End to end
with the real OpenAI SDK over an HTTPS gateway. Certificates are made in the test."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from inferlb.app import create_app
from inferlb.config.settings import FleetConfig, Settings, TimeoutConfig, fleet_from_mapping
from inferlb.config.tls import ListenerTLS, NodeTLS
from inferlb.engine.upstream import Upstream
from inferlb.errors import UpstreamConnectError
from inferlb.server import build_server
from inferlb.server.listeners import ListenerContexts, listener_contexts
from tests.support import Certs, certs, free_port, running_gateway, settings_for, tls_node

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def pem(tmp_path: Path) -> Certs:
    return certs(tmp_path)


def _fleet(url: str, tls: dict[str, Any] | None, *, probe: bool = True) -> FleetConfig:
    node: dict[str, Any] = {"name": "secure", "url": url, "models": ["m"]}
    if tls is not None:
        node["tls"] = tls
    return fleet_from_mapping({
        "models": [{"name": "m", "default_max_tokens": 8}],
        "nodes": [node],
        "retry": {"max_attempts": 1},
        "timeouts": {"connect_s": 2.0, "first_token_s": 5.0, "idle_s": 5.0, "total_s": 10.0},
        "health": {"nodes": {"secure": {"probe": probe}}},
    })


async def _chat(base: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=20) as http:
        return await http.post(f"{base}/v1/chat/completions", json=CHAT)


async def test_a_node_with_a_private_ca(pem: Certs, tmp_path: Path) -> None:
    async with tls_node(pem) as (url, seen), \
            running_gateway(settings_for(tmp_path, _fleet(url, {"ca_file": str(pem.ca)}))) as (base, _):
        r = await _chat(base)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "over tls"
        assert "/v1/chat/completions" in seen


async def test_a_node_requiring_a_client_certificate(pem: Certs, tmp_path: Path) -> None:
    block = {"ca_file": str(pem.ca), "cert_file": str(pem.client_cert), "key_file": str(pem.client_key)}
    async with tls_node(pem, mtls=True) as (url, seen), \
            running_gateway(settings_for(tmp_path, _fleet(url, block))) as (base, _):
        r = await _chat(base)
        assert r.status_code == 200, r.text
        assert seen[-1] == "/v1/chat/completions"


async def test_without_its_client_certificate_the_client_gets_an_envelope_not_a_500(
        pem: Certs, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    # no probe: the request itself meets the refusal (a probe would mark the node down first)
    async with tls_node(pem, mtls=True) as (url, seen), \
            running_gateway(settings_for(tmp_path, _fleet(url, {"ca_file": str(pem.ca)}, probe=False))) as (base, _):
        r = await _chat(base)
    assert r.status_code in (502, 503), r.text
    assert set(r.json()["error"]) >= {"message", "type", "code"}
    assert "/v1/chat/completions" not in seen
    assert "PRIVATE KEY" not in caplog.text


async def test_an_untrusted_node_certificate_is_refused(pem: Certs, tmp_path: Path) -> None:
    # no tls block: the system CAs, which do not know the test CA
    async with tls_node(pem) as (url, seen), \
            running_gateway(settings_for(tmp_path, _fleet(url, None, probe=False))) as (base, _):
        r = await _chat(base)
    assert r.status_code in (502, 503), r.text
    assert seen == []


@pytest.mark.parametrize(("mtls", "block", "reason"), [
    (False, {}, "certificate verify failed"),
    (False, {"ca_file": "CA", "server_name": "elsewhere.example"}, "certificate verify failed"),
    (True, {"ca_file": "CA"}, "may require a client certificate: tls.cert_file"),
])
async def test_the_upstream_error_says_tls(pem: Certs, mtls: bool, block: dict[str, Any], reason: str) -> None:
    tls = NodeTLS(**{k: (str(pem.ca) if v == "CA" else v) for k, v in block.items()})
    timeouts = TimeoutConfig(connect_s=2.0, first_token_s=5.0, idle_s=5.0, total_s=10.0)
    async with tls_node(pem, mtls=mtls) as (url, _), Upstream() as up:
        with pytest.raises(UpstreamConnectError) as info:
            resp = await up.open(url + "/v1/chat/completions", b"{}", headers={}, timeouts=timeouts, node="n",
                                 tls=tls)
            await resp.aclose()
    assert reason in str(info.value), info.value
    assert "PRIVATE KEY" not in str(info.value)


@asynccontextmanager
async def _https_gateway(settings: Settings) -> AsyncIterator[int]:
    """The gateway (``create_app``) served by :func:`build_server` with the settings' TLS."""
    port = free_port()
    app = create_app(settings)
    contexts: ListenerContexts = listener_contexts(settings, None)
    server = build_server(app, settings, tls=contexts, host="127.0.0.1", port=port, log_level="warning")
    task = asyncio.create_task(server.serve())
    for _ in range(1000):   # bounded: start-up
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    assert server.started
    try:
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


async def test_the_openai_sdk_over_https_end_to_end(pem: Certs, tmp_path: Path) -> None:
    block = {"ca_file": str(pem.ca), "cert_file": str(pem.client_cert), "key_file": str(pem.client_key)}
    async with tls_node(pem, mtls=True) as (url, _):
        settings = settings_for(tmp_path, _fleet(url, block), admin_port=0,
                                tls=ListenerTLS(cert_file=pem.server_cert, key_file=pem.server_key))
        async with _https_gateway(settings) as port:
            verify = ssl.create_default_context(cafile=str(pem.ca))
            async with httpx.AsyncClient(verify=verify) as http:
                client = openai.AsyncOpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="unused",
                                            http_client=http, max_retries=0)
                out = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
                assert out.choices[0].message.content == "over tls"
            async with httpx.AsyncClient() as plain:   # the system CAs: the gateway's certificate is not trusted
                client = openai.AsyncOpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="unused",
                                            http_client=plain, max_retries=0)
                with pytest.raises(openai.APIConnectionError):
                    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
