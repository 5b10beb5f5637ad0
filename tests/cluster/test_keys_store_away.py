"""The database away: the key cache keeps serving tenants for ``admission.keys_max_stale_s`` after
its last load (no client request fails because the store blinked), then answers 503
``keys_unavailable`` (a revoked key must not live for ever), and serves again once it reloads.
A real gateway over HTTP; the "database away" is a real engine that cannot open its file; the
cache's age is moved by back-dating its last load (the gateway's own clock keeps running, so its
node-health samples stay fresh)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from inferlb.errors import StoreError
from inferlb.store.db import make_engine
from tests.admission.test_auth_http import ADMIN, MSG, _fleet, admin_headers, sdk
from tests.support import fast_specs, running_gateway, settings_for


async def test_keys_served_from_a_bounded_cache_while_the_database_is_away(tmp_path: Path) -> None:
    from inferlb.config.admission import AdmissionSettings
    from inferlb.simulator.emulator import SimFleet

    async with SimFleet(fast_specs(2)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        settings = settings_for(tmp_path, _fleet(urls, {"keys_max_stale_s": 300}),
                                admission=AdmissionSettings(auth=True, admin_key=ADMIN, redis_url=None))
        async with running_gateway(settings) as (base, app):
            import httpx

            async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                r = await http.post("/admin/keys", headers=admin_headers(), json={"tenant": "acme"})
                key = r.json()["key"]
            client = sdk(base, key)
            svc = app.state.admission_service
            good = svc.engine
            dead = make_engine(f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}")
            try:
                svc.engine = dead
                svc.keys_loaded_at -= 200                 # loaded 200 s ago
                with pytest.raises(StoreError):
                    await svc.refresh_keys()
                assert (await client.chat.completions.create(model="m", messages=MSG, max_tokens=2)).choices
                svc.keys_loaded_at -= 101                 # 301 s since the last load: past the bound
                with pytest.raises(StoreError):
                    await svc.refresh_keys()
                with pytest.raises(openai.APIStatusError) as ei:
                    await client.chat.completions.create(model="m", messages=MSG, max_tokens=2)
                assert ei.value.status_code == 503
                assert ei.value.body["code"] == "keys_unavailable"          # type: ignore[index]
                assert ei.value.response.headers["retry-after"] == "5"
                svc.engine = good                         # the database is back
                await svc.refresh_keys()
                assert (await client.chat.completions.create(model="m", messages=MSG, max_tokens=2)).choices
            finally:
                svc.engine = good
                dead.dispose()


async def test_a_single_gateway_always_leads(tmp_path: Path) -> None:
    from inferlb.app import leader, leadership
    from inferlb.simulator.emulator import SimFleet

    async with SimFleet(fast_specs(1)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        async with running_gateway(settings_for(tmp_path, _fleet(urls))) as (_base, app):
            assert leader(app) and leadership(app).status()["mode"] == "single"
            assert getattr(app.state, "cluster", None) is None
    assert not leader(app)        # after shutdown nothing leads
