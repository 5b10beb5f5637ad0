"""``GatewayServer``'s admin listener (server/lifecycle.py, server/listeners.py) over real sockets:
requests there are marked as the admin listener's and requests on the public port are not; an admin
port that cannot be bound fails the start-up and leaves no listener open."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from fastapi import FastAPI, Request

from inferlb.config.settings import Settings
from inferlb.server import build_server
from inferlb.server.listeners import listener_of
from tests.support import free_port


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/which")
    async def which(request: Request) -> dict[str, str]:
        return {"listener": listener_of(request.scope)}

    return app


async def test_each_listener_is_told_apart() -> None:
    port, admin = free_port(), free_port()
    server = build_server(_app(), Settings(), admin=("127.0.0.1", admin), host="127.0.0.1", port=port,
                          log_level="warning", lifespan="off")
    task = asyncio.create_task(server.serve())
    for _ in range(1000):   # bounded: start-up
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    assert server.started
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(f"http://127.0.0.1:{port}/which")).json() == {"listener": "public"}
            assert (await http.get(f"http://127.0.0.1:{admin}/which")).json() == {"listener": "admin"}
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


async def test_an_admin_port_taken_fails_the_start_up_and_closes_the_public_listener() -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        admin = taken.getsockname()[1]
        server = build_server(_app(), Settings(), admin=("127.0.0.1", admin), host="127.0.0.1", port=port,
                              log_level="critical", lifespan="off")
        await asyncio.wait_for(server.serve(), 30)
    assert not server.started
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(timeout=5) as http:
            await http.get(f"http://127.0.0.1:{port}/which")
