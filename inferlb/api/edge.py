"""HTTP edge rules that sit in front of the routers.

- :func:`openai_guard`: the one dependency of the OpenAI routes: :func:`~.auth.authenticate`, then
  :func:`openai_edge`, called in that order as plain coroutines. FastAPI's dependency solving costs
  ~7 µs per dependency, and the two as dependencies made a chain of six per request (with their
  own: admission controller, lifecycle, gateway), ~30 µs of the request path (docs/benchmarks.md,
  "The request path profiled again").
- :func:`openai_edge`: the edge rules of the OpenAI routes. A POST body must be declared
  ``Content-Type: application/json`` (any parameters, e.g. ``charset``) and must not be compressed
  (``Content-Encoding`` other than ``identity``): else 415. A ``text/plain`` or form-encoded POST is
  what a browser sends cross-site without a CORS preflight, so refusing it keeps any web page from
  spending a local gateway's GPUs. While the server drains after SIGTERM, new POSTs get 503
  ``server_shutting_down`` (readiness already says so; requests in flight finish).
- :class:`HeadAsGet`: ASGI middleware answering ``HEAD`` on every ``GET`` route (headers of the
  GET answer, no body).
- :class:`RequestIds`: ASGI middleware giving every answer an ``x-request-id``.
- :class:`ClientGone`: ASGI middleware ending quietly a request whose client left (or whose body
  read timed out, ``server/protocol.py``) while its body was being read: there is nobody to
  answer, and it is not a server error.
- :class:`HotRoutes`: ASGI middleware serving the POST routes of ``openai.HOT_ROUTES`` without
  FastAPI's routing and dependency solving (below). It sits outside ``ClientGone``, ``HeadAsGet``
  and ``RequestIds`` and applies their rules to the requests it takes itself, so that a streamed
  answer's many body messages pass through no edge wrapper and its relay task resumes through
  three middleware frames fewer at every chunk (docs/benchmarks.md, "Less CPU per streamed chunk").
- :func:`allow_header`: the ``Allow`` value for a 405, the methods of every route on the path.
- :func:`add_cors`: starlette's ``CORSMiddleware`` for the configured origins (none by default,
  and then a preflight ``OPTIONS`` is a 405 like any unrouted method).

:func:`install` adds the middleware; the dependency and ``allow_header`` are wired in ``app.py``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferlb.api.auth import authenticate
from inferlb.api.deps import GatewayDep, LifecycleDep, get_admission, get_gateway, get_lifecycle
from inferlb.api.openai import HOT_ROUTES
from inferlb.engine.gateway import Gateway
from inferlb.engine.request_ids import new_request_id
from inferlb.engine.streaming import WatchedStreamingResponse
from inferlb.errors import ClientError

log = logging.getLogger("inferlb")

__all__ = [
    "ClientGone",
    "HeadAsGet",
    "HotRoutes",
    "RequestIds",
    "ShuttingDown",
    "UnsupportedMediaType",
    "add_cors",
    "allow_header",
    "install",
    "openai_edge",
    "openai_guard",
]


class UnsupportedMediaType(ClientError):
    """415: the body is not declared JSON, or it is compressed."""

    status = 415


class ShuttingDown(ClientError):
    """503 ``server_shutting_down``: the gateway drains; another replica should take the request."""

    status = 503
    type = "server_error"

    def __init__(self) -> None:
        super().__init__("The gateway is shutting down; retry on another replica", code="server_shutting_down")
        self.headers = {"retry-after": "1", "connection": "close"}


def _media_error(request: Request) -> UnsupportedMediaType | None:
    ctype = request.headers.get("content-type")
    # The exact value most clients send needs no split: the same media type either way.
    media = ctype if ctype == "application/json" else ctype.split(";", 1)[0].strip().lower() if ctype else ""
    if media != "application/json":
        got = f"'{media[:100]}'" if media else "none"
        return UnsupportedMediaType(f"Content-Type must be application/json (got {got})",
                                    param="content-type", code="unsupported_media_type")
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        return UnsupportedMediaType(f"unsupported content encoding '{encoding[:100]}': send the JSON body "
                                    "uncompressed", param="content-encoding", code="unsupported_content_encoding")
    return None


def _endpoint(path: str) -> str:
    """The audit's endpoint name of an OpenAI route (as ``api/openai.py`` names them)."""
    if path.startswith("/v1/predict/"):
        return "predict"
    return {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(path, path.rsplit("/", 1)[-1])


async def openai_edge(request: Request, life: LifecycleDep, gw: GatewayDep) -> None:
    """Refuse, before the body is read, a POST the OpenAI routes cannot take (module docstring).
    A 415 is audited like every other invalid request."""
    if request.method != "POST":
        return
    if life.draining:
        raise ShuttingDown()
    err = _media_error(request)
    if err is not None:
        gw.reject(_endpoint(request.url.path), "?", err.status, err.code)
        raise err


async def openai_guard(request: Request) -> None:
    """The OpenAI routes' dependency: :func:`~.auth.authenticate`, then :func:`openai_edge` (module
    docstring), with the app-wide objects from ``deps``'s getters."""
    await authenticate(request, await get_admission(request))
    await openai_edge(request, await get_lifecycle(request), await get_gateway(request))


class HeadAsGet:
    """Serve ``HEAD`` as ``GET`` and drop the body (RFC 9110 §9.3.2)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headless(message: Message) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headless)


def _route_methods(app: FastAPI) -> Iterator[tuple[str, set[str]]]:
    """(path template, methods) of every route, included routers flattened."""
    try:    # FastAPI ≥ 0.13x keeps included routers nested; iter_route_contexts flattens them
        from fastapi.routing import iter_route_contexts
    except ImportError:   # older FastAPI: app.routes is already flat
        for route in app.routes:
            path, methods = getattr(route, "path", None), getattr(route, "methods", None)
            if path and methods:
                yield path, set(methods)
        return
    for ctx in iter_route_contexts(app.routes):
        if ctx.path and ctx.methods:
            yield ctx.path, set(ctx.methods)


class RequestIds:
    """Give every answer an ``x-request-id`` (401, 404 and the other refusals included): a client
    or an operator can quote one id for any answer. The gateway's own id, the key of the request's
    audit record, is kept where the request path set one; the others get a fresh id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = _with_request_id(message)
            await send(message)

        await self.app(scope, receive, with_id)


def _with_request_id(start: Message) -> Message:
    """``start`` (an ``http.response.start``), with a fresh ``x-request-id`` unless it has one."""
    headers = start.get("headers") or []
    if any(k.lower() == b"x-request-id" for k, _ in headers):
        return start
    return {**start, "headers": [*headers, (b"x-request-id", new_request_id().encode())]}


class ClientGone:
    """Swallow starlette's ``ClientDisconnect`` (raised while reading the body of a request whose
    connection is gone) instead of logging it as an exception in the application."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except ClientDisconnect:
            _client_left(scope)


def _client_left(scope: Scope) -> None:
    log.debug("client left while its request body was read: %s", scope.get("path"))


HotEndpoint = Callable[[Request, Gateway], Awaitable[Response]]


class _IndexedHeaders(Headers):
    """starlette's :class:`~starlette.datastructures.Headers` whose single-value reads (``[]``,
    ``get``, ``in``) are one dict lookup instead of a scan of the list: the OpenAI routes read about
    ten headers per request. Same answers: the first field of a name wins, names compare as the
    server lower-cased them; everything else (``getlist``, ``items``, ``raw``) is starlette's."""

    def __init__(self, scope: Scope) -> None:
        super().__init__(scope=scope)
        first: dict[bytes, bytes] = {}
        for key, value in self._list:
            first.setdefault(key, value)
        self._first = first

    def __getitem__(self, key: str) -> str:
        value = self._first.get(key.lower().encode("latin-1"))
        if value is None:
            raise KeyError(key)
        return value.decode("latin-1")

    def __contains__(self, key: Any) -> bool:
        return key.lower().encode("latin-1") in self._first

    def get(self, key: str, default: Any = None) -> Any:
        value = self._first.get(key.lower().encode("latin-1"))
        return default if value is None else value.decode("latin-1")


