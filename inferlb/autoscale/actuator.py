"""The actuator contract: what every actuator (dry-run, local, kubernetes, webhook) promises.

* :meth:`Actuator.current` returns the replicas in place per pool (model, GPU type), read fresh
  each round, so a plan is always computed against reality, not against what was last asked.
* :meth:`Actuator.apply` applies a plan **pool by pool** and returns one :class:`PoolResult` per
  pool that had to change: ``ok`` and the replicas in place afterwards (``after``), or the error.
  It never raises for an orchestrator's failure (API error, timeout, refused webhook): a failure
  is a result, so the round records every pool, applied or not, and the next round re-plans from
  :meth:`current` and retries what is still missing (plans are desired states: idempotent).
* A pool is never asked below its ``min``: :func:`guard_min` clamps and says so.
* Scale-down drains before it removes (local: out of routing, in-flight requests finish; the
  kubernetes and webhook actuators hand that to the orchestrator, see their modules).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from inferlb.autoscale.planner import Plan, PoolDecision
from inferlb.config.autoscale import PoolConfig

__all__ = ["Actuator", "PoolResult", "guard_min"]

PoolKey = tuple[str, str]


@dataclass(frozen=True)
class PoolResult:
    model: str
    gpu: str
    before: int
    requested: int
    after: int | None        # replicas in place afterwards (None: unknown)
    ok: bool
    error: str | None = None
    detail: str = ""

    @property
    def status(self) -> str:
        if self.ok:
            return "applied"
        if self.after is not None and self.after != self.before:
            return "partial"
        return "failed"

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "gpu": self.gpu, "before": self.before, "requested": self.requested,
                "after": self.after, "ok": self.ok, "status": self.status, "error": self.error,
                "detail": self.detail}


class Actuator(Protocol):
    name: str

    async def current(self) -> dict[PoolKey, int]: ...

    async def apply(self, plan: Plan) -> list[PoolResult]: ...

    async def close(self) -> None: ...


def guard_min(d: PoolDecision, pools: Mapping[PoolKey, PoolConfig]) -> int:
    """The replicas to ask for ``d``: never below its pool's ``min`` nor above its ``max``."""
    p = pools.get(d.key)
    if p is None:
        return max(0, d.desired)
    return min(max(d.desired, p.min), p.max)
