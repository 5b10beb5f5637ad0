"""A rollout rig with an injected clock: fleet, version table, window, manager running the real
``processes/rollout.bpmn`` on SpiffWorkflow, and synthetic finished requests fed to the window."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from inferlb.config.rollout import RolloutConfig, RolloutSpec
from inferlb.config.settings import FleetConfig, fleet_from_mapping
from inferlb.rollout.manager import RolloutManager
from inferlb.rollout.window import VersionWindow
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.tasks import ROLLOUT_CONTRACT, SERVICES
from inferlb.types import ManualClock
from inferlb.versions.table import VersionTable
from inferlb.workflow.definition import load_process
from tests.support import ROOT

MAIN = ROOT / "processes" / "rollout.bpmn"


def fleet(**rollouts: Any) -> FleetConfig:
    return fleet_from_mapping({
        "models": [{"name": "m", "versions": [{"name": "v1", "weight": 100, "nodes": ["a", "b"]},
                                              {"name": "v2", "weight": 0, "nodes": ["c"], "upstream_name": "m-v2"}]}],
        "nodes": [{"name": n, "url": f"http://127.0.0.1:{9000 + i}", "models": ["m"]} for i, n in enumerate("abc")],
        "slos": [{"model": "m", "e2e_max_s": 1.0, "ttft_max_s": 0.5}],
        "rollouts": rollouts,
    })


@dataclass
class Rig:
    clock: ManualClock
    cfg: FleetConfig
    versions: VersionTable
    window: VersionWindow
    manager: RolloutManager
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    served: dict[str, int] = field(default_factory=dict)
    n: int = 0

    def feed(self, count: int, *, errors: dict[str, float] | None = None, e2e: dict[str, float] | None = None,
             node_ttft: dict[str, float] | None = None, users: int = 2000) -> None:
        """``count`` finished requests from ``users`` users; ``errors``: version → failure rate of
        its attempts (a failed attempt is retried once on v1, as the gateway's version fallback
        does); ``e2e``: version → end-to-end seconds (default 0.2); ``node_ttft``: version →
        median node time to the first byte of the served attempt (lognormal, the logs' standard
        deviation 0.3), then 16 tokens at a tenth of it each; without it the attempts carry no
        node times."""
        errors, e2e, node_ttft = errors or {}, e2e or {}, node_ttft or {}
        for _ in range(count):
            self.n += 1
            rid = f"r{self.n}"
            user = f"u{self.rng.randrange(users)}"
            v = self.versions.assign("m", "acme", user, rid)
            assert v is not None
            now = self.clock.time()
            rec = RequestRecord(request_id=rid, received_at=now, endpoint="chat", model_requested="m",
                                tenant="acme", stream=True, model_version=v.name)
            failed = self.rng.random() < errors.get(v.name, 0.0)
            node = sorted(v.nodes)[0]
            rec.decisions.append({"attempt": 1, "model": "m", "version": v.name})
            rec.attempts.append(AttemptRecord(1, node, "m", now, now, "retryable" if failed else "ok",
                                              500 if failed else 200))
            served = v.name
            if failed:
                served = "v1"
                rec.decisions.append({"attempt": 2, "model": "m", "version": "v1"})
                rec.attempts.append(AttemptRecord(2, "a", "m", now, now, "ok", 200))
            rec.model_version = served
            rec.status = "ok"
            d = e2e.get(served, 0.2)
            rec.first_byte_at, rec.last_byte_at = now + d / 4, now + d
            if served in node_ttft:
                ttft = node_ttft[served] * math.exp(self.rng.gauss(0.0, 0.3))
                att = rec.attempts[-1]
                att.first_byte_at = now + ttft
                att.ended_at = now + ttft + 15 * ttft / 10
                rec.completion_tokens = 16
            self.served[v.name] = self.served.get(v.name, 0) + 1
            self.window.observe(rec)

    def spec(self, **kw: Any) -> RolloutSpec:
        return RolloutSpec(**{"model": "m", "from_version": "v1", "to_version": "v2", **kw})


def rig(process: Path = MAIN, engine: Engine | None = None, **rollouts: Any) -> Rig:
    clock = ManualClock()
    cfg = fleet(**rollouts)
    versions = VersionTable.from_fleet(cfg)
    window = VersionWindow(clock, lambda m: versions.get(m) is not None, slos=cfg.slos)
    proc = load_process(process, SERVICES, engine="spiff", required=dict(ROLLOUT_CONTRACT.required),
                        start_data=ROLLOUT_CONTRACT.start_data)
    cfg_r: RolloutConfig = cfg.rollouts
    mgr = RolloutManager(versions=versions, window=window, process=proc, clock=clock, cfg=cfg_r, engine=engine)
    return Rig(clock, cfg, versions, window, mgr)
