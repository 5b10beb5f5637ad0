"""``GatewayServer``'s main loop (server/lifecycle.py): idle, it sleeps up to ``tick_s``
instead of waking every 0.1 s, and setting ``should_exit`` (from another thread here, as a signal
handler or an embedding program would) wakes it at once. ``tick_s`` is an hour in the test, so only
the wake-up can stop the server before the hang guard; the ``Date`` header is still sent."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI

from inferlb.config.settings import Settings
from inferlb.server import build_server
from tests.support import free_port

HANG_GUARD_S = 20.0   # far below tick_s: only the wake-up gets the server out in time


async def test_should_exit_wakes_the_idle_main_loop() -> None:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    port = free_port()
    server = build_server(app, Settings(), host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server.tick_s = 3600.0
    ticks = 0
    on_tick = server.on_tick

    async def counting(counter: int) -> bool:
        nonlocal ticks
        ticks += 1
        return await on_tick(counter)

    server.on_tick = counting  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    for _ in range(1000):   # bounded: start-up
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    assert server.started
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        r = await http.get("/ping")
    assert r.status_code == 200 and r.headers.get("date")
    assert ticks == 1                              # the first tick only: the loop sleeps
    await asyncio.to_thread(setattr, server, "should_exit", True)
    await asyncio.wait_for(task, HANG_GUARD_S)
    assert ticks == 2
