"""``inferlb agent``: the node agent, a small HTTP server on each GPU host serving NVML readings.

Contract:

* ``GET /gpu``: the report of :meth:`~inferlb.health.nvml.NvmlReader.read` (JSON), read in
  a worker thread on every request (NVML calls block; they take milliseconds).
* ``GET /healthz``: ``{"status": "ok", "nvml": "ok" | "unavailable", "reason"}``.
* Without NVML (no ``nvidia-ml-py``, no driver, no GPU) the agent still starts and serves, with
  ``"nvml": "unavailable"`` and the reason: the gateway then treats the GPU as unknown, never as
  faulty. Xid events are collected by a thread blocking in NVML's event wait; :meth:`stop` ends it.
* Read-only: the agent changes nothing on the host. Bind it to the address the gateway reaches.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from types import ModuleType

from aiohttp import web

from inferlb.health.nvml import NvmlReader

__all__ = ["NodeAgent", "serve_agent"]

log = logging.getLogger("inferlb.agent")


class NodeAgent:
    def __init__(self, reader: NvmlReader | None = None, *, loader: Callable[[], ModuleType] | None = None) -> None:
        self.reader = reader or NvmlReader(loader)
        self.host = "127.0.0.1"
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = asyncio.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        await asyncio.to_thread(self.reader.open)
        if self.reader.available:
            log.info("NVML %s: %d GPU(s)", self.reader.driver_version, len(self.reader.read()["gpus"]))
            self._thread = threading.Thread(target=self.reader.watch_xids, args=(self._stop,),
                                            name="inferlb-agent-xid", daemon=True)
            self._thread.start()
        else:
            log.warning("nvml: unavailable (%s); serving that answer", self.reader.reason)
        app = web.Application()
        app.router.add_get("/gpu", self._gpu)
        app.router.add_get("/healthz", self._healthz)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.setblocking(False)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.SockSite(runner, sock).start()
        except BaseException:
            await runner.cleanup()
            sock.close()
            raise
        self._runner = runner
        self.host, self.port = host, sock.getsockname()[1]

    async def stop(self) -> None:
        self._stop.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
            self._thread = None
        await asyncio.to_thread(self.reader.close)

    async def _gpu(self, request: web.Request) -> web.Response:
        async with self._lock:
            report = await asyncio.to_thread(self.reader.read)
        return web.json_response(report)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "nvml": "ok" if self.reader.available else "unavailable",
                                  "reason": self.reader.reason})


async def serve_agent(host: str, port: int, *, on_ready: Callable[[str], None] | None = None) -> None:
    """Run the agent until cancelled (the CLI)."""
    agent = NodeAgent()
    await agent.start(host, port)
    try:
        if on_ready is not None:
            on_ready(agent.url)
        await asyncio.Event().wait()
    finally:
        await agent.stop()
