"""Shared test support: fast simulated fleets and a real gateway on a loopback port.

``certs(tmp)`` writes a CA, a server certificate for 127.0.0.1 / localhost and a client
certificate signed by it (trustme), made in the test, into ``tmp``.

``tls_node(certs)`` serves a tiny OpenAI-compatible node over HTTPS on 127.0.0.1 (``mtls``: it
requires a client certificate signed by the test CA).

``running_gateway(settings)`` serves ``create_app(settings)`` with uvicorn on a free 127.0.0.1
port inside the test's event loop (real sockets, real HTTP) and shuts it down cleanly. Its one
listener is the admin listener (``inferlb.server.listeners.as_admin``: every route, the admin ones
without a key while no admin key is set); ``public=True`` serves it as the public listener instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from inferlb.app import create_app
from inferlb.config.settings import FleetConfig, Settings, fleet_from_mapping
from inferlb.server.listeners import as_admin
from inferlb.simulator.spec import NodeSpec
from inferlb.types import Clock

ROOT = Path(__file__).resolve().parents[1]


_HANDED_OUT: set[int] = set()   # every port free_port returned in this process


def free_port() -> int:
    """A loopback port free now, never one this process was handed before: the kernel may give
    the same ephemeral port to two binds in a row once the first socket is closed, and a test that
    asks for a gateway port and a node port must not get one port for both (the gateway then
    refuses its own listener as a node: tests/api/test_admin_plane.py failed so once in CI)."""
    for _ in range(1000):   # bounded: the ephemeral range holds tens of thousands
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no loopback port this process has not been handed already")


@dataclass(frozen=True)
class Certs:
    """PEM files of one test CA (module docstring); ``other_key``: a key that matches no certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_key: Path


def certs(tmp: Path) -> Certs:
    """A CA, a server certificate (127.0.0.1, localhost) and a client certificate, written under ``tmp``."""
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("gateway@inferlb.test")
    other = ca.issue_cert("other.inferlb.test")
    out = Certs(*(tmp / f"{n}.pem" for n in ("ca", "server", "server-key", "client", "client-key", "other-key")))
    ca.cert_pem.write_to_path(str(out.ca))
    server.cert_chain_pems[0].write_to_path(str(out.server_cert))
    server.private_key_pem.write_to_path(str(out.server_key))
    client.cert_chain_pems[0].write_to_path(str(out.client_cert))
    client.private_key_pem.write_to_path(str(out.client_key))
    other.private_key_pem.write_to_path(str(out.other_key))
    return out


CHAT_ANSWER = {"id": "chatcmpl-tls", "object": "chat.completion", "created": 0, "model": "m",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "over tls"},
                            "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


@contextlib.asynccontextmanager
async def tls_node(pem: Certs, *, mtls: bool = False) -> AsyncIterator[tuple[str, list[str]]]:
    """(base URL ``https://127.0.0.1:PORT``, the paths it was asked, in order) of a node serving
    ``/v1/models`` and ``/v1/chat/completions`` (:data:`CHAT_ANSWER`) with the test server certificate."""
    import ssl

    from aiohttp import web

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pem.server_cert, pem.server_key)
    if mtls:
        ctx.load_verify_locations(cafile=pem.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    seen: list[str] = []

    async def models(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.path)
        await request.read()
        return web.json_response(CHAT_ANSWER)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx).start()
    try:
        yield f"https://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def fast_specs(n: int = 3, **over: Any) -> list[NodeSpec]:
    """Nodes with millisecond latencies, serving "m" (chat/completions) and "emb"."""
    kw: dict[str, Any] = {"base_ttft_s": 0.002, "tpot_s": 0.0005, **over}
    return [NodeSpec(name=f"n{i}", models=["m", "emb"], **kw) for i in range(n)]


def fleet_for(urls: dict[str, str], **routing: Any) -> FleetConfig:
    return fleet_from_mapping({
        "models": [
            {"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8, "fallbacks": []},
            {"name": "emb", "kind": "embedding"},
        ],
        "nodes": [{"name": n, "url": u, "models": ["m", "emb"], "price_per_hour": 1.0} for n, u in urls.items()],
        "routing": routing or {"profile": "token-aware", "seed": 1},
        "timeouts": {"connect_s": 1.0, "first_token_s": 2.0, "idle_s": 2.0, "total_s": 10.0},
        "slos": [{"model": "m", "e2e_max_s": 5.0, "ttft_max_s": 1.0}],
    })


def settings_for(tmp: Path, fleet: FleetConfig, **over: Any) -> Settings:
    base: dict[str, Any] = {"fleet": fleet, "database_url": f"sqlite:///{tmp / 'audit.db'}",
                            "journal_dir": tmp / "journal", "audit_flush_interval_s": 0.01}
    base.update(over)
    return Settings(**base)


@contextlib.asynccontextmanager
async def running_gateway(settings: Settings, *, clock: Clock | None = None,
                          node_launcher: Any = None,
                          leader: Callable[[], bool] | None = None,
                          port: int | None = None, public: bool = False,
                          log_level: str = "warning", access_log: bool = False) -> AsyncIterator[tuple[str, Any]]:
    """Yields (base URL, app); ``clock`` is injected into the app (default: the system clock);
    ``node_launcher``: the local autoscale actuator's (create_app's); ``leader``: create_app's
    (default: the election, a lone replica always leads); ``port``: the one to listen on (default: a
    free one); ``public``: serve as the public listener (default: the admin listener, module docstring);
    ``log_level`` / ``access_log``: uvicorn's (its ``uvicorn.*`` loggers do not propagate: a test that
    reads them attaches its handler once this has yielded, after uvicorn configured them)."""
    app = create_app(settings, clock=clock, node_launcher=node_launcher, leader=leader)
    port = port or free_port()
    config = uvicorn.Config(app if public else as_admin(app), host="127.0.0.1", port=port, log_level=log_level,
                            access_log=access_log, lifespan="on")
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    for _ in range(500):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if not server.started:
        await task
        raise RuntimeError("gateway did not start")
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)


def need_real_engine() -> None:
    """Skip a real-engine test where llama-cpp-python or its model is absent, or fail it where
    INFERLB_REQUIRE_ENGINE=1 (CI: .ci/run), so that a run without the engine cannot pass silently."""
    import os

    import pytest

    from inferlb.modelserver.llamacpp import unavailable

    why = unavailable()
    if why is None:
        return
    if os.environ.get("INFERLB_REQUIRE_ENGINE") == "1":
        pytest.fail(f"INFERLB_REQUIRE_ENGINE=1 but {why}")
    pytest.skip(why)


async def audit_of(client: httpx.AsyncClient, app: Any, rid: str) -> dict[str, Any]:
    """The audit record of request ``rid`` through ``GET /audit/requests/{id}``, once the
    writer has flushed what it holds."""
    await app.state.store.writer.flush_once(force=True)
    r = await client.get(f"/audit/requests/{rid}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body
