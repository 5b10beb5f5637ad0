"""Two gateway replicas on one PostgreSQL (docs/replicas.md, "Tenant keys across replicas"): a key
created through one replica's admin API works on the other at once (the other looks an unknown
key up in the database before its 401), and a key revoked on one is refused by the other as soon
as the store's ``NOTIFY`` reloads its cache: the periodic reload is an hour here, so nothing else
could bring it. The same over a SQLite file for the create (no notification there)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferlb.config.admission import AdmissionSettings
from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.emulator import SimFleet
from inferlb.store.db import upgrade
from tests.support import fast_specs, running_gateway, settings_for

ADMIN = "admin-" + "r" * 32


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@contextlib.asynccontextmanager
async def two_replicas(tmp: Path, url: str) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, Any]]:
    """(client of replica A, client of replica B, B's app), both on the database ``url``."""
    async with SimFleet(fast_specs(1)) as sim:
        fleet = fleet_from_mapping({
            "models": [{"name": "m"}],
            "nodes": [{"name": n, "url": node.url, "models": ["m"]} for n, node in sim.nodes.items()],
            "health": {"interval_s": 3600},
            "admission": {"keys_refresh_s": 3600},    # only a notification can reload the cache mid-test
        })
        env = AdmissionSettings(auth=True, admin_key=ADMIN, redis_url=None)
        sa = settings_for(tmp / "a", fleet, database_url=url, admission=env)
        sb = settings_for(tmp / "b", fleet, database_url=url, admission=env)
        async with running_gateway(sa) as (base_a, _app_a), running_gateway(sb) as (base_b, app_b), \
                httpx.AsyncClient(base_url=base_a, timeout=10) as a, \
                httpx.AsyncClient(base_url=base_b, timeout=10) as b:
            yield a, b, app_b


async def _create(a: httpx.AsyncClient) -> dict[str, Any]:
    r = await a.post("/admin/keys", headers=_bearer(ADMIN), json={"tenant": "acme"})
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


@pytest.mark.postgres
async def test_a_key_created_and_revoked_on_one_replica_holds_on_the_other_at_once(
        tmp_path: Path, pg_migrated_url: str) -> None:
    async with two_replicas(tmp_path, pg_migrated_url) as (a, b, app_b):
        svc = app_b.state.admission_service
        assert svc.keys_watch is not None
        for _ in range(500):      # the listener's first connection (a hang guard, not a timing)
            if svc.keys_watch.listening:
                break
            await asyncio.sleep(0.02)
        assert svc.keys_watch.listening, svc.keys_watch.describe()
        created = await _create(a)
        r = await b.get("/v1/models", headers=_bearer(created["key"]))
        assert r.status_code == 200, r.text

        assert (await a.delete(f"/admin/keys/{created['id']}", headers=_bearer(ADMIN))).status_code == 200

        def revoked_on_b() -> bool:
            key = svc.ctl.keys.by_id.get(created["id"])
            return key is not None and key.revoked_at is not None

        for _ in range(500):      # B's cache reloads when the notification arrives (a hang guard)
            if revoked_on_b():
                break
            await asyncio.sleep(0.02)
        assert revoked_on_b(), "the revocation did not reach replica B"
        r = await b.get("/v1/models", headers=_bearer(created["key"]))
        assert r.status_code == 401, r.text


async def test_a_key_created_on_one_replica_works_on_the_other_over_a_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    upgrade(url)
    async with two_replicas(tmp_path, url) as (a, b, _app_b):
        created = await _create(a)
        r = await b.get("/v1/models", headers=_bearer(created["key"]))
        assert r.status_code == 200, r.text
        assert (await b.get("/v1/models", headers=_bearer("sk-gw-" + "x" * 43))).status_code == 401
