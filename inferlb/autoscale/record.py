"""One round → ``scaling_events`` rows (see :mod:`inferlb.autoscale.store` for the columns).

Rows, in this order: one ``fallback`` per model whose forecaster fell back (the reason says
why: too little history, library missing, fit failed), when the fallback starts or its kind
changes (not every round it lasts); one per pool the actuator was asked to
change, with its outcome (``applied``, ``partial``, ``failed``; ``dry_run`` under the dry-run
actuator); ``failed`` for every change the actuator never answered for (it raised); one ``held``
per pool whose scale-down the stabilisation window or the cost cap held back. Pure.
"""

from __future__ import annotations

import re
from typing import Any

from inferlb.autoscale.scope import AutoscaleScope

__all__ = ["fallback_kind", "round_events"]


def fallback_kind(reason: str) -> str:
    """A fallback reason without its numbers ("history has 30" and "has 31" are the same kind)."""
    return re.sub(r"\d+", "#", reason)


def round_events(scope: AutoscaleScope) -> list[dict[str, Any]]:
    at = scope.clock.time()
    hist = scope.history
    base = {"at": at, "round": scope.round, "actuator": scope.actuator_name}
    rows: list[dict[str, Any]] = []
    for model, f in sorted(scope.forecasts.items()):
        if f.fallback is not None and scope.previous_fallbacks.get(model) != fallback_kind(f.fallback):
            rows.append({**base, "model": model, "gpu": None, "status": "fallback", "forecaster": f.method,
                         "forecast_tokens_s": f.peak(), "actual_tokens_s": hist.last(model) if hist else None,
                         "reason": f.fallback, "detail": {"method": f.method}})
    plan = scope.plan
    if plan is None:
        return rows
    decisions = {d.key: d for d in plan.pools}
    answered = set()
    for r in scope.results:
        key = (r.model, r.gpu)
        answered.add(key)
        d = decisions.get(key)
        fr = scope.forecasts.get(r.model)
        reason = d.reason if d is not None else ""
        if r.error:
            reason = f"{reason}; error: {r.error}" if reason else r.error
        rows.append({**base, "model": r.model, "gpu": r.gpu, "from_replicas": r.before, "to_replicas": r.requested,
                     "applied_replicas": r.after,
                     "status": "dry_run" if scope.actuator_name == "dry-run" else r.status,
                     "forecaster": fr.method if fr else None,
                     "forecast_tokens_s": d.demand_tokens_s if d else None,
                     "actual_tokens_s": hist.last(r.model) if hist else None,
                     "capacity_tokens_s": d.capacity_tokens_s if d else None, "reason": reason,
                     "detail": {"result": r.to_json(), "decision": d.to_json() if d else None}})
    for d in plan.changes:
        if d.key not in answered:
            err = scope.actuation_error or "the actuator gave no result for this pool"
            fc = scope.forecasts.get(d.model)
            rows.append({**base, "model": d.model, "gpu": d.gpu, "from_replicas": d.current, "to_replicas": d.desired,
                         "status": "failed", "forecaster": fc.method if fc else None,
                         "forecast_tokens_s": d.demand_tokens_s, "capacity_tokens_s": d.capacity_tokens_s,
                         "actual_tokens_s": hist.last(d.model) if hist else None,
                         "reason": f"{d.reason}; error: {err}", "detail": {"decision": d.to_json(), "error": err}})
    for d in plan.pools:
        if d.delta == 0 and d.recommended < d.current:
            fh = scope.forecasts.get(d.model)
            rows.append({**base, "model": d.model, "gpu": d.gpu, "from_replicas": d.current, "to_replicas": d.desired,
                         "applied_replicas": d.current, "status": "held", "forecaster": fh.method if fh else None,
                         "forecast_tokens_s": d.demand_tokens_s, "capacity_tokens_s": d.capacity_tokens_s,
                         "actual_tokens_s": hist.last(d.model) if hist else None, "reason": d.reason,
                         "detail": {"decision": d.to_json()}})
    return rows
