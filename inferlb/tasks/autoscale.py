"""``autoscale/*``: the service operations of ``processes/autoscale.bpmn`` (one scaling round).

``autoscale/observe``, ``autoscale/forecast`` and ``autoscale/actuate`` are external: the runner
(:mod:`inferlb.autoscale.runner`) reads the audit trail, fits the forecaster off the event
loop, and calls the actuator, then completes the task with a summary. The two below run in the
engine, never sleep, never do I/O:

* ``autoscale/plan``: the planner over what observe and forecast left in the scope; writes
  ``plan`` = ``{"changes", "pools", "cost_per_hour", "notes"}``. Optional parameters
  ``target_utilisation`` and ``headroom`` override the fleet file's for this process.
* ``autoscale/record``: turns the round into ``scaling_events`` rows (each pool changed or failed,
  each pool held by the stabilisation window, each forecast fallback, or the plan itself under
  dry-run) and hands them to the writer; writes ``recorded`` = ``{"count", "statuses"}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferlb.autoscale.record import round_events
from inferlb.autoscale.scope import AutoscaleScope

__all__ = ["plan", "record"]


def _fraction(params: Mapping[str, Any], name: str, lo: float, hi: float) -> float | None:
    v = params.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= float(v) <= hi:
        raise ValueError(f"parameter {name} must be a number in [{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def plan(scope: AutoscaleScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads the scope (observed history, capacity, replicas in place, forecasts); writes ``plan``."""
    over: dict[str, float] = {}
    tu = _fraction(params, "target_utilisation", 0.01, 1.0)
    if tu is not None:
        over["target_utilisation"] = tu
    hr = _fraction(params, "headroom", 0.0, 10.0)
    if hr is not None:
        over["headroom"] = hr
    scaler = scope.scaler
    saved = scaler.cfg
    if over:
        scaler.cfg = saved.model_copy(update=over)
    try:
        p = scaler.plan(now=scope.clock.time(), current=scope.current, capacity=scope.capacity)
    finally:
        scaler.cfg = saved
    scope.plan = p
    return {"changes": len(p.changes), "pools": [d.to_json() for d in p.pools],
            "cost_per_hour": round(p.cost_per_hour, 6), "notes": list(p.notes)}


def record(scope: AutoscaleScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Writes ``recorded`` = ``{"count", "statuses"}``: rows handed to the scaling-event writer."""
    rows = round_events(scope)
    if rows:
        scope.record(rows)
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {"count": len(rows), "statuses": statuses}
