"""The hot OpenAI routes (``api/edge.py`` ``HotRoutes``) answer exactly as FastAPI's router does.

Each request is sent twice to one running gateway: once as it comes (the hot path takes it), once
with a dependency override set on the app, which makes ``HotRoutes`` hand every request to the
router (its contract). The two answers must agree in status, error envelope and headers; a
counting wrapper around the guard the hot path calls shows which path served each.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Request

from inferlb.api import edge
from inferlb.config.admission import AdmissionSettings
from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

ADMIN = "admin-" + "e" * 32
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
# What differs between two answers to the same request by design: ids, times, the node's text.
_VOLATILE = {"id", "created", "choices", "usage", "system_fingerprint", "object", "model", "data"}
_HEADERS = ("content-type", "retry-after", "allow", "www-authenticate", "connection", "location")


def _unused() -> None:
    """A dependency no route has: overriding it only switches the hot path off."""


def _shape(r: httpx.Response) -> tuple[Any, ...]:
    body: Any
    if r.headers.get("content-type", "").startswith("application/json"):
        doc = r.json()
        body = {k: v for k, v in doc.items() if k not in _VOLATILE} if isinstance(doc, dict) else doc
    elif r.headers.get("content-type", "").startswith("text/event-stream"):
        body = [line.split(":", 1)[0] for line in r.text.splitlines() if line]  # the event framing
    else:
        body = r.text
    return r.status_code, body, tuple(r.headers.get(h) for h in _HEADERS), "x-request-id" in r.headers


async def test_hot_routes_answer_as_the_router_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    guard = edge.openai_guard

    async def counting_guard(request: Request) -> None:
        taken.append(request.url.path)
        await guard(request)

    async with SimFleet(fast_specs(1)) as sim:
        fleet = fleet_for({n: node.url for n, node in sim.nodes.items()})
        settings = settings_for(
            tmp_path, fleet, admission=AdmissionSettings(auth=True, admin_key=ADMIN, redis_url=None)
        )
        async with running_gateway(settings, public=True) as (base, app), httpx.AsyncClient(base_url=base) as http:
            # After create_app: the router's dependency keeps the guard it was built with.
            monkeypatch.setattr(edge, "openai_guard", counting_guard)
            key = (
                await http.post("/admin/keys", json={"tenant": "t"}, headers={"authorization": f"Bearer {ADMIN}"})
            ).json()["key"]
            auth = {"authorization": f"Bearer {key}"}
            cases: dict[str, tuple[Callable[[], Awaitable[httpx.Response]], bool]] = {
                "chat (200)": (lambda: http.post("/v1/chat/completions", json=CHAT, headers=auth), True),
                "stream (200)": (
                    lambda: http.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth),
                    True,
                ),
                "completions (200)": (
                    lambda: http.post(
                        "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2}, headers=auth
                    ),
                    True,
                ),
                "no key (401)": (lambda: http.post("/v1/chat/completions", json=CHAT), True),
                "not JSON (415)": (
                    lambda: http.post(
                        "/v1/chat/completions", content=b"{}", headers={**auth, "content-type": "text/plain"}
                    ),
                    True,
                ),
                "malformed body (400)": (
                    lambda: http.post(
                        "/v1/chat/completions",
                        content=b'{"model":',
                        headers={**auth, "content-type": "application/json"},
                    ),
                    True,
                ),
                "no messages (400)": (
                    lambda: http.post("/v1/chat/completions", json={"model": "m"}, headers=auth),
                    True,
                ),
                "bad header (400)": (
                    lambda: http.post(
                        "/v1/chat/completions", json=CHAT, headers={**auth, "x-inferlb-deadline-ms": "soon"}
                    ),
                    True,
                ),
                "unknown model (404)": (
                    lambda: http.post("/v1/chat/completions", json={**CHAT, "model": "zz"}, headers=auth),
                    True,
                ),
                "wrong method (405)": (lambda: http.get("/v1/chat/completions", headers=auth), False),
                "trailing slash": (lambda: http.post("/v1/chat/completions/", json=CHAT, headers=auth), False),
            }
            for what, (send, hot) in cases.items():
                taken.clear()
                via_hot = await send()
                assert taken == ([via_hot.request.url.path] if hot else []), (what, taken)
                app.dependency_overrides[_unused] = _unused
                try:
                    taken.clear()
                    via_router = await send()
                    assert taken == [], (what, "the router path must not call the hot path's guard")
                finally:
                    app.dependency_overrides.clear()
                assert _shape(via_hot) == _shape(via_router), what
                if "(" in what:  # the status the case is named after
                    assert via_hot.status_code == int(what.rsplit("(", 1)[1][:3]), (what, via_hot.text)


def _calls(dependant: Any) -> set[Any]:
    """Every dependency callable of a FastAPI ``Dependant``, nested ones included."""
    found: set[Any] = set()
    for dep in dependant.dependencies:
        found.add(dep.call)
        found |= _calls(dep)
    return found


def test_hot_routes_skip_no_dependency_of_their_routes(tmp_path: Path) -> None:
    """``HotRoutes`` runs the guard and the gateway getter by hand; a dependency added to one of
    these routes would be skipped on the hot path, so this fails until ``HotRoutes`` runs it too."""
    from fastapi.routing import iter_route_contexts

    from inferlb.api.deps import get_gateway
    from inferlb.api.openai import HOT_ROUTES
    from inferlb.app import create_app

    fleet = fleet_for({"n0": "http://127.0.0.1:9"})
    app = create_app(settings_for(tmp_path, fleet))
    # the effective routes, included routers' dependencies merged (what the router would solve)
    routes = {c.path: c for c in iter_route_contexts(app.routes) if "POST" in (c.methods or ())}
    assert set(HOT_ROUTES) <= set(routes)
    for path, endpoint in HOT_ROUTES.items():
        route = routes[path]
        assert route.endpoint is endpoint, path
        assert _calls(route.dependant) == {edge.openai_guard, get_gateway}, path


class _App:
    """What ``HotRoutes`` reads of the app: its dependency overrides and exception handlers."""

    def __init__(self, handlers: dict[Any, Any] | None = None) -> None:
        self.dependency_overrides: dict[Any, Any] = {}
        self.exception_handlers: dict[Any, Any] = handlers or {}


def _hot(monkeypatch: pytest.MonkeyPatch, endpoint: Any, handlers: dict[Any, Any] | None = None
         ) -> tuple[edge.HotRoutes, dict[str, Any], list[dict[str, Any]], Any]:
    """A ``HotRoutes`` with one route, the guard and the gateway getter stubbed; returns it, a
    scope, the list the server's ``send`` appends to, and that ``send``."""
    async def passes(request: Request) -> None:
        return None

    async def gateway(request: Request) -> object:
        return object()

    async def router(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the hot route must take this request")

    monkeypatch.setattr(edge, "openai_guard", passes)
    monkeypatch.setattr(edge, "get_gateway", gateway)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [], "query_string": b"",
             "app": _App(handlers)}
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    return edge.HotRoutes(router, {"/v1/chat/completions": endpoint}), scope, sent, send


