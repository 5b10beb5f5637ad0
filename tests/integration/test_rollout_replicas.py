"""Two gateway replicas on one database (a SQLite file, and PostgreSQL), over real HTTP with the
real OpenAI SDK: a rollout started on one replica is served with the same split by the other after
its live-config poll (called by the test: ``LiveConfig.sync_once`` is what the poll runs every
``INFERLB_OVERRIDES_POLL_S``, so nothing sleeps; on PostgreSQL the revision's ``NOTIFY`` wakes the
replica's own poll at once, which may get there first), the same user gets the same version from both,
only the leader decides steps, and an abort sent to the other replica reaches the leader the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from openai import AsyncOpenAI

from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import NodeSpec
from tests.support import running_gateway, settings_for

CRITERIA = {"min_requests": 20, "min_step_s": 0, "window_s": 600, "max_step_s": 3600}
USERS = [f"user-{i}" for i in range(100)]


def _fleet(urls: dict[str, str]) -> Any:
    return fleet_from_mapping({
        "models": [{"name": "m", "max_output_tokens": 64, "default_max_tokens": 4,
                    "versions": [{"name": "v1", "weight": 100, "nodes": ["n0", "n1"]},
                                 {"name": "v2", "weight": 0, "nodes": ["n2", "n3"], "upstream_name": "m-v2"}]}],
        "nodes": [{"name": n, "url": u, "models": ["m"]} for n, u in urls.items()],
        "routing": {"profile": "least-connections", "seed": 1},
        "timeouts": {"connect_s": 1.0, "first_token_s": 5.0, "idle_s": 5.0, "total_s": 20.0},
        "rollouts": {"interval_s": 3600, "steps": [10, 50, 100], "criteria": CRITERIA},
    })


async def served(base: str) -> dict[str, str]:
    """The model name each user's request was served as (``m`` for v1, ``m-v2`` for v2)."""
    async with AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=20) as client:
        out = {}
        for user in USERS:
            r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=2, user=user)
            out[user] = r.model
        return out


def shares(app: Any) -> dict[str, float]:
    mv = app.state.gateway.rt.versions.get("m")
    assert mv is not None
    result: dict[str, float] = mv.shares()
    return result


async def test_a_rollout_on_one_replica_is_served_alike_by_the_other_after_its_poll(
        tmp_path: Path, shared_db_url: str) -> None:
    specs = [NodeSpec(name=f"n{i}", models=["m", "m-v2"], base_ttft_s=0.002, tpot_s=0.0005) for i in range(4)]
    async with SimFleet(specs) as sim:
        fleet = _fleet({n: node.url for n, node in sim.nodes.items()})
        sa = settings_for(tmp_path, fleet, database_url=shared_db_url, overrides_poll_s=3600,
                          journal_dir=tmp_path / "ja")
        sb = settings_for(tmp_path, fleet, database_url=shared_db_url, overrides_poll_s=3600,
                          journal_dir=tmp_path / "jb")
        sqlite = shared_db_url.startswith("sqlite")   # PostgreSQL: NOTIFY may have a replica follow first
        async with running_gateway(sa) as (base_a, app_a), \
                running_gateway(sb, leader=lambda: False) as (base_b, app_b), \
                httpx.AsyncClient(base_url=base_a, timeout=20) as ha, \
                httpx.AsyncClient(base_url=base_b, timeout=20) as hb:
            assert set((await served(base_b)).values()) == {"m"}
            r = await ha.post("/admin/rollouts", json={"model": "m", "from_version": "v1", "to_version": "v2"})
            assert r.status_code == 201, r.text
            rid = r.json()["id"]
            assert shares(app_a) == {"v1": 0.9, "v2": 0.1}
            if sqlite:   # on PostgreSQL the NOTIFY may have let B follow already
                assert shares(app_b) == {"v1": 1.0, "v2": 0.0}
            changed = await app_b.state.live.sync_once()                  # B's poll
            if sqlite:
                assert changed
            assert shares(app_b) == shares(app_a)
            on_a, on_b = await served(base_a), await served(base_b)
            assert on_a == on_b and set(on_b.values()) == {"m", "m-v2"}   # same users, same versions
            doc = (await hb.get("/admin/rollouts")).json()
            assert doc["manager"]["leader"] is False
            assert [(x["id"], x["state"], x["percent"]) for x in doc["data"]] == [(rid, "running", 10.0)]
            assert await app_b.state.rollouts.run_once() == []            # B never decides a step
            # An abort sent to B: written first, then A's poll follows it.
            r = await hb.post(f"/admin/rollouts/{rid}/abort")
            assert r.status_code == 200 and r.json()["state"] == "aborted", r.text
            assert shares(app_b) == {"v1": 1.0, "v2": 0.0}
            if sqlite:
                assert shares(app_a) == {"v1": 0.9, "v2": 0.1}
            changed = await app_a.state.live.sync_once()                  # A's poll
            if sqlite:
                assert changed
            assert shares(app_a) == {"v1": 1.0, "v2": 0.0}
            assert not app_a.state.rollouts.get(rid).running
            assert set((await served(base_a)).values()) == {"m"}
            assert not await app_a.state.live.sync_once()                 # nothing new: one revision read
