"""processes/autoscale.bpmn on real SpiffWorkflow, an injected clock, and the audit trail of a real
database (SQLite and PostgreSQL): one round's path and data, the scaling_events it leaves, the
fallback when history is short, the leader predicate, an actuator failing then retried."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from inferlb.autoscale.actuator import PoolResult
from inferlb.autoscale.actuator_dryrun import DryRunActuator
from inferlb.autoscale.observe import audit_observer
from inferlb.autoscale.planner import Plan
from inferlb.autoscale.policy import Autoscaler
from inferlb.autoscale.runner import AutoscaleRunner
from inferlb.autoscale.store import insert_scaling_events, recent_scaling_events
from inferlb.config.autoscale import AutoscaleConfig
from inferlb.config.settings import SLOConfig
from inferlb.tasks import AUTOSCALE_CONTRACT, SERVICES
from inferlb.types import ManualClock
from inferlb.workflow.definition import load_process
from tests.autoscale.conftest import T0, TOKENS, per_minute, seasonal_records, seed
from tests.support import ROOT

MAIN = ROOT / "processes" / "autoscale.bpmn"
NODES = {"n-l4-a": "l4", "n-l4-b": "l4"}
PATH = ["start", "observe", "forecast", "plan", "gw_changes", "actuate", "gw_record_merge", "record", "end"]


def config(**over: Any) -> AutoscaleConfig:
    base: dict[str, Any] = {
        "interval_s": 60, "step_s": 60, "season_s": 3600, "history_s": 3 * 3600, "forecaster": "seasonal-naive",
        "target_utilisation": 0.5, "scale_down_stabilisation_s": 0,
        "pools": [{"model": "m", "gpu": "l4", "min": 1, "max": 20, "cold_start_s": 120, "price_per_hour": 0.8,
                   "tokens_per_s": 50.0}]}
    base.update(over)
    return AutoscaleConfig.model_validate(base)


def runner_for(engine: Engine, cfg: AutoscaleConfig, clock: ManualClock, actuator: Any = None,
               path: Path = MAIN, leader: Any = None) -> AutoscaleRunner:
    process = load_process(path, SERVICES, engine="spiff", required=dict(AUTOSCALE_CONTRACT.required),
                           start_data=AUTOSCALE_CONTRACT.start_data)
    observe = audit_observer(engine, cfg, node_gpu=lambda: dict(NODES), slos=[SLOConfig(model="m", e2e_max_s=5.0)])
    kw: dict[str, Any] = {} if leader is None else {"leader": leader}
    return AutoscaleRunner(process=process, scaler=Autoscaler(cfg), actuator=actuator or DryRunActuator(cfg),
                           observe=observe, clock=clock, write=lambda rows: insert_scaling_events(engine, rows), **kw)


def busiest_node_minute(records: list[Any]) -> float:
    """The highest tokens/s one node served in one minute (every minute held the SLO)."""
    per: dict[tuple[str, int], int] = {}
    for rec in records:
        key = (rec.node, int((rec.received_at - T0) // 60))
        per[key] = per.get(key, 0) + TOKENS
    return max(per.values()) / 60.0


def expected_replicas(end_minute: int, cfg: AutoscaleConfig, cap: float) -> int:
    """What the planner must ask for: the seasonal-naive peak over the lead (cold start + one
    interval = 3 steps) one period earlier, against the observed last step, / 0.5, / capacity."""
    lead = [per_minute(end_minute + h - 60) for h in range(3)]
    last = per_minute(end_minute - 1)
    demand = max(max(lead), last) * TOKENS / 60.0
    return max(1, math.ceil(demand / cfg.target_utilisation / cap - 1e-9))


async def test_one_round_forecasts_plans_actuates_and_records(engine: Engine) -> None:
    recs = seasonal_records(180, NODES)
    seed(engine, recs)
    clock = ManualClock(wall=T0 + 180 * 60 + 5)
    cfg = config()
    r = runner_for(engine, cfg, clock)
    data = await r.run_once()
    await r.close()
    assert data is not None and r.process.mode == "spiff"
    assert r.last_round["path"] == PATH
    assert data["observed"]["points"] == 180 and data["observed"]["models"] == ["m"]
    assert data["forecast"]["models"]["m"]["method"] == "seasonal-naive"
    assert data["forecast"]["fallbacks"] == 0
    # never saturated and above the 50 tokens/s prior: the observed per-node peak, a lower bound
    cap = data["observed"]["capacity"][0]
    assert cap["source"] == "lower-bound" and cap["tokens_per_s"] == busiest_node_minute(recs)
    want = expected_replicas(180, cfg, cap["tokens_per_s"])
    assert data["plan"]["pools"][0]["desired"] == want and data["plan"]["changes"] == 1
    rows = recent_scaling_events(engine)
    assert [(e["status"], e["from_replicas"], e["to_replicas"], e["forecaster"]) for e in rows] == \
        [("dry_run", 1, want, "seasonal-naive")]
    assert rows[0]["round"] == 1 and rows[0]["at"] == clock.time()
    # the dashboard's series: forecast vs actual vs capacity
    point = r.points[-1]
    assert point["model"] == "m" and point["actual"] == round(per_minute(179) * TOKENS / 60, 3)
    assert point["capacity"] == round(want * cap["tokens_per_s"], 3)


async def test_a_second_round_without_change_skips_actuate(engine: Engine) -> None:
    seed(engine, seasonal_records(180, NODES))
    clock = ManualClock(wall=T0 + 180 * 60 + 5)
    r = runner_for(engine, config(), clock)
    await r.run_once()
    data = await r.run_once()      # same minute, same data: the plan is in place
    await r.close()
    assert data is not None and data["plan"]["changes"] == 0
    assert r.last_round["path"] == ["start", "observe", "forecast", "plan", "gw_changes", "gw_record_merge",
                                    "record", "end"]
    assert len(recent_scaling_events(engine)) == 1


async def test_too_little_history_falls_back_to_reactive_and_records_why(engine: Engine) -> None:
    seed(engine, seasonal_records(30, NODES))
    clock = ManualClock(wall=T0 + 30 * 60 + 5)
    r = runner_for(engine, config(history_s=1800), clock)
    data = await r.run_once()
    await r.close()
    assert data is not None and data["forecast"]["models"]["m"]["method"] == "reactive"
    fb = [e for e in recent_scaling_events(engine) if e["status"] == "fallback"]
    assert len(fb) == 1 and fb[0]["forecaster"] == "reactive"
    assert "needs one season (60 steps); history has 30" in fb[0]["reason"]


async def test_a_replica_that_is_not_the_leader_does_nothing(engine: Engine) -> None:
    seed(engine, seasonal_records(180, NODES))
    leader = {"me": False}
    r = runner_for(engine, config(), ManualClock(wall=T0 + 180 * 60 + 5), leader=lambda: leader["me"])
    assert await r.run_once() is None
    assert r.rounds == 0 and r.standby_rounds == 1 and recent_scaling_events(engine) == []
    leader["me"] = True
    assert await r.run_once() is not None
    await r.close()
    assert r.rounds == 1 and len(recent_scaling_events(engine)) == 1


class Flaky:
    """Raises on its first apply (an API down), then applies; never goes below min."""

    name = "flaky"

    def __init__(self, cfg: AutoscaleConfig) -> None:
        self.inner = DryRunActuator(cfg)
        self.calls = 0

    async def current(self) -> dict[tuple[str, str], int]:
        return await self.inner.current()

    async def apply(self, plan: Plan) -> list[PoolResult]:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("orchestrator unreachable")
        return await self.inner.apply(plan)

    async def close(self) -> None:
        return None


async def test_a_failing_actuator_is_recorded_and_the_next_round_retries(engine: Engine) -> None:
    seed(engine, seasonal_records(180, NODES))
    cfg = config()
    clock = ManualClock(wall=T0 + 180 * 60 + 5)
    act = Flaky(cfg)
    r = runner_for(engine, cfg, clock, actuator=act)
    first = await r.run_once()
    assert first is not None and first["actuation"]["ok"] is False
    assert "orchestrator unreachable" in first["actuation"]["error"]
    failed = recent_scaling_events(engine)
    assert [e["status"] for e in failed] == ["failed"] and "orchestrator unreachable" in failed[0]["reason"]
    clock.advance(1)
    second = await r.run_once()
    await r.close()
    assert second is not None and second["actuation"]["ok"] is True and second["plan"]["changes"] == 1
    statuses = [e["status"] for e in recent_scaling_events(engine)]
    assert statuses == ["applied", "failed"]      # newest first: the retry applied the same change
    assert r.actuation_failures == 1


async def test_rows_kept_when_the_database_is_away_and_written_next_round(engine: Engine) -> None:
    seed(engine, seasonal_records(180, NODES))
    cfg = config()
    clock = ManualClock(wall=T0 + 180 * 60 + 5)
    r = runner_for(engine, cfg, clock)
    calls = {"n": 0}

    def write(rows: list[dict[str, Any]]) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("database away")
        return insert_scaling_events(engine, rows)

    r.write = write
    await r.run_once()
    assert len(r.pending) == 1 and recent_scaling_events(engine) == []
    await r.run_once()
    await r.close()
    assert r.pending == [] and len(recent_scaling_events(engine)) == 1


async def test_a_lasting_fallback_is_recorded_once_not_every_round(engine: Engine) -> None:
    seed(engine, seasonal_records(30, NODES))
    clock = ManualClock(wall=T0 + 30 * 60 + 5)
    r = runner_for(engine, config(history_s=1800), clock)
    await r.run_once()
    clock.advance(60)
    await r.run_once()          # history 30 → still short: the same kind of fallback
    await r.close()
    assert [e["status"] for e in recent_scaling_events(engine)].count("fallback") == 1
