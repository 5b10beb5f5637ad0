"""The forecast's upper band: what lets a scale-down go before the stabilisation window ends.

The scale-down stabilisation window (planner step 4, the Kubernetes HPA's rule) holds a pool at
the highest recommendation of the last ``scale_down_stabilisation_s``. It is there so that a
*reactive* scaler does not flap on noise: without a forecast, a dip is as likely noise as a fall.
A forecaster that has measured its own errors can say more: :class:`ForecastRelease` keeps, per
model, the signed one-step errors ``y − f`` of the forecasts the autoscaler made (the forecast of
the next step made when a step closed, scored when that next step closes) over the last
``window`` closed steps, and answers the forecast raised by their ``quantile`` (the **upper
band**; the margin is never negative, so the band is never below the forecast). With ``recent``
= k > 0 the margin is at least the largest of the last k errors: a load that has just come in
above its forecast (a crowd, a rise the season did not have) is rarer than the quantile's tail over
a day, so without it the band would be the calm hours' one right after it.

The :class:`~inferlb.autoscale.policy.Autoscaler` plans a second time on the upper band, without
the window, and hands each pool's replicas of that plan to the planner as its ``release`` floor:
a scale-down is then held only down to the larger of the plan's own recommendation and that floor.
So a replica goes before the window ends when the upper band over the planner's whole lead
(``cold_start_s + interval_s``: what is removed now cannot come back sooner), the last closed step
and the last round's load all fit in one replica fewer at the target utilisation.

Only the past: the errors are scored on closed steps, against forecasts made before them. Before
``min_steps`` errors are measured (a new gateway, a backtest's first hours) there is no band
(``None``) and the window holds as it does without this. State advances once per closed step (a
history whose end moved by exactly one step); called again on the same history it changes
nothing, and a gap or a step backwards restarts the pairing without scoring.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferlb.autoscale.forecast import Forecast

__all__ = ["ForecastRelease"]


@dataclass
class _State:
    errors: deque[float]
    end: float | None = None
    f_next: float | None = None      # the forecast of the step after `end`, made at `end`


@dataclass
class ForecastRelease:
    """Per model, the upper band of the forecasts from their own one-step errors (module docstring)."""

    quantile: float = 0.95
    window: int = 288
    min_steps: int = 24
    recent: int = 0
    _state: dict[str, _State] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError("quantile must be in (0, 1)")
        if self.window < 1 or not 1 <= self.min_steps <= self.window:
            raise ValueError("need window >= 1 and 1 <= min_steps <= window")
        if not 0 <= self.recent <= self.window:
            raise ValueError("need 0 <= recent <= window")

    def record(self, model: str, series: Sequence[float], end: float, step_s: float, forecast: Forecast) -> None:
        """Score the forecast made one step before against the step that closed at ``end``, and
        keep ``forecast`` (made at ``end``) for the next one."""
        st = self._state.setdefault(model, _State(deque(maxlen=self.window)))
        if st.end is not None and math.isclose(end, st.end):
            return
        if (st.end is not None and st.f_next is not None and len(series)
                and math.isclose(end - st.end, step_s, rel_tol=1e-6)):
            st.errors.append(float(series[-1]) - st.f_next)
        st.end = end
        st.f_next = float(forecast.values[0]) if forecast.values else None

    def measured(self, model: str) -> int:
        """How many one-step errors the band of ``model`` rests on."""
        st = self._state.get(model)
        return len(st.errors) if st is not None else 0

    def margin(self, model: str) -> float | None:
        """The ``quantile`` of the last ``window`` errors (nearest rank), at least the largest of the
        last ``recent`` and at least 0; None before ``min_steps``."""
        st = self._state.get(model)
        if st is None or len(st.errors) < self.min_steps:
            return None
        errs = sorted(st.errors)
        rank = min(len(errs) - 1, max(0, math.ceil(self.quantile * len(errs)) - 1))
        last = max(list(st.errors)[-self.recent:], default=0.0) if self.recent else 0.0
        return max(0.0, errs[rank], last)

    def upper(self, model: str, forecast: Forecast) -> Forecast | None:
        """``forecast`` raised by the margin (None while there is no band)."""
        m = self.margin(model)
        if m is None:
            return None
        return Forecast(tuple(v + m for v in forecast.values), f"{forecast.method}+band", forecast.fallback)
