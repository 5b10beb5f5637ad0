"""The autoscaler inside a real gateway over HTTP: the fleet file's autoscale: section starts the
runner (autoscale.bpmn on SpiffWorkflow), /admin/autoscale and /metrics show it, /reports/capacity
answers, and bad input gets the OpenAI error envelope (never a 500)."""

from __future__ import annotations

from pathlib import Path

import httpx

from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, fleet_for, running_gateway, settings_for


async def test_gateway_runs_rounds_and_serves_the_reports(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(2)) as sim:
        base = fleet_for({n: node.url for n, node in sim.nodes.items()}).model_dump(mode="json", exclude_none=True)
        for node in base["nodes"]:
            node["labels"] = {"gpu": "l4"}
        base["autoscale"] = {"interval_s": 3600, "step_s": 60, "season_s": 3600,
                             "pools": [{"model": "m", "gpu": "l4", "min": 1, "max": 3, "tokens_per_s": 100}]}
        settings = settings_for(tmp_path, fleet_from_mapping(base))
        async with running_gateway(settings) as (url, app):
            runner = app.state.autoscaler
            assert runner is not None and runner.process.mode == "spiff"
            data = await runner.run_once()
            assert data is not None and data["forecast"]["models"]["m"]["method"] == "reactive"
            async with httpx.AsyncClient(base_url=url) as c:
                st = (await c.get("/admin/autoscale")).json()
                assert st["rounds"] >= 1 and st["actuator"] == "dry-run" and st["points"][-1]["model"] == "m"
                metrics = (await c.get("/metrics")).text
                assert 'inferlb_autoscale_replicas{gpu="l4",kind="desired",model="m"}' in metrics
                rep = await c.get("/reports/capacity", params={"since": "1h"})
                assert rep.status_code == 200
                pools = [(r["model"], r["gpu"], r["nodes"]) for r in rep.json()["data"]]
                assert pools == [("emb", "l4", 2), ("m", "l4", 2)]
                bad = await c.get("/reports/capacity", params={"since": "yesterday-ish"})
                assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"
                bad_bucket = await c.get("/reports/capacity", params={"bucket": "-5m"})
                assert bad_bucket.status_code == 400 and "error" in bad_bucket.json()


async def test_admin_autoscale_is_404_when_off(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(1)) as sim:
        settings = settings_for(tmp_path, fleet_for({n: node.url for n, node in sim.nodes.items()}))
        async with running_gateway(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
            r = await c.get("/admin/autoscale")
            assert r.status_code == 404 and r.json()["error"]["code"] == "autoscale_off"


async def test_local_actuator_scales_through_the_live_node_admin(tmp_path: Path) -> None:
    """A node the autoscaler starts is an admin-added node (source admin, a node override every
    replica applies, loading until probed); scale-down is an admin drain, then an admin remove."""
    from inferlb.autoscale.planner import Plan, PoolDecision
    from inferlb.cli.autoscale import SimLauncher
    from inferlb.store.overrides import load_overrides

    def plan_of(cur: int, want: int) -> Plan:
        return Plan(0.0, (PoolDecision("m", "l4", cur, want, want, 0.0, 100.0, 1.0, "test"),), 0.0)

    async with SimFleet(fast_specs(1)) as sim:
        base = fleet_for({n: node.url for n, node in sim.nodes.items()}).model_dump(mode="json", exclude_none=True)
        for node in base["nodes"]:
            node["labels"] = {"gpu": "l4"}
        base["autoscale"] = {"interval_s": 3600, "step_s": 60, "season_s": 3600,
                             "pools": [{"model": "m", "gpu": "l4", "min": 1, "max": 3, "cold_start_s": 30,
                                        "tokens_per_s": 100}],
                             "actuator": {"kind": "local", "drain_timeout_s": 0}}
        settings = settings_for(tmp_path, fleet_from_mapping(base), overrides_poll_s=3600)
        launcher = SimLauncher()
        async with running_gateway(settings, node_launcher=launcher) as (url, app), \
                httpx.AsyncClient(base_url=url) as c:
            act, live, fleet = app.state.autoscaler.actuator, app.state.live, app.state.gateway.rt.fleet
            (up,) = await act.apply(plan_of(1, 2))
            assert up.ok and up.after == 2
            (name,) = [n for n in fleet.nodes if n.startswith("as-")]
            shown = {n["name"]: n for n in (await c.get("/admin/fleet")).json()["nodes"]}
            assert shown[name]["state"] == "loading" and shown[name]["source"] == "admin"
            _, rows = load_overrides(live.engine)
            assert [(o.name, o.source) for o in rows] == [(name, "admin")]       # every replica applies it
            assert name in [t.node for t in app.state.monitor.prober.targets]    # probed before it serves
            (down,) = await act.apply(plan_of(2, 1))
            assert down.ok and down.after == 1 and name not in fleet.nodes and name not in launcher.nodes
            _, rows = load_overrides(live.engine)
            assert rows == []
            assert live.last_change["kind"] == "remove" and live.last_change["by"] == "autoscaler"
            events = (await c.get("/admin/fleet/events", params={"node": name})).json()["events"]
            assert {"loading", "draining", "removed"} <= {e["to"] for e in events}, events
