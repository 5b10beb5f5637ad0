"""What the ``autoscale/*`` service operations act on: one :class:`AutoscaleScope` per round.

The workflow treats it as opaque and passes it to each operation of ``tasks/autoscale.py``. Big
data (the observed series, the forecasts, the plan object) stays here; the process data gets
small JSON summaries (processes/README.md: "Workflow data is small JSON only").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferlb.autoscale.actuator import PoolResult
from inferlb.autoscale.capacity import Capacity
from inferlb.autoscale.forecast import Forecast
from inferlb.autoscale.planner import Plan
from inferlb.autoscale.policy import Autoscaler, LoadHistory
from inferlb.types import Clock

__all__ = ["AutoscaleScope"]


@dataclass
class AutoscaleScope:
    scaler: Autoscaler
    clock: Clock
    actuator_name: str
    record: Callable[[list[dict[str, Any]]], None]     # non-blocking hand-off of scaling_events rows
    round: int = 0
    history: LoadHistory | None = None
    capacity: dict[tuple[str, str], Capacity] = field(default_factory=dict)
    current: dict[tuple[str, str], int] = field(default_factory=dict)
    forecasts: dict[str, Forecast] = field(default_factory=dict)
    plan: Plan | None = None
    results: list[PoolResult] = field(default_factory=list)
    actuation_error: str | None = None
    # model -> the last round's fallback reason, digits removed: a fallback is recorded when it
    # starts or changes, not every round it lasts (a missing library would fill the table)
    previous_fallbacks: dict[str, str] = field(default_factory=dict)
