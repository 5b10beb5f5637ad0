"""``GET /dashboard/versions``: the versions and rollouts panel's data, without a browser.

A gateway on the seeded fleet with versions (llama-3-8b: v2 at 100, v3 at 0) runs rollouts started
through ``POST /admin/rollouts``: two aborted, one running that has played one round of
rollout.bpmn (on SpiffWorkflow; the app's clock injected, the round run by the test). The panel
must give the weights in force, the running rollout first then the ended ones latest first, each
with its last decision as the ``rollout_events`` table has it; ``limit`` bounds the ended ones
(bad values: the OpenAI error envelope). No versions: the panel says so. Auth on: the admin key
is needed. On SQLite and PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from inferlb.config.admission import AdmissionSettings
from inferlb.rollout.panel import ROLLOUT_FIELDS, VERSIONS_OFF_REASON, versions_panel
from inferlb.store.db import make_engine, upgrade
from inferlb.types import ManualClock
from tests.observability import seed
from tests.support import running_gateway, settings_for

SPEC = {"model": "llama-3-8b", "from_version": "v2", "to_version": "v3"}


def _row(rid: str, state: str, started: float, ended: float | None = None, **kw: Any) -> dict[str, Any]:
    return {"id": rid, "model": "m", "from_version": "a", "to_version": "b", "state": state, "step": 0,
            "percent": 10.0, "steps": [10.0, 100.0], "reason": None, "started_at": started, "ended_at": ended, **kw}


def test_panel_orders_running_first_then_latest_ended_and_prefers_the_live_rows() -> None:
    versions = [{"model": "m", "overridden": True, "file_weights": {"a": 100.0, "b": 0.0},
                 "versions": [{"name": "a", "weight": 90.0, "share": 0.9, "nodes": ["x"], "upstream_name": None},
                              {"name": "b", "weight": 10.0, "share": 0.1, "nodes": ["y"], "upstream_name": None}]}]
    live = [_row("r4", "running", 40.0, last_decision={"action": "hold", "reason": "too few", "checks": []})]
    stored = [_row("r4", "aborted", 40.0, 41.0),     # this gateway's state wins over the table's
              _row("r1", "completed", 10.0, 35.0), _row("r2", "aborted", 20.0, 25.0),
              _row("r3", "rolled_back", 30.0, 32.0)]
    last = {"r1": {"action": "complete", "reason": "b serves all", "at": 35.0, "from_percent": 50.0}}
    out = versions_panel(versions, live, stored, last, limit=2)
    assert out["enabled"] is True and "reason" not in out
    assert out["models"] == [{"model": "m", "overridden": True, "versions": [
        {"name": "a", "weight": 90.0, "share": 0.9}, {"name": "b", "weight": 10.0, "share": 0.1}]}]
    assert [(r["id"], r["state"]) for r in out["rollouts"]] == [("r4", "running"), ("r1", "completed"),
                                                                 ("r3", "rolled_back")]
    assert out["rollouts"][0]["last_decision"] == {"action": "hold", "reason": "too few", "at": None}
    assert out["rollouts"][1]["last_decision"] == {"action": "complete", "reason": "b serves all", "at": 35.0}
    assert out["rollouts"][2]["last_decision"] is None
    assert all(set(r) == {*ROLLOUT_FIELDS, "last_decision"} for r in out["rollouts"])
    assert versions_panel([], [], [], {}, limit=5) == {"enabled": False, "models": [], "rollouts": [],
                                                       "reason": VERSIONS_OFF_REASON}


async def test_panel_data_over_http_with_rollouts_started_through_the_admin_api(db_url: str, tmp_path: Path) -> None:
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:   # the PostgreSQL schema is shared by the session
            conn.execute(text("DELETE FROM rollout_events"))
            conn.execute(text("DELETE FROM rollouts"))
    finally:
        engine.dispose()
    clock = ManualClock(wall=seed.END)
    settings = settings_for(tmp_path, seed.fleet(versions=True), database_url=db_url)
    async with running_gateway(settings, clock=clock) as (base, app), httpx.AsyncClient(base_url=base) as http:
        before = (await http.get("/dashboard/versions")).json()
        ended = []
        for _ in range(2):
            r = await http.post("/admin/rollouts", json=SPEC)
            assert r.status_code == 201, r.text
            clock.advance(60)
            a = await http.post(f"/admin/rollouts/{r.json()['id']}/abort")
            assert a.status_code == 200 and a.json()["state"] == "aborted", a.text
            ended.append(a.json())
            clock.advance(60)
        r = await http.post("/admin/rollouts", json={**SPEC, "steps": [10, 50, 100]})
        assert r.status_code == 201, r.text
        running = r.json()
        clock.advance(60)
        await app.state.rollouts.run_once()      # one round of rollout.bpmn: too few requests, it holds
        resp = await http.get("/dashboard/versions")
        assert resp.status_code == 200, resp.text
        panel: dict[str, Any] = resp.json()
        one = (await http.get("/dashboard/versions", params={"limit": "1"})).json()
        admin = (await http.get("/admin/rollouts")).json()
        events = (await http.get(f"/admin/rollouts/{running['id']}")).json()["events"]
        for bad in ("0", "101", "many", "-1", "2.5"):
            b = await http.get("/dashboard/versions", params={"limit": bad})
            assert b.status_code == 400 and b.json()["error"]["param"] == "limit", (bad, b.text)

    assert before["enabled"] is True and before["rollouts"] == []
    assert before["models"] == [{"model": "llama-3-8b", "overridden": False, "versions": [
        {"name": "v2", "weight": 100.0, "share": 1.0}, {"name": "v3", "weight": 0.0, "share": 0.0}]}]
    # the weights in force: the running rollout's first step (10 % to v3), as the admin API has them
    assert panel["models"] == [{"model": "llama-3-8b", "overridden": True, "versions": [
        {"name": "v2", "weight": 90.0, "share": 0.9}, {"name": "v3", "weight": 10.0, "share": 0.1}]}]
    assert [{"model": m["model"], "overridden": m["overridden"],
             "versions": [{k: v[k] for k in ("name", "weight", "share")} for v in m["versions"]]}
            for m in admin["versions"]] == panel["models"]
    # running first, then the ended ones, the latest ended first
    ids = [r["id"] for r in panel["rollouts"]]
    assert ids == [running["id"], ended[1]["id"], ended[0]["id"]]
    cur = panel["rollouts"][0]
    assert cur["state"] == "running" and cur["percent"] == 10.0 and cur["step"] == 0
    assert cur["steps"] == [10.0, 50.0, 100.0] and cur["ended_at"] is None
    assert cur["started_at"] == pytest.approx(seed.END + 240)
    assert events[-1]["action"] == "hold" and events[-1]["reason"]
    assert cur["last_decision"] == {"action": "hold", "reason": events[-1]["reason"], "at": events[-1]["at"]}
    for row, ab in zip(panel["rollouts"][1:], reversed(ended), strict=True):
        assert row["state"] == "aborted" and row["percent"] == 0.0 and row["reason"] == "aborted by an operator"
        assert row["started_at"] == pytest.approx(ab["started_at"]) and row["ended_at"] == pytest.approx(ab["ended_at"])
        assert row["ended_at"] - row["started_at"] == pytest.approx(60)
        assert row["last_decision"]["action"] == "abort"
        assert row["last_decision"]["reason"] == "aborted by an operator"
    assert [r["id"] for r in one["rollouts"]] == ids[:2]


async def test_panel_says_there_are_no_versions_and_wants_the_admin_key(tmp_path: Path) -> None:
    admin = "admin-" + "v" * 32
    db = f"sqlite:///{tmp_path / 'plain.db'}"
    upgrade(db)
    settings = settings_for(tmp_path, seed.fleet(), database_url=db,
                            admission=AdmissionSettings(auth=True, admin_key=admin, redis_url=None))
    async with running_gateway(settings) as (base, _app), httpx.AsyncClient(base_url=base) as http:
        refused = await http.get("/dashboard/versions")
        off = await http.get("/dashboard/versions", headers={"authorization": f"Bearer {admin}"})
    assert refused.status_code == 401 and "error" in refused.json()
    assert off.status_code == 200
    assert off.json() == {"enabled": False, "models": [], "rollouts": [], "reason": VERSIONS_OFF_REASON}
