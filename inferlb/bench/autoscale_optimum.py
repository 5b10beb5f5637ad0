"""The offline optimum of an autoscaling backtest: the least replica-hours schedule that serves a
trace at SLO, given the cold start, computed on the trace with the future known.

:func:`offline_optimum` is the reference the backtest's policies are compared with
(:mod:`.autoscale_backtest`), a floor under them in the planner's own capacity model, unlike the
``oracle`` policy (the same planner handed the future, whose headroom, stabilisation and step
rounding it keeps).

Contract:

* The need of step ``t`` is ``max(min_replicas, ceil(demand[t] / capacity))`` replicas *ready*,
  ``capacity`` being one replica's tokens/s at SLO (what the backtest calibrates and the planner
  plans with): below it the SLO is not met, in that model. ``ready_at_start`` replicas are ready
  at step 0 (warm from before the window); any other must start ``k = ceil(cold_start_s /
  step_s)`` steps before it serves, and is billed from its start. Stopping is free.
* Replicas are interchangeable, so the problem splits by *level*: replica ``j`` (1-based) is
  needed on the steps where the need is ≥ ``j``. For one level, each run of needed steps is
  billed, and each gap of ``g`` steps before a run costs ``min(g, k)`` (keep it running through
  the gap, or stop it and start it again ``k`` steps early); the first run costs ``k`` more unless
  the level was ready at step 0 (a run that starts at step 0 on a level not ready then is
  billed the same ``k``: it would have had to start before the window). The sum over levels is
  exact and least: every schedule pays at least this on each level.
* Returns replica-hours (``gpu_hours``), the need per step and the schedule of replicas billed
  per step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["offline_optimum"]


def offline_optimum(demand: Sequence[float], capacity: float, *, step_s: float, cold_start_s: float,
                    min_replicas: int = 1, max_replicas: int | None = None,
                    ready_at_start: int | None = None) -> dict[str, Any]:
    """See the module docstring. ``demand``: tokens/s per step; ``ready_at_start`` defaults to
    the first step's need."""
    if capacity <= 0 or step_s <= 0:
        raise ValueError("capacity and step_s must be positive")
    need = [max(min_replicas, math.ceil(d / capacity - 1e-9)) for d in demand]
    if max_replicas is not None:
        need = [min(n, max_replicas) for n in need]
    if not need:
        return {"gpu_hours": 0.0, "need": [], "billed": [], "cold_start_steps": 0}
    k = math.ceil(cold_start_s / step_s - 1e-9)
    ready0 = need[0] if ready_at_start is None else ready_at_start
    steps = len(need)
    billed = [0] * steps
    total = 0
    for level in range(1, max(need) + 1):
        on = [n >= level for n in need]
        t = 0
        last_end: int | None = None
        while t < steps:
            if not on[t]:
                t += 1
                continue
            a = t
            while t < steps and on[t]:
                t += 1
            b = t                        # a run of needed steps [a, b)
            total += b - a
            for s in range(a, b):
                billed[s] += 1
            if last_end is None:
                if not (a == 0 and level <= ready0):
                    total += k           # its first start, before the window or k steps before a
                    for s in range(max(0, a - k), a):
                        billed[s] += 1
            else:
                g = a - last_end
                kept = min(g, k)
                total += kept
                for s in range(a - kept, a):
                    billed[s] += 1
            last_end = b
    return {"gpu_hours": total * step_s / 3600.0, "need": need, "billed": billed, "cold_start_steps": k}