async def _never() -> dict[str, Any]:
    raise AssertionError("not read")


async def test_a_gateway_stream_gets_the_servers_send_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream naming its request id: every message reaches the server's ``send`` straight from
    the response (its caller is the response's ``stream_response``, no wrapper between), with the
    one id the gateway gave."""
    import sys

    from starlette.responses import StreamingResponse

    from inferlb.engine.streaming import WatchedStreamingResponse

    callers: list[str] = []

    async def events() -> Any:
        for i in range(3):
            yield b"data: %d\n\n" % i

    async def endpoint(request: Request, gw: object) -> StreamingResponse:
        return WatchedStreamingResponse(events(), media_type="text/event-stream", headers={"x-request-id": "rid-1"})

    hot, scope, sent, send = _hot(monkeypatch, endpoint)

    async def server_send(message: MutableMapping[str, Any]) -> None:
        callers.append(sys._getframe(1).f_code.co_qualname)
        await send(message)

    await hot({**scope, "asgi": {"version": "3.0", "spec_version": "2.4"}}, _never, server_send)
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 4
    assert [v for k, v in sent[0]["headers"] if k == b"x-request-id"] == [b"rid-1"]
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert set(callers) == {"WatchedStreamingResponse.stream_response"}, callers


async def test_an_error_after_a_stream_started_unwrapped_is_the_500_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream went out through the server's ``send``: whether it had started is read from the
    response, so a handled exception after the start is still starlette's ``RuntimeError``."""
    from inferlb.engine.streaming import WatchedStreamingResponse

    async def events() -> Any:
        yield b"data: 0\n\n"
        raise LookupError("mid-stream")

    async def endpoint(request: Request, gw: object) -> WatchedStreamingResponse:
        return WatchedStreamingResponse(events(), headers={"x-request-id": "rid-2"})

    async def handler(request: Request, exc: Exception) -> Any:
        raise AssertionError("no answer may follow a started one")

    hot, scope, sent, send = _hot(monkeypatch, endpoint, {LookupError: handler})
    with pytest.raises(RuntimeError, match="already started"):
        await hot({**scope, "asgi": {"version": "3.0", "spec_version": "2.4"}}, _never, send)
    assert sent[0]["type"] == "http.response.start"


async def test_an_answer_without_an_id_gets_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RequestIds``' rule, applied by ``HotRoutes`` to what it serves: a fresh id where the
    answer (a stream without one too) names none, the answer's own where it does."""
    from starlette.responses import Response

    from inferlb.engine.streaming import WatchedStreamingResponse

    async def one() -> Any:
        yield b"x"

    answers: list[Response] = [Response(b"{}", media_type="application/json"),
                               WatchedStreamingResponse(one()),
                               Response(b"{}", headers={"x-request-id": "mine"})]

    async def endpoint(request: Request, gw: object) -> Response:
        return answers.pop(0)

    hot, scope, sent, send = _hot(monkeypatch, endpoint)
    ids = []
    for _ in range(3):
        sent.clear()
        await hot({**scope, "asgi": {"version": "3.0", "spec_version": "2.4"}}, _never, send)
        ids.append([v for k, v in sent[0]["headers"] if k == b"x-request-id"])
    assert [len(i) for i in ids] == [1, 1, 1] and ids[2] == [b"mine"] and ids[0] != ids[1]


async def test_a_client_gone_while_its_body_was_read_ends_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ClientGone``'s rule, applied by ``HotRoutes``: a ``ClientDisconnect`` no handler takes
    ends the request with nothing sent and nothing raised."""
    from starlette.requests import ClientDisconnect

    async def endpoint(request: Request, gw: object) -> Any:
        raise ClientDisconnect()

    hot, scope, sent, send = _hot(monkeypatch, endpoint)
    await hot(scope, _never, send)
    assert sent == []
