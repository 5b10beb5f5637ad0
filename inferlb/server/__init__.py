"""The gateway's HTTP server: uvicorn with the edge limits and the drain on SIGTERM.

:func:`build_server` is the one place the server is configured; ``inferlb serve``/``demo`` and the
tests that need the real edge use it. ``protocol.py`` bounds slow and oversized request heads and
bodies; ``lifecycle.py`` drains on SIGTERM; ``listeners.py`` tells the admin listener from the public one;
``workers.py`` runs several gateway processes on one port (``serve --workers N``).
"""

from __future__ import annotations

import inspect
import socket
from typing import Any

from fastapi import FastAPI

from inferlb.config.settings import Settings
from inferlb.server.lifecycle import GatewayServer
from inferlb.server.listeners import ListenerContexts, listener_contexts
from inferlb.server.protocol import EdgeLimits, GatewayConfig

__all__ = ["build_server", "edge_limits"]


def edge_limits(settings: Settings) -> EdgeLimits:
    return EdgeLimits(header_timeout_s=settings.http_header_timeout_s, body_timeout_s=settings.http_body_timeout_s,
                      max_header_bytes=settings.http_max_header_bytes, max_headers=settings.http_max_headers)


def _begin_drain(app: FastAPI) -> None:
    """Readiness false and new inference requests refused (``api/health.py``, ``api/edge.py``)."""
    app.state.ready = False
    app.state.draining = True


async def _stop_streams(app: FastAPI) -> None:
    """Ask the gateway to end the streams still running (an SSE ``server_shutting_down`` error)."""
    stop = getattr(getattr(app.state, "gateway", None), "stop_streams", None)
    if stop is None:
        return
    result = stop(reason="server_shutting_down")
    if inspect.isawaitable(result):
        await result


def build_server(app: FastAPI, settings: Settings, *, admin: tuple[str, int] | None = None,
                 tls: ListenerContexts | None = None, admin_sock: socket.socket | None = None,
                 **overrides: Any) -> GatewayServer:
    """A :class:`GatewayServer` for ``app`` on ``settings.host:port``, and on ``admin`` as its admin
    listener (none by default; ``serve`` passes :func:`~inferlb.server.listeners.admin_address`);
    ``tls``: the listeners' TLS contexts (default: built from the settings,
    :func:`~inferlb.server.listeners.listener_contexts`, ConfigError when they do not load);
    ``admin_sock``: a socket already bound to ``admin`` to serve it on (a worker's, server/workers.py);
    ``overrides`` go to uvicorn.Config."""
    contexts = tls if tls is not None else listener_contexts(settings, admin)
    kwargs: dict[str, Any] = {"host": settings.host, "port": settings.port, "log_level": settings.log_level.lower(),
                              "access_log": False, "loop": "none", "lifespan": "on",
                              # after the drain (GatewayServer), only connections that ignore the stop remain
                              "timeout_graceful_shutdown": 1}
    public = contexts.public
    if public is not None:
        # uvicorn's own hook, handed the context built and checked from INFERLB_TLS_* (config/tls.py)
        kwargs["ssl_context_factory"] = lambda _config, _default: public
    kwargs.update(overrides)
    config = GatewayConfig(app, edge=edge_limits(settings), **kwargs)
    return GatewayServer(config, drain_timeout_s=settings.drain_timeout_s, on_drain=lambda: _begin_drain(app),
                         on_deadline=lambda: _stop_streams(app), admin=admin, admin_ssl=contexts.admin,
                         admin_sock=admin_sock)
