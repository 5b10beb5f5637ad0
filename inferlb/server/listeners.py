"""Which listener a request came in on: the public one, or the admin one (Envoy's admin interface).

The gateway serves one application on two listeners of one uvicorn server
(:class:`~inferlb.server.lifecycle.GatewayServer`): the public listener (``INFERLB_HOST:PORT``) and
the admin listener (``INFERLB_ADMIN_HOST:ADMIN_PORT``, loopback by default). The admin listener's
connections run the application through :func:`as_admin`, which marks each request's ASGI scope
(``scope["extensions"]["inferlb.listener"]``); :func:`listener_of` reads the mark.

Contract:

* A scope without the mark is the public listener's: a server, test client or embedding that does
  not mark its requests gets the stricter rules (fail closed).
* :func:`admin_address` is the admin listener's address from the settings, or None when it is off:
  ``INFERLB_ADMIN_PORT`` unset means the public port + 1 (no listener while the public port is 0);
  ``0`` turns it off. A non-loopback admin host with no ``INFERLB_ADMIN_KEY`` is a
  :class:`~inferlb.errors.ConfigError` (an admin plane open to the network without a key), and so
  is an admin address equal to the public one.
* :func:`describe_admin` is the one start-up line that says where the admin routes are served and
  with which key.
* :func:`listener_contexts` is each listener's TLS context (config/tls.py): the public listener
  serves HTTPS when ``INFERLB_TLS_CERT_FILE`` is set; the admin listener follows
  ``INFERLB_ADMIN_TLS``: ``auto`` (the default) serves it with the same certificate and client
  certificate policy when its host is not loopback (the admin key must not cross a network in the
  clear) and plain HTTP on loopback (local tools and port-forwards reach it as before; traffic that
  never leaves the host gains nothing from TLS); ``on`` always (a :class:`ConfigError` without a
  certificate); ``off`` never (TLS terminated in front of it, say).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Literal

from starlette.types import ASGIApp, Receive, Scope, Send

from inferlb.config.settings import Settings
from inferlb.config.tls import server_context
from inferlb.errors import ConfigError

__all__ = ["ADMIN", "EXTENSION", "PUBLIC", "Listener", "ListenerContexts", "admin_address", "as_admin", "bind_public",
           "bind_tcp", "describe_admin", "listener_contexts", "listener_of"]

Listener = Literal["public", "admin"]
PUBLIC: Listener = "public"
ADMIN: Listener = "admin"
EXTENSION = "inferlb.listener"   # the key under the scope's "extensions"


def as_admin(app: ASGIApp) -> ASGIApp:
    """``app`` with every HTTP request marked as the admin listener's (module docstring)."""
    async def marked(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            extensions: dict[str, Any] = dict(scope.get("extensions") or {})
            extensions[EXTENSION] = {"name": ADMIN}
            scope = {**scope, "extensions": extensions}
        await app(scope, receive, send)
    return marked


def listener_of(scope: Scope) -> Listener:
    """The listener a request came in on: ``"admin"`` when :func:`as_admin` marked it, else ``"public"``."""
    mark = (scope.get("extensions") or {}).get(EXTENSION)
    return ADMIN if isinstance(mark, dict) and mark.get("name") == ADMIN else PUBLIC


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def admin_address(settings: Settings) -> tuple[str, int] | None:
    """The admin listener's (host, port), or None when it is off (module docstring)."""
    port = settings.admin_listen_port()
    if port == 0:
        return None
    host = settings.admin_host
    if (host, port) == (settings.host, settings.port):
        raise ConfigError(f"INFERLB_ADMIN_PORT={port} is the public listener's port: choose another (0 turns "
                          "the admin listener off)")
    if settings.admission.admin_key is None and not _loopback(host):
        raise ConfigError(f"INFERLB_ADMIN_HOST={host} is not a loopback address and INFERLB_ADMIN_KEY is unset: "
                          "the admin routes would be open to the network; set INFERLB_ADMIN_KEY or keep the "
                          "admin listener on 127.0.0.1")
    return host, port


@dataclass(frozen=True, slots=True)
class ListenerContexts:
    """Each listener's TLS context; None: plain HTTP."""

    public: ssl.SSLContext | None = None
    admin: ssl.SSLContext | None = None


def listener_contexts(settings: Settings, admin: tuple[str, int] | None) -> ListenerContexts:
    """The public and admin listeners' contexts (module docstring); ConfigError naming the variable
    for a certificate, key or CA that does not load, or ``INFERLB_ADMIN_TLS=on`` without a certificate."""
    public = server_context(settings.tls)
    if settings.admin_tls == "on" and public is None:
        raise ConfigError("on, but INFERLB_TLS_CERT_FILE is unset: the admin listener has no certificate to serve",
                          source="environment", path="INFERLB_ADMIN_TLS")
    if admin is None or settings.admin_tls == "off":
        return ListenerContexts(public, None)
    if settings.admin_tls == "auto" and _loopback(admin[0]):
        return ListenerContexts(public, None)
    return ListenerContexts(public, public)


def describe_admin(settings: Settings, address: tuple[str, int] | None, *, tls: bool = False) -> str:
    """The start-up line: where the admin routes are served (``tls``: over HTTPS), and with which key."""
    scheme = "https" if tls else "http"
    where = f"the admin listener {scheme}://{address[0]}:{address[1]}" if address else None
    if settings.admission.admin_key is not None:
        also = f" and on {where}" if where else ""
        return f"admin routes: INFERLB_ADMIN_KEY required, on the public listener{also}"
    if where is None:
        return ("admin routes: off (no INFERLB_ADMIN_KEY and INFERLB_ADMIN_PORT=0); the public listener "
                "answers them 404")
    return (f"admin routes: no INFERLB_ADMIN_KEY, so served without a key on {where} only; the public "
            "listener answers them 404")


def bind_public(settings: Settings) -> socket.socket:
    """The public listener's socket, bound to ``settings.host:port`` (not yet listening: the server
    listens on it once the app has started). ``serve`` binds it before any other start-up work, so
    a port in use is one :class:`~inferlb.errors.ConfigError` at once, not an error after the
    database, the processes and the fleet were set up."""
    return bind_tcp(settings.host, settings.port, "INFERLB_HOST/INFERLB_PORT")


def bind_tcp(host: str, port: int, settings_path: str) -> socket.socket:
    """A TCP socket bound to ``host:port``, not yet listening; a port in use (or any bind error) is
    a :class:`~inferlb.errors.ConfigError` naming ``settings_path``, the settings that chose it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # as uvicorn binds its own: a restart may reuse the port of connections still in TIME_WAIT
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", source="environment",
                          path=settings_path) from exc
    return sock
