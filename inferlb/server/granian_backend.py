# mypy: ignore-errors
# (granian 2.8.9's _granian.pyi does not match its compiled module: ASGIWorker's arguments, serve_str)
"""The gateway on granian (a Rust HTTP server, ASGI interface) instead of uvicorn: the experiment
for issue 23 item 3 (``INFERLB_SERVER=granian``), measured against uvicorn in docs/benchmarks.md
("granian instead of uvicorn") and removed again in the next commit (rejected).

:class:`GranianGateway` offers what ``serve_gateway`` uses of
:class:`~inferlb.server.lifecycle.GatewayServer` (``started``, ``should_exit``, ``handle_exit``,
``serve(sockets=...)``) and runs the same FastAPI app through granian's embedded server on the
running (uv)loop, one worker, lifespan on, HTTP/1.1 only, on the socket ``serve`` already bound.
Not carried (an experiment): the drain (SIGTERM stops at once), the admin listener, TLS, the body
timeout and the header count and size limits. ``INFERLB_GRANIAN_VARIANT``: ``st`` serves on
granian's single-threaded runtime (``serve_str``, as its own worker processes do) instead of the
embedded server's ``serve_async``; ``rust``: granian's Rust task implementation.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from types import FrameType
from typing import Any

from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from inferlb.config.settings import Settings
from inferlb.errors import ConfigError
from inferlb.server.listeners import ListenerContexts

__all__ = ["GranianGateway"]

log = logging.getLogger("inferlb")


class GranianGateway:
    """The gateway app served by granian's embedded server (module docstring)."""

    def __init__(self, app: FastAPI, settings: Settings, *, admin: tuple[str, int] | None = None,
                 tls: ListenerContexts | None = None, admin_sock: socket.socket | None = None) -> None:
        if tls is not None and (tls.public is not None or tls.admin is not None):
            raise ConfigError("INFERLB_SERVER=granian does not serve TLS yet", source="environment",
                              path="INFERLB_SERVER")
        self.app = app
        self.settings = settings
        self.admin = admin
        self.admin_sock = admin_sock
        self.started = False
        self.should_exit = False
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.should_exit = True
        self.app.state.ready = False
        self.app.state.draining = True
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def _lifespan_app(self) -> Any:
        app = self.app

        async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "lifespan":
                await app(scope, receive, send)
                return

            async def send_(message: Message) -> None:
                if message["type"] == "lifespan.startup.complete":
                    self.started = True
                await send(message)
            await app(scope, receive, send_)
        return wrapped

    async def serve(self, sockets: list[socket.socket]) -> None:
        from granian.constants import HTTPModes, Interfaces
        from granian.http import HTTP1Settings
        from granian.log import LogLevels
        from granian.server.embed import Server

        sock = sockets[0]
        sock.listen(1024)
        fd = os.dup(sock.fileno())

        class _Embedded(Server):  # type: ignore[misc]
            def _init_shared_socket(self) -> None:
                from granian._granian import SocketHolder
                self._ssp = None
                self._shd = SocketHolder(fd, False, 1024)
                self._sfd = fd

        http1 = HTTP1Settings(header_read_timeout=int(self.settings.http_header_timeout_s * 1000),
                              max_buffer_size=max(self.settings.http_max_header_bytes, 8192 + 4096 * 100))
        server = _Embedded(self._lifespan_app(), address=self.settings.host, port=self.settings.port,
                           interface=Interfaces.ASGI, http=HTTPModes.http1, websockets=False,
                           http1_settings=http1, log_level=LogLevels.warning, backlog=1024)
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self.handle_exit, sig, None)
        variant = os.environ.get("INFERLB_GRANIAN_VARIANT", "")
        spawn = None
        if "st" in variant.split(","):
            spawn = _st_target()
        if "rust" in variant.split(","):
            from granian.constants import TaskImpl
            server.task_impl = TaskImpl.rust
        task = asyncio.ensure_future(server.serve(spawn))
        stopper = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            server.stop()
        await task
        stopper.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.remove_signal_handler(sig)


def _st_target() -> Any:
    """granian's embedded ASGI lifespan worker, but on ``serve_str`` (the single-threaded runtime
    granian's own worker processes use) instead of ``serve_async``."""
    from granian._futures import _future_watcher_wrapper, _new_cbscheduler
    from granian._granian import ASGIWorker
    from granian.asgi import LifespanProtocol, _callback_wrapper
    from granian.constants import TaskImpl
    from granian.errors import FatalError
    from granian.server.embed import AsyncWorker

    @AsyncWorker.wrap_target
    async def target(worker_id: int, shutdown_event: Any, callback: Any, sock: Any, loop: Any,
                     runtime_threads: int, runtime_blocking_threads: int | None, blocking_threads: int,
                     blocking_threads_idle_timeout: int, backpressure: int, task_impl: Any, http_mode: Any,
                     http1_settings: Any, http2_settings: Any, websockets: bool, static_path: Any,
                     log_access_fmt: Any, ssl_ctx: Any, scope_opts: Any) -> None:
        lifespan_handler = LifespanProtocol(callback)
        wcallback = _future_watcher_wrapper(_callback_wrapper(callback, scope_opts, lifespan_handler.state,
                                                              log_access_fmt))
        await lifespan_handler.startup()
        if lifespan_handler.interrupt:
            raise FatalError("ASGI lifespan startup")
        fut = loop.create_future()
        shutdown_event.add_cb(lambda: loop.call_soon_threadsafe(fut.set_result, None))
        worker = ASGIWorker(worker_id, sock, None, runtime_threads, runtime_blocking_threads, blocking_threads,
                            blocking_threads_idle_timeout, backpressure, http_mode, http1_settings, http2_settings,
                            websockets, static_path, *ssl_ctx, (None, None))
        scheduler = _new_cbscheduler(loop, wcallback, impl_asyncio=task_impl == TaskImpl.asyncio)
        worker.serve_str(scheduler, loop, shutdown_event)
        await fut
        await lifespan_handler.shutdown()
    return target
