"""``dry-run``: records the plan and changes nothing (a recommender).

``current`` is what the plan last asked for (each pool's ``min`` at first), so the records read
as the sequence of recommendations an operator would have applied.
"""

from __future__ import annotations

from inferlb.autoscale.actuator import PoolResult, guard_min
from inferlb.autoscale.planner import Plan
from inferlb.config.autoscale import AutoscaleConfig

__all__ = ["DryRunActuator"]


class DryRunActuator:
    name = "dry-run"

    def __init__(self, cfg: AutoscaleConfig) -> None:
        self.pools = {(p.model, p.gpu): p for p in cfg.pools}
        self.replicas = {k: p.min for k, p in self.pools.items()}

    async def current(self) -> dict[tuple[str, str], int]:
        return dict(self.replicas)

    async def apply(self, plan: Plan) -> list[PoolResult]:
        out = []
        for d in plan.changes:
            want = guard_min(d, self.pools)
            self.replicas[d.key] = want
            out.append(PoolResult(d.model, d.gpu, d.current, want, want, True, detail="dry run: nothing changed"))
        return out

    async def close(self) -> None:
        return None
