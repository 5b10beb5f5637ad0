"""A skill gate for a forecaster: plan on its forecast only while it beats persistence.

The planner sizes for ``max(forecast, observed)``, so a forecast can only add replicas to what
reacting to the observed load would keep. That extra is worth its GPU-hours when the forecast
knows something the last value does not (a daily ramp it has seen before); when it does not
(a level that wanders, a step the season never had, a season fitted on noise), its wiggles above
the last value are replicas bought for nothing. :class:`SkillGate` measures that per model, from
the past only:

* each closed step, the one-step-ahead error of the forecast made at the previous step,
  ``|y - f|``, and the error persistence (the last value held) would have made, ``|y - y_prev|``;
* over the last ``window`` closed steps (at least ``min_steps`` of them), the forecast has
  **skill** when its summed absolute error is below ``ratio`` × persistence's;
* without skill, the gate answers the **reactive** forecast (the last value held, as
  :class:`~inferlb.autoscale.forecast.Reactive` does) and says why in ``Forecast.fallback``;
  with it, the forecaster's own. The forecaster is still asked every step (the gate keeps
  measuring it), so the gate opens again as soon as the forecast beats persistence.

Before ``min_steps`` steps have been measured (a new gateway, a backtest's first hour) the gate is
open: the forecaster decides, as it did without a gate. State advances once per closed step (a
history whose end moved by one step); called again on the same history it answers the same.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferlb.autoscale.forecast import Forecast

__all__ = ["SkillGate"]


@dataclass
class _State:
    end: float | None = None
    f_next: float | None = None      # the forecaster's forecast of the next step, made at `end`
    y_last: float | None = None      # the last closed step's value
    errors: deque[tuple[float, float]] = field(default_factory=deque)   # (|y - f|, |y - y_prev|)
    closed: bool = False             # the gate's answer at the last closed step
    closed_steps: int = 0            # closed steps answered reactively (for the figures)


class SkillGate:
    """Answers the reactive forecast while the forecaster has no skill over persistence (module docstring)."""

    def __init__(self, *, window: int = 24, min_steps: int = 12, ratio: float = 1.0) -> None:
        if window < 1 or not 1 <= min_steps <= window or ratio <= 0:
            raise ValueError("SkillGate needs window >= 1, 1 <= min_steps <= window, ratio > 0")
        self.window, self.min_steps, self.ratio = window, min_steps, ratio
        self._state: dict[str, _State] = {}

    def closed(self, model: str) -> bool:
        """True when ``model``'s last closed step found no skill (its plan follows the observed load)."""
        s = self._state.get(model)
        return s is not None and s.closed

    def closed_steps(self, model: str) -> int:
        s = self._state.get(model)
        return 0 if s is None else s.closed_steps

    def errors(self, model: str) -> tuple[float, float]:
        """(forecast, persistence) summed absolute one-step errors over the window."""
        s = self._state.get(model)
        if s is None:
            return 0.0, 0.0
        return sum(e for e, _ in s.errors), sum(p for _, p in s.errors)

    def gate(self, model: str, history: Sequence[float], end: float, step_s: float, raw: Forecast) -> Forecast:
        """``raw`` (the forecaster's forecast from ``history``, ending at ``end``) or, without skill,
        the reactive forecast. A history whose end moved by one step is one closed step; by more (a
        gap) or backwards, the measurements start over."""
        s = self._state.setdefault(model, _State())
        if s.end is not None and end < s.end - step_s * 1e-6:
            self._state[model] = s = _State()          # time went back: a new run
        if s.end is None or end >= s.end + step_s * (1 - 1e-6):
            one = s.end is not None and end < s.end + step_s * (1 + 1e-6)
            y = float(history[-1]) if history else 0.0
            if not one:
                s.errors.clear()
            elif s.f_next is not None and s.y_last is not None and history:
                s.errors.append((abs(y - s.f_next), abs(y - s.y_last)))
                while len(s.errors) > self.window:
                    s.errors.popleft()
            s.end, s.y_last = end, (y if history else None)
            s.f_next = raw.values[0] if raw.values else None
            ef, ep = sum(e for e, _ in s.errors), sum(p for _, p in s.errors)
            s.closed = len(s.errors) >= self.min_steps and ef >= self.ratio * ep
            s.closed_steps += s.closed
        if not s.closed or not history:
            return raw
        ef, ep = self.errors(model)
        last = max(0.0, float(history[-1]))
        why = (f"{raw.method}: no skill over persistence in the last {len(s.errors)} steps "
               f"(one-step error {ef:,.0f} against {ep:,.0f}): the last value held")
        return Forecast(tuple(last for _ in raw.values), "reactive", why if raw.fallback is None
                        else f"{raw.fallback}; {why}")
