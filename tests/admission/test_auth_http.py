"""Tenant keys end to end over real HTTP with the real OpenAI SDK: 401/403/404/429, the admin API,
priority ceilings and the audit record (docs/reliability.md §7, S-01/S-02/S-06)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from inferlb.config.admission import AdmissionSettings
from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, running_gateway, settings_for

ADMIN = "admin-" + "x" * 32
MSG = [{"role": "user", "content": "hello"}]


def _fleet(urls: dict[str, str], admission: dict[str, Any] | None = None, price: float = 1.0) -> Any:
    return fleet_from_mapping({
        "models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8},
                   {"name": "emb", "kind": "embedding"}],
        "nodes": [{"name": n, "url": u, "models": ["m", "emb"], "price_per_hour": price} for n, u in urls.items()],
        "routing": {"profile": "round-robin", "seed": 1},
        "timeouts": {"connect_s": 1.0, "first_token_s": 2.0, "idle_s": 2.0, "total_s": 10.0},
        "admission": admission or {},
    })


@contextlib.asynccontextmanager
async def gateway(tmp: Path, *, auth: bool = True, admin: str | None = ADMIN, admission: dict[str, Any] | None = None,
                  price: float = 1.0, public: bool = False,
                  **over: Any) -> AsyncIterator[tuple[str, Any, httpx.AsyncClient]]:
    async with SimFleet(fast_specs(2)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        settings = settings_for(tmp, _fleet(urls, admission, price),
                                admission=AdmissionSettings(auth=auth, admin_key=admin, redis_url=None), **over)
        async with running_gateway(settings, public=public) as (base, app), \
                httpx.AsyncClient(base_url=base, timeout=10) as http:
            yield base, app, http


def sdk(base: str, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0)


def admin_headers(key: str = ADMIN) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def audit(app: Any, http: httpx.AsyncClient, rid: str) -> dict[str, Any]:
    await app.state.store.writer.flush_once(force=True)
    r = await http.get(f"/audit/requests/{rid}", headers=admin_headers())
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def test_auth_is_off_by_default_and_the_admin_plane_is_shut_on_the_public_listener(tmp_path: Path) -> None:
    """No key configured: the public listener serves the OpenAI routes to anyone and answers the
    admin routes 404, as for an unknown path (tests/api/test_admin_plane.py has the whole table)."""
    async with gateway(tmp_path, auth=False, admin=None, public=True) as (base, app, http):
        chat = await sdk(base, "unused").chat.completions.create(model="m", messages=MSG, max_tokens=2)
        assert chat.choices[0].message.content
        r = await http.post("/admin/keys", json={"tenant": "t"})
        assert r.status_code == 404 and r.json() == (await http.get("/no-such-path")).json(), r.text


async def test_keys_from_the_admin_api_guard_the_openai_routes(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (base, app, http):
        assert (await http.post("/admin/keys", json={"tenant": "acme"})).status_code == 401
        r = await http.post("/admin/keys", headers=admin_headers(),
                            json={"tenant": "acme", "name": "ci", "models": ["m"], "priority_ceiling": "interactive",
                                  "rpm": 3})
        assert r.status_code == 201, r.text
        created = r.json()
        key = created["key"]
        assert key.startswith("sk-gw-") and created["hint"] == key[:10] + "…" + key[-4:]

        # no key, a wrong key, a key in the SQL-injection shape: one 401, one envelope (S-06)
        for bad in ("sk-gw-" + "A" * 43, "' OR 1=1 --"):
            with pytest.raises(openai.AuthenticationError) as ei:
                await sdk(base, bad).chat.completions.create(model="m", messages=MSG, max_tokens=2)
            assert ei.value.status_code == 401
            body = ei.value.body
            assert body["code"] == "invalid_api_key" and body["message"] == "Incorrect API key provided"
        assert (await http.post("/v1/chat/completions", json={"model": "m", "messages": MSG})).status_code == 401

        client = sdk(base, key)
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=MSG, max_tokens=2, extra_headers={"x-inferlb-priority": "critical",
                                                                   "x-inferlb-tenant": "someone-else"})
        rec = await audit(app, http, raw.headers["x-request-id"])
        assert rec["tenant"] == "acme" and rec["priority"] == "interactive"      # the key's tenant and ceiling

        with pytest.raises(openai.NotFoundError):                                  # not one of the key's models
            await client.embeddings.create(model="emb", input=["x"])
        for _ in range(2):                                                         # the 404 took no request unit
            await client.chat.completions.create(model="m", messages=MSG, max_tokens=2)
        with pytest.raises(openai.RateLimitError) as rl:                           # rpm 3
            await client.chat.completions.create(model="m", messages=MSG, max_tokens=2)
        assert rl.value.response.headers["retry-after"] == "20"
        assert rl.value.body["code"] == "rate_limit_exceeded"

        # S-01: a tenant key on admin and audit routes is refused
        for path in ("/admin/keys", "/admin/fleet", "/audit/requests", "/admin/admission"):
            assert (await http.get(path, headers=admin_headers(key))).status_code == 403, path
        listed = (await http.get("/admin/keys", headers=admin_headers())).json()["data"]
        assert [k["id"] for k in listed] == [created["id"]]
        assert key not in str(listed) and "key_hash" not in listed[0]

        assert (await http.delete(f"/admin/keys/{created['id']}", headers=admin_headers())).status_code == 200
        with pytest.raises(openai.AuthenticationError) as revoked:
            await client.chat.completions.create(model="m", messages=MSG, max_tokens=2)
        assert revoked.value.body["message"] == "Incorrect API key provided"      # no hint that it existed
        assert (await http.delete("/admin/keys/key_nope", headers=admin_headers())).status_code == 404


async def test_bad_admin_input_is_400(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (base, app, http):
        for body in ({"tenant": "t", "priority_ceiling": "platinum"}, {"tenant": "t", "models": ["nope"]},
                     {"tenant": "t", "rpm": 0}, {"tenant": "t", "surprise": 1}):
            r = await http.post("/admin/keys", headers=admin_headers(), json=body)
            assert r.status_code == 400, (body, r.text)


async def test_failed_authentication_is_limited_per_address(tmp_path: Path) -> None:
    async with gateway(tmp_path, admission={"auth_failures_per_minute": 3}) as (base, app, http):
        codes = [(await http.post("/v1/chat/completions", headers={"authorization": "Bearer nope"},
                                  json={"model": "m", "messages": MSG})) for _ in range(4)]
        assert [c.status_code for c in codes] == [401, 401, 401, 429]
        assert codes[3].headers["retry-after"] == "20" and codes[3].json()["error"]["type"] == "rate_limit_error"


async def test_unknown_priority_class_is_400(tmp_path: Path) -> None:
    async with gateway(tmp_path, auth=False) as (base, app, http):
        r = await http.post("/v1/chat/completions", headers={"x-inferlb-priority": "platinum"},
                            json={"model": "m", "messages": MSG})
        assert r.status_code == 400 and r.json()["error"]["param"] == "x-inferlb-priority"


async def test_spent_budget_gives_insufficient_quota(tmp_path: Path) -> None:
    # 3600 per hour = 1 per second of node time: one request costs far more than the budget
    async with gateway(tmp_path, price=3600.0) as (base, app, http):
        r = await http.post("/admin/keys", headers=admin_headers(), json={"tenant": "t", "budget": 0.0001})
        client = sdk(base, r.json()["key"])
        await client.chat.completions.create(model="m", messages=MSG, max_tokens=4)
        with pytest.raises(openai.RateLimitError) as ei:
            await client.chat.completions.create(model="m", messages=MSG, max_tokens=4)
        assert ei.value.body["code"] == "insufficient_quota" and "retry-after" not in ei.value.response.headers
        await app.state.store.writer.flush_once(force=True)
        spent = (await http.get(f"/admin/keys/{r.json()['id']}", headers=admin_headers())).json()["spent"]
        assert spent == 0.0       # written to the database by the refresh loop, not on the request path
        await app.state.admission_service.refresh_keys()
        spent = (await http.get(f"/admin/keys/{r.json()['id']}", headers=admin_headers())).json()["spent"]
        assert spent > 0.0001


SCRAPE = "scrape-" + "z" * 32


def _code(r: httpx.Response) -> str | None:
    code: str | None = r.json()["error"]["code"]
    return code


async def test_metrics_and_dashboard_data_need_the_admin_key_when_auth_is_on(tmp_path: Path) -> None:
    async with gateway(tmp_path, metrics_token=SCRAPE) as (_base, _app, http):
        tenant = (await http.post("/admin/keys", headers=admin_headers(), json={"tenant": "acme"})).json()["key"]
        for path in ("/metrics", "/dashboard/node-states", "/reports/sla"):
            none = await http.get(path)
            assert none.status_code == 401 and "error" in none.json(), (path, none.text)
            wrong = await http.get(path, headers=admin_headers("not-a-key"))
            assert wrong.status_code == 401, (path, wrong.text)
            as_tenant = await http.get(path, headers=admin_headers(tenant))
            assert as_tenant.status_code == 403, (path, as_tenant.text)
            as_admin = await http.get(path, headers=admin_headers())
            assert as_admin.status_code == 200, (path, as_admin.text)
        # The scrape token reads /metrics and nothing else.
        scraped = await http.get("/metrics", headers=admin_headers(SCRAPE))
        assert scraped.status_code == 200 and "inferlb_requests_total" in scraped.text
        for path in ("/dashboard/node-states", "/reports/sla", "/audit/requests", "/admin/fleet"):
            assert (await http.get(path, headers=admin_headers(SCRAPE))).status_code == 401, path
        # The page and its assets hold no data: public, so the browser can load the sign-in form.
        page = await http.get("/dashboard")
        assert page.status_code == 200 and 'id="login"' in page.text
        assert (await http.get("/dashboard/assets/dashboard.js")).status_code == 200


async def test_metrics_with_auth_on_and_no_secret_configured_is_403(tmp_path: Path) -> None:
    async with gateway(tmp_path, admin=None) as (_base, _app, http):
        r = await http.get("/metrics", headers=admin_headers("anything"))
        assert r.status_code == 403 and _code(r) == "metrics_token_unset", r.text


async def test_auth_off_leaves_metrics_open_unless_a_scrape_token_is_set(tmp_path: Path) -> None:
    async with gateway(tmp_path, auth=False, admin=None) as (_base, _app, http):
        assert (await http.get("/metrics")).status_code == 200
        assert (await http.get("/dashboard/node-states")).status_code == 200
    (tmp_path / "token").mkdir()
    async with gateway(tmp_path / "token", auth=False, admin=None, metrics_token=SCRAPE) as (_base, _app, http):
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/metrics", headers=admin_headers(SCRAPE))).status_code == 200
        assert (await http.get("/dashboard/node-states")).status_code == 200
