"""``GatewayServer``: uvicorn's server with a drain between the stop signal and the shutdown.

uvicorn, on SIGTERM, closes its listener within 0.1 s and waits for the requests in flight; the
application hears of the shutdown only afterwards (lifespan), so until then ``/readyz`` still says
ready and afterwards probes get "connection refused". Here the order is:

1. the signal handler marks the application draining at once (``on_drain``): ``/readyz`` and
   ``/health`` answer 503 ``draining``, new inference requests 503 ``server_shutting_down``;
2. the listener stays open while requests are in flight, up to ``drain_timeout_s``;
3. at that deadline ``on_deadline`` runs (the gateway ends the streams still running with an SSE
   error event and audits them); connections still busy ``stop_grace_s`` later are closed, which the
   gateway sees as a client that left;
4. then uvicorn's own shutdown: listener closed, lifespan shutdown (the audit writer flushes).

The main loop wakes once a second (the ``Date`` header uvicorn refreshes every second) and at once
when ``should_exit`` is set (by the signal handler or a caller), where uvicorn's wakes every 0.1 s
to look at it: ten wake-ups a second were about 1 ms of CPU per second of an idle gateway
(docs/benchmarks.md, "Idle CPU: the revision poll made event-driven").

With an ``admin`` address the server also listens there once the public listener is up (after the
lifespan start-up, so no request finds the app half-built); its connections run the application
marked as the admin listener's (:func:`~inferlb.server.listeners.as_admin`). One server, so one
lifespan, one drain and one set of signal handlers serve both. An admin port that cannot be bound
is a start-up failure (the public listener closed, the lifespan shut down, ``started`` false:
``serve_gateway`` exits 1).

A SIGTERM ends the process with status 0: uvicorn re-raises the signal it handled after a graceful
shutdown, which would end the process with status 143 instead. A second Ctrl-C skips the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable, Generator
from types import FrameType
from typing import Any

import uvicorn

from inferlb.server.listeners import as_admin
from inferlb.wakeup import Wakeup

__all__ = ["GatewayServer"]

log = logging.getLogger("inferlb")


class GatewayServer(uvicorn.Server):
    """``uvicorn.Server`` that drains before it shuts down (module docstring)."""

    def __init__(self, config: uvicorn.Config, *, drain_timeout_s: float, on_drain: Callable[[], None],
                 on_deadline: Callable[[], Awaitable[None] | None], stop_grace_s: float = 2.0,
                 admin: tuple[str, int] | None = None, admin_ssl: ssl.SSLContext | None = None,
                 admin_sock: socket.socket | None = None) -> None:
        super().__init__(config)
        self.admin = admin
        # a socket already bound to ``admin`` (the workers' supervisor binds it once, server/workers.py)
        self.admin_sock = admin_sock
        self.admin_ssl = admin_ssl    # the admin listener's TLS (server/listeners.py listener_contexts)
        self.drain_timeout_s = drain_timeout_s
        self.stop_grace_s = stop_grace_s
        self._on_drain = on_drain
        self._on_deadline = on_deadline
        self._drain_started = False
        self.tick_s = 1.0     # the main loop's longest sleep (the Date header's refresh)
        self._exit_wakeup = Wakeup()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started or self.admin is None:
            return
        config = self.config
        app = as_admin(config.loaded_app)

        def admin_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            proto: Any = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state, _loop=_loop)
            proto.app = app    # uvicorn's protocols run ``self.app``, set from the config at creation
            return proto  # type: ignore[no-any-return]

        host, port = self.admin
        try:
            loop = asyncio.get_running_loop()
            if self.admin_sock is not None:
                server = await loop.create_server(admin_protocol, sock=self.admin_sock, backlog=config.backlog,
                                                  ssl=self.admin_ssl)
            else:
                server = await loop.create_server(admin_protocol, host=host, port=port, backlog=config.backlog,
                                                  ssl=self.admin_ssl)
        except OSError as exc:
            log.error("admin listener %s:%d: %s", host, port, exc)
            # Never started: serve() returns without a shutdown of its own (``started`` is false),
            # and ``serve_gateway`` exits 1 as for a public port taken.
            self.started = False
            self.should_exit = True
            for s in self.servers:
                s.close()
            await self.lifespan.shutdown()
            return
        self.servers.append(server)
        log.info("admin listener on %s://%s:%d", "https" if self.admin_ssl is not None else "http", host,
                 server.sockets[0].getsockname()[1] if server.sockets else port)

    @property
    def should_exit(self) -> bool:
        """uvicorn's stop flag; setting it true wakes the main loop (from any thread, or a signal handler)."""
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        wakeup = getattr(self, "_exit_wakeup", None)   # None inside uvicorn's __init__
        if value and wakeup is not None:
            wakeup.set_threadsafe()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._begin_drain()      # in the signal handler: readiness turns false before the next tick

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            yield
            # A drained SIGTERM is a normal stop: do not let uvicorn raise it again (exit 143).
            self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]

    async def main_loop(self) -> None:
        await self._tick_until_exit()
        if not self.force_exit:
            await self.drain()

    async def _tick_until_exit(self) -> None:
        """uvicorn's ``main_loop`` with its 0.1 s sleep replaced by a wait on ``should_exit`` of
        at most ``tick_s`` (1 s); ``on_tick`` sees the counter move by 10 (one second) each turn,
        so it refreshes the ``Date`` header (and checks ``limit_max_requests``) at every turn."""
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000
            if not self.should_exit:
                await self._exit_wakeup.wait(self.tick_s)
            should_exit = await self.on_tick(counter)

    async def drain(self) -> None:
        """Keep serving until no request is in flight or the drain deadline passes (steps 1–3)."""
        self._begin_drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout_s
        if self.server_state.tasks:
            log.info("draining: %d request(s) in flight, up to %.1f s", len(self.server_state.tasks),
                     self.drain_timeout_s)
        if await self._wait_idle(deadline):
            return
        log.warning("drain deadline: stopping %d request(s) still in flight", len(self.server_state.tasks))
        result = self._on_deadline()
        if inspect.isawaitable(result):
            await result
        if await self._wait_idle(loop.time() + self.stop_grace_s):
            return
        for conn in list(self.server_state.connections):
            transport = getattr(conn, "transport", None)
            if transport is not None and not transport.is_closing():
                transport.close()
        await self._wait_idle(loop.time() + self.stop_grace_s)

    async def _wait_idle(self, deadline: float) -> bool:
        """True once no ASGI task runs; False at ``deadline`` (or on a forced exit)."""
        loop = asyncio.get_running_loop()
        while self.server_state.tasks and not self.force_exit:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await asyncio.wait(set(self.server_state.tasks), timeout=remaining)
        return True

    def _begin_drain(self) -> None:
        if not self._drain_started:
            self._drain_started = True
            self._on_drain()