class _HotRequest(Request):
    """The request :class:`HotRoutes` hands its route: its headers are :class:`_IndexedHeaders`."""

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        super().__init__(scope, receive, send)
        self._headers = _IndexedHeaders(scope)


class HotRoutes:
    """Serve the OpenAI POST routes that carry the traffic (``routes``: exact path → endpoint) without
    FastAPI's routing, its dependency solving and its route wrappers, which cost the gateway about
    0.1 ms of CPU per request (docs/benchmarks.md, "The hot routes without FastAPI's routing").

    Contract: a request is taken here only when it is HTTP ``POST`` to exactly one of ``routes``
    with no ``root_path`` and no dependency overrides on the app; everything else (other methods,
    a trailing slash, other paths) goes to the app unchanged, so 404, 405 and redirects are the
    router's. A taken request runs what FastAPI would run for the route, in the same order:
    :func:`openai_guard` (auth, then the edge rules), the gateway from ``deps``, the endpoint,
    then its response. An exception is answered by the app's own exception handler for it (looked
    up along its class's MRO, as starlette does; an ``HTTPException`` by its status first), or
    re-raised when there is none, and an exception after the answer started is re-raised as
    starlette's ``RuntimeError``: the server's 500 path, exactly as through the router.

    ``install`` puts it outside ``ClientGone``, ``HeadAsGet`` and ``RequestIds`` (inside CORS), so a
    taken request gets their rules here: every answer carries an ``x-request-id`` (a fresh one
    where the answer has none), and a ``ClientDisconnect`` no handler takes ends the request
    quietly. (``HEAD`` is never taken, so ``HeadAsGet`` has nothing to do for these.) A gateway
    stream that names its ``x-request-id`` (:class:`WatchedStreamingResponse`) gets the server's
    ``send`` itself: its body messages, one per relayed read, pass through no wrapper here, and
    whether its answer started is read from the response.
    """

    def __init__(self, app: ASGIApp, routes: Mapping[str, HotEndpoint]) -> None:
        self.app = app
        self._routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if endpoint is None or scope.get("root_path") or scope["app"].dependency_overrides:
            await self.app(scope, receive, send)
            return
        request = _HotRequest(scope, receive, send)
        started = False
        stream: WatchedStreamingResponse | None = None

        async def sender(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = _with_request_id(message)
            await send(message)

        try:
            await openai_guard(request)
            response = await endpoint(request, await get_gateway(request))
            if isinstance(response, WatchedStreamingResponse) and _names_request_id(response):
                stream = response
                await response(scope, receive, send)
            else:
                await response(scope, receive, sender)
        except Exception as exc:
            handler = _exception_handler(request, exc)
            if handler is None:
                if isinstance(exc, ClientDisconnect):
                    _client_left(scope)   # ClientGone's rule
                    return
                raise
            if started or (stream is not None and stream.started):
                raise RuntimeError("Caught handled exception, but response already started.") from exc
            if inspect.iscoroutinefunction(handler):
                answer = await handler(request, exc)
            else:
                answer = await run_in_threadpool(handler, request, exc)
            if answer is not None:
                await answer(scope, receive, sender)
            exc.__traceback__ = None   # as starlette: a reused exception must not grow its traceback


def _names_request_id(response: Response) -> bool:
    return any(k == b"x-request-id" for k, _ in response.raw_headers)   # starlette lower-cases them


def _exception_handler(request: Request, exc: Exception) -> Any:
    """The app's handler for ``exc`` as starlette's exception middleware picks it, or None."""
    handlers: Mapping[Any, Any] = request.app.exception_handlers
    if isinstance(exc, StarletteHTTPException) and exc.status_code in handlers:
        return handlers[exc.status_code]
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None


def allow_header(request: Request) -> str:
    """The methods the routes on this request's path accept (HEAD wherever GET is)."""
    methods: set[str] = set()
    path = request.url.path
    for template, route_methods in _route_methods(request.app):
        if compile_path(template)[0].match(path):
            methods |= route_methods
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


def install(app: FastAPI, cors_origins: Sequence[str]) -> None:
    """Add the edge middleware to ``app`` (CORS outermost: a preflight is answered before routing;
    then the hot routes, which apply ``ClientGone``'s and ``RequestIds``' rules to the requests
    they take (:class:`HotRoutes`), and those two with ``HeadAsGet`` for every other request)."""
    app.add_middleware(RequestIds)
    app.add_middleware(HeadAsGet)
    app.add_middleware(ClientGone)
    app.add_middleware(HotRoutes, routes=HOT_ROUTES)
    add_cors(app, cors_origins)


def add_cors(app: FastAPI, origins: Sequence[str]) -> None:
    """Answer CORS preflights and tag answers for ``origins`` (nothing when empty)."""
    if not origins:
        return
    kwargs: dict[str, Any] = {
        "allow_origins": list(origins), "allow_methods": ["GET", "POST", "HEAD", "OPTIONS"],
        "allow_headers": ["*"], "allow_credentials": False,
        "expose_headers": ["x-request-id", "retry-after"], "max_age": 600,
    }
    app.add_middleware(CORSMiddleware, **kwargs)
