"""``GET /dashboard/autoscale``: the autoscaling panel's data, without a browser.

The autoscaler (autoscale.bpmn on SpiffWorkflow, dry-run actuator) plays its rounds over the seeded
audit history with the app's clock injected; the panel's series must be the runner's points per
model, its ``actual`` the seeded tokens/s, its events the ``scaling_events`` rows. Autoscaling off:
the panel says so. Bad input: the OpenAI error envelope. Auth on: the admin key is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from inferlb.autoscale.panel import EVENT_FIELDS, autoscale_panel
from inferlb.autoscale.store import recent_scaling_events
from inferlb.config.admission import AdmissionSettings
from inferlb.store.db import make_engine, upgrade
from inferlb.types import ManualClock
from tests.observability import seed
from tests.support import running_gateway, settings_for


def test_panel_groups_points_by_model_and_aligns_pools() -> None:
    points = [
        {"at": 10.0, "model": "a", "actual": 5.0, "forecast": None, "method": "reactive", "capacity": 40.0,
         "replicas": {"l4": 1}},
        {"at": 10.0, "model": "b", "actual": 1.0, "forecast": 2.0, "method": "reactive", "capacity": 10.0,
         "replicas": {"l4": 1}},
        {"at": 20.0, "model": "a", "actual": 7.0, "forecast": 6.0, "method": "seasonal-naive", "capacity": 120.0,
         "replicas": {"l4": 1, "h100": 2}},
        {"at": 30.0, "model": "a", "actual": 9.0, "forecast": 8.0, "method": "seasonal-naive", "capacity": 80.0,
         "replicas": {"h100": 2}},
    ]
    event = {k: None for k in EVENT_FIELDS} | {"model": "a", "status": "dry_run", "detail": {"big": "x"}, "id": 7}
    out = autoscale_panel({"rounds": 3}, points, [event])
    assert out["enabled"] is True and out["status"] == {"rounds": 3}
    a, b = out["models"]
    assert a == {"model": "a", "method": "seasonal-naive", "t": [10.0, 20.0, 30.0], "forecast": [None, 6.0, 8.0],
                 "actual": [5.0, 7.0, 9.0], "capacity": [40.0, 120.0, 80.0],
                 "replicas": {"l4": [1, 1, None], "h100": [None, 2, 2]}}
    assert b["t"] == [10.0] and b["replicas"] == {"l4": [1]} and b["forecast"] == [2.0]
    assert out["events"] == [{k: event[k] for k in EVENT_FIELDS}]   # no detail, no id


def _tokens_per_s(model: str, since: float, until: float) -> float:
    """The seeded history's tokens/s of ``model`` in [since, until), computed from the records."""
    total = 0
    for r in seed.records():
        if r.model_requested == model and since <= r.received_at < until:
            prompt = r.prompt_tokens if r.prompt_tokens is not None else (r.prompt_tokens_est or 0)
            total += prompt + (r.completion_tokens or 0)
    return total / (until - since)


async def test_panel_data_over_http_after_rounds_over_the_seeded_history(db_url: str, tmp_path: Path) -> None:
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:   # the PostgreSQL schema is shared by the session
            conn.execute(text("DELETE FROM scaling_events"))
        seed.seed(engine)
        seed.settle_partitions(engine)
        clock = ManualClock(wall=seed.AUTOSCALE_FROM)
        settings = settings_for(tmp_path, seed.fleet(autoscale=True), database_url=db_url)
        async with running_gateway(settings, clock=clock) as (base, app), httpx.AsyncClient(base_url=base) as http:
            runner = app.state.autoscaler
            await seed.autoscale_rounds(runner, clock)
            resp = await http.get("/dashboard/autoscale")
            assert resp.status_code == 200, resp.text
            panel: dict[str, Any] = resp.json()
            admin = (await http.get("/admin/autoscale")).json()
            two = (await http.get("/dashboard/autoscale", params={"events": "2"})).json()
            for bad in ("0", "201", "many", "-1"):
                r = await http.get("/dashboard/autoscale", params={"events": bad})
                assert r.status_code == 400 and r.json()["error"]["param"] == "events", (bad, r.text)
        rows = recent_scaling_events(engine, limit=20)
    finally:
        engine.dispose()

    assert panel["enabled"] is True
    st = panel["status"]
    assert st["rounds"] == seed.ROUNDS and st["failed_rounds"] == 0 and st["actuator"] == "dry-run"
    assert st["forecaster"] == "seasonal-naive"
    rounds = [seed.AUTOSCALE_FROM + i * seed.ROUND_S for i in range(seed.ROUNDS)]
    assert [m["model"] for m in panel["models"]] == ["llama-3-8b", "qwen-14b"]
    for m in panel["models"]:
        # the runner's points (what /admin/autoscale gives), one per round, reshaped per model
        mine = [p for p in admin["points"] if p["model"] == m["model"]]
        assert m["t"] == rounds == [p["at"] for p in mine]
        for key in ("forecast", "actual", "capacity"):
            assert m[key] == [p[key] for p in mine], key
        for gpu, series in m["replicas"].items():
            assert series == [p["replicas"].get(gpu) for p in mine], gpu
        # what the observer read from the audit trail: the last complete 5-minute step
        assert m["actual"][-1] == pytest.approx(_tokens_per_s(m["model"], seed.END - seed.ROUND_S, seed.END), abs=1e-3)
        assert all(c is not None and c > 0 for c in m["capacity"])   # every pool has a prior capacity
        assert m["method"] == "seasonal-naive"      # 30 minutes of history (a season) by the first round
    llama = panel["models"][0]
    assert set(llama["replicas"]) == {"h100", "a100"} and set(panel["models"][1]["replicas"]) == {"a100"}
    assert min(llama["replicas"]["h100"]) >= 1    # the pool's min, never violated
    # the last scaling decisions, newest first, as the table has them (less the detail JSON)
    assert panel["events"] == [{k: r[k] for k in EVENT_FIELDS} for r in rows] and panel["events"]
    assert any(e["status"] == "dry_run" and e["to_replicas"] != e["from_replicas"] for e in panel["events"])
    ats = [e["at"] for e in panel["events"]]
    assert ats == sorted(ats, reverse=True) and ats[0] <= seed.END
    assert two["events"] == panel["events"][:2]


async def test_panel_says_autoscaling_is_off_and_wants_the_admin_key(tmp_path: Path) -> None:
    admin = "admin-" + "e" * 32
    db = f"sqlite:///{tmp_path / 'off.db'}"
    upgrade(db)
    settings = settings_for(tmp_path, seed.fleet(), database_url=db,
                            admission=AdmissionSettings(auth=True, admin_key=admin, redis_url=None))
    async with running_gateway(settings) as (base, _app), httpx.AsyncClient(base_url=base) as http:
        refused = await http.get("/dashboard/autoscale")
        off = await http.get("/dashboard/autoscale", headers={"authorization": f"Bearer {admin}"})
    assert refused.status_code == 401 and "error" in refused.json()
    assert off.status_code == 200
    assert off.json() == {"enabled": False,
                          "reason": "autoscaling is off: the fleet file has no (enabled) autoscale: section"}
