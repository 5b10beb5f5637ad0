"""The admin plane is shut by default: every route × auth × admin key × credential × listener, from one table.

One real gateway per (``INFERLB_AUTH``, ``INFERLB_ADMIN_KEY`` set or not), served by
``build_server`` on two loopback listeners (public and admin: real sockets, real HTTP). Every route
of the app's router is asked with no key, a wrong key, a tenant key and the admin key on both
listeners, and the outcome is compared with :func:`expected`, which reads the route's class from
:data:`ROUTES`. The routes are enumerated from the app, so a route without an entry fails the test
(and an entry without a route does too). Outcomes:

* ``ok``: past the guard (whatever the handler then answers, as long as it is not a 5xx);
* ``401`` / ``403``: the guard's refusals, in the OpenAI envelope;
* ``404``: hidden, the same answer as an unknown path.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from inferlb.app import create_app
from inferlb.config.admission import AdmissionSettings
from inferlb.config.settings import FleetConfig, Settings, fleet_from_mapping
from inferlb.server import build_server
from inferlb.server.listeners import admin_address, describe_admin
from tests.support import free_port, settings_for

ADMIN = "admin-" + "m" * 32
WRONG = "sk-gw-" + "w" * 43

Class = Literal["open", "openai", "admin", "metrics", "docs"]
Cred = Literal["none", "wrong", "tenant", "admin"]
Outcome = Literal["ok", "401", "403", "404"]
CREDS: tuple[Cred, ...] = ("none", "wrong", "tenant", "admin")
LISTENERS = ("public", "admin")
KEYED: dict[Cred, Outcome] = {"admin": "ok", "tenant": "403", "none": "401", "wrong": "401"}   # an admin key set

# Every route of the app, by class. A new route must be added here (the test says which is missing).
ROUTES: dict[tuple[str, str], Class] = {
    ("POST", "/v1/chat/completions"): "openai",
    ("POST", "/v1/completions"): "openai",
    ("POST", "/v1/embeddings"): "openai",
    ("POST", "/v1/responses"): "openai",
    ("POST", "/v1/predict/{model}"): "openai",
    ("GET", "/v1/models"): "openai",
    ("GET", "/v1/models/{model}"): "openai",
    ("GET", "/healthz"): "open",
    ("GET", "/health"): "open",
    ("GET", "/readyz"): "open",
    ("GET", "/dashboard"): "open",
    ("GET", "/dashboard/assets/{name}"): "open",
    ("GET", "/metrics"): "metrics",
    ("GET", "/openapi.json"): "docs",
    ("GET", "/docs"): "docs",
    ("GET", "/audit/requests"): "admin",
    ("GET", "/audit/requests/{request_id}"): "admin",
    ("GET", "/reports/sla"): "admin",
    ("GET", "/reports/cost"): "admin",
    ("GET", "/reports/capacity"): "admin",
    ("GET", "/admin/fleet"): "admin",
    ("GET", "/admin/fleet/events"): "admin",
    ("POST", "/admin/reload"): "admin",
    ("POST", "/admin/nodes"): "admin",
    ("POST", "/admin/nodes/{name}/drain"): "admin",
    ("POST", "/admin/nodes/{name}/undrain"): "admin",
    ("PATCH", "/admin/nodes/{name}"): "admin",
    ("DELETE", "/admin/nodes/{name}"): "admin",
    ("POST", "/admin/rollouts"): "admin",
    ("GET", "/admin/rollouts"): "admin",
    ("GET", "/admin/rollouts/{rollout_id}"): "admin",
    ("POST", "/admin/rollouts/{rollout_id}/abort"): "admin",
    ("GET", "/admin/tiers"): "admin",
    ("POST", "/admin/tiers/explain"): "admin",
    ("GET", "/admin/autoscale"): "admin",
    ("POST", "/admin/keys"): "admin",
    ("GET", "/admin/keys"): "admin",
    ("GET", "/admin/keys/{key_id}"): "admin",
    ("DELETE", "/admin/keys/{key_id}"): "admin",
    ("GET", "/admin/admission"): "admin",
    ("GET", "/dashboard/node-states"): "admin",
    ("GET", "/dashboard/autoscale"): "admin",
    ("GET", "/dashboard/versions"): "admin",
    ("GET", "/dashboard/lora"): "admin",
    ("GET", "/dashboard/kv-events"): "admin",
}


def admin_rule(admin_set: bool, listener: str, cred: Cred) -> Outcome:
    """The admin plane: the admin key wherever one is set; else the admin listener only, keyless."""
    if not admin_set:
        return "ok" if listener == "admin" else "404"
    return KEYED[cred]


def expected(cls: Class, *, auth: bool, admin_set: bool, listener: str, cred: Cred,
             public_docs: bool = False) -> Outcome:
    """The table: what a route of class ``cls`` answers (module docstring)."""
    if cls == "open":
        return "ok"
    if cls == "openai":    # tenant keys while auth is on, on either listener
        return "ok" if not auth or cred == "tenant" else "401"
    if cls == "metrics":   # unchanged: open while auth is off (no scrape token here); else the admin key
        if not auth:
            return "ok"
        if not admin_set:
            return "403"    # metrics_token_unset, whatever is sent
        return KEYED[cred]
    if cls == "docs" and (not auth or public_docs):
        return "ok"
    return admin_rule(admin_set, listener, cred)


def _routes(app: Any) -> set[tuple[str, str]]:
    """(method, path template) of every route of ``app``, included routers flattened."""
    try:    # FastAPI >= 0.13x keeps included routers nested (api/edge.py reads them the same way)
        from fastapi.routing import iter_route_contexts
    except ImportError:   # older FastAPI: app.routes is already flat
        return {(m, r.path) for r in app.routes for m in getattr(r, "methods", None) or ()}
    return {(m, str(ctx.path)) for ctx in iter_route_contexts(app.routes) for m in ctx.methods or ()}


def _fleet(url: str) -> FleetConfig:
    return fleet_from_mapping({
        "models": [{"name": "m"}],
        "nodes": [{"name": "n0", "url": url, "models": ["m"]}],
        # the matrix sends hundreds of wrong keys from one address: keep the per-address limit out of it
        "admission": {"auth_failures_per_minute": 1_000_000},
    })


@contextlib.asynccontextmanager
async def two_listeners(settings: Settings) -> AsyncIterator[tuple[str, str]]:
    """(public base URL, admin base URL) of ``build_server`` with its admin listener."""
    app = create_app(settings)
    address = admin_address(settings)
    assert address is not None
    server = build_server(app, settings, admin=address, log_level="warning")
    task = asyncio.create_task(server.serve())
    for _ in range(1000):   # bounded: start-up
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    assert server.started, "gateway did not start"
    try:
        yield f"http://127.0.0.1:{settings.port}", f"http://{address[0]}:{address[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


def _settings(tmp: Path, *, auth: bool, admin_set: bool, **over: object) -> Settings:
    port = free_port()
    # a node nobody answers: no route here needs one to work, and none is probed into the answers
    return settings_for(tmp, _fleet(f"http://127.0.0.1:{free_port()}"),
                        host="127.0.0.1", port=port, admin_port=free_port(),
                        admission=AdmissionSettings(auth=auth, admin_key=ADMIN if admin_set else None,
                                                    redis_url=None), **over)


async def _tenant_key(admin_base: str, admin_set: bool) -> str:
    headers = {"authorization": f"Bearer {ADMIN}"} if admin_set else {}
    async with httpx.AsyncClient(base_url=admin_base, timeout=10) as http:
        r = await http.post("/admin/keys", json={"tenant": "acme"}, headers=headers)
    assert r.status_code == 201, r.text
    key: str = r.json()["key"]
    return key


def _outcome(r: httpx.Response, unknown: httpx.Response) -> Outcome:
    assert r.status_code < 500, (r.request.method, r.request.url, r.status_code, r.text)
    if r.status_code in (401, 403) or (r.status_code == 404 and r.content == unknown.content):
        body = r.json()
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, r.text
        return "401" if r.status_code == 401 else "403" if r.status_code == 403 else "404"
    return "ok"


async def _matrix(tmp: Path, *, auth: bool, admin_set: bool, public_docs: bool = False) -> list[str]:
    """Every route × credential × listener of one gateway; the rows that differ from the table."""
    settings = _settings(tmp, auth=auth, admin_set=admin_set, public_docs=public_docs)
    app_routes = _routes(create_app(settings))
    assert app_routes == set(ROUTES), (f"routes without an entry: {sorted(app_routes - set(ROUTES))}; "
                                       f"entries without a route: {sorted(set(ROUTES) - app_routes)}")
    wrong: list[str] = []
    async with two_listeners(settings) as (public, admin):
        tenant = await _tenant_key(admin, admin_set)
        secrets: dict[Cred, str | None] = {"none": None, "wrong": WRONG, "tenant": tenant, "admin": ADMIN}
        for listener, base in zip(LISTENERS, (public, admin), strict=True):
            async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                unknown = await http.get("/no-such-path")
                assert unknown.status_code == 404
                for (method, template), cls in sorted(ROUTES.items()):
                    path = re.sub(r"\{[^}]+\}", "nope", template)
                    for cred in CREDS:
                        secret = secrets[cred]
                        headers = {"authorization": f"Bearer {secret}"} if secret else {}
                        body: dict[str, Any] | None = {} if method in ("POST", "PATCH") else None
                        r = await http.request(method, path, headers=headers, json=body)
                        got = _outcome(r, unknown)
                        want = expected(cls, auth=auth, admin_set=admin_set, listener=listener, cred=cred,
                                        public_docs=public_docs)
                        if got != want:
                            wrong.append(f"{method} {template} [{listener}, {cred}]: {want} expected, got {got} "
                                         f"({r.status_code} {r.text[:120]})")
    return wrong


@pytest.mark.parametrize("admin_set", [False, True], ids=["no-admin-key", "admin-key"])
@pytest.mark.parametrize("auth", [False, True], ids=["auth-off", "auth-on"])
async def test_every_route_answers_as_the_table_says(tmp_path: Path, auth: bool, admin_set: bool) -> None:
    wrong = await _matrix(tmp_path, auth=auth, admin_set=admin_set)
    assert not wrong, "\n".join(wrong)


async def test_public_docs_opens_the_docs_while_auth_is_on(tmp_path: Path) -> None:
    """``INFERLB_PUBLIC_DOCS``: /docs and /openapi.json answer anyone; the admin plane stays shut."""
    wrong = await _matrix(tmp_path, auth=True, admin_set=False, public_docs=True)
    assert not wrong, "\n".join(wrong)


def test_the_table_itself() -> None:
    """The rules the matrix holds the gateway to, spelled out for the cases the issue names."""
    # an admin key set: required whatever INFERLB_AUTH says, on both listeners
    for auth in (False, True):
        for listener in LISTENERS:
            got = [expected("admin", auth=auth, admin_set=True, listener=listener, cred=c) for c in CREDS]
            assert got == ["401", "401", "403", "ok"]
    # no admin key: the admin listener serves it, the public one hides it
    assert {expected("admin", auth=a, admin_set=False, listener="admin", cred=c)
            for a in (False, True) for c in CREDS} == {"ok"}
    assert {expected("admin", auth=a, admin_set=False, listener="public", cred=c)
            for a in (False, True) for c in CREDS} == {"404"}


# -- the admin address and the start-up line ---------------------------------------------------------


def test_the_admin_port_defaults_to_the_public_port_plus_one_on_loopback() -> None:
    assert admin_address(Settings(port=8080)) == ("127.0.0.1", 8081)
    assert admin_address(Settings(port=8080, admin_port=9901)) == ("127.0.0.1", 9901)
    assert admin_address(Settings(port=8080, admin_port=0)) is None
    assert admin_address(Settings(port=0)) is None


def test_an_admin_listener_open_to_the_network_without_a_key_is_refused() -> None:
    from inferlb.errors import ConfigError

    with pytest.raises(ConfigError, match="INFERLB_ADMIN_KEY"):
        admin_address(Settings(admin_host="0.0.0.0"))
    keyed = Settings(admin_host="0.0.0.0", admission=AdmissionSettings(admin_key=ADMIN, redis_url=None))
    assert admin_address(keyed) == ("0.0.0.0", 8081)
    with pytest.raises(ConfigError, match="public listener's port"):
        admin_address(Settings(port=8080, admin_port=8080))


def test_the_start_up_line_says_where_the_admin_routes_are() -> None:
    line = describe_admin(Settings(), ("127.0.0.1", 8081))
    assert "http://127.0.0.1:8081 only" in line and "404" in line
    keyed = Settings(admission=AdmissionSettings(admin_key=ADMIN, redis_url=None))
    assert "INFERLB_ADMIN_KEY required" in describe_admin(keyed, ("127.0.0.1", 8081))
    assert ADMIN not in describe_admin(keyed, ("127.0.0.1", 8081))
    assert "off" in describe_admin(Settings(admin_port=0), None)
