"""A level-shift guard for a forecaster: re-level its forecast when the load has moved to a new level.

A seasonal forecaster fitted on a calm history (Holt-Winters on a flat or slowly varying series
fits a small level-smoothing constant: noise is best smoothed away) follows a sudden change of
level slowly. After a step **up** the planner's ``max(forecast, observed)`` already covers the
lag; after a step **down** the forecast stays above the new level for as long as the smoothing
takes, and every replica it keeps is paid for. :class:`LevelShiftGuard` watches the forecaster's
one-step-ahead errors, one per closed step, and corrects its forecasts:

* **noise scale** ``sigma``: a robust scale of the history's step-to-step changes over the last
  ``window`` steps (1.4826 × the median absolute deviation of the first differences, ÷ √2: the
  noise of one value when the changes are noise), at least ``min_sigma_share`` × the mean level
  (a silent series would otherwise call every request a shift);
* **a shift** is detected when the last ``k`` steps all lie beyond ``z × sigma`` of the forecast
  made for them (the corrected one), on the same side; from then on the forecast is
  **re-levelled** to the observed level: every value of the horizon is moved by the same amount
  (a level shift moves the whole horizon; the forecaster's shape over it is kept) so that its
  first step is the mean of the last ``k`` observed steps. That is re-estimated each closed step
  and kept until the forecaster has caught up (its own first step within ``sigma`` of the
  observed level);
* the step at which a shift was detected is reported (:attr:`LevelShiftGuard.shifted`: ``"up"``
  or ``"down"``), so the caller may let a scale-down through at once after a detected step down
  (:class:`~inferlb.autoscale.policy.Autoscaler` clears the stabilisation window then: a level
  that moved for ``k`` steps beyond the noise is not the noise the window guards against).

It sees only the past: the closed steps of the history it is handed and the forecasts it made.
State is per model and advances once per closed step (:meth:`LevelShiftGuard.correct` called
again on the same history returns the same correction), so it may be called every round.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferlb.autoscale.forecast import Forecast

__all__ = ["LevelShiftGuard", "noise_scale"]


def noise_scale(history: Sequence[float], *, window: int, min_share: float) -> float:
    """The noise of one value of ``history`` (module docstring), from its last ``window`` steps."""
    tail = [float(v) for v in history[-window:]]
    level = statistics.fmean(tail) if tail else 0.0
    floor = max(min_share * abs(level), 1e-9)
    if len(tail) < 3:
        return floor
    diffs = [b - a for a, b in itertools.pairwise(tail)]
    med = statistics.median(diffs)
    mad = statistics.median(abs(d - med) for d in diffs)
    return max(1.4826 * mad / math.sqrt(2.0), floor)


@dataclass
class _State:
    end: float | None = None            # the history's end at the last closed step seen
    raw_next: float | None = None       # the forecaster's own forecast of the next step
    cor_next: float | None = None       # the corrected forecast of the next step
    cor: deque[float] = field(default_factory=lambda: deque(maxlen=64))    # corrected one-step errors
    offset: float = 0.0
    direction: int = 0                  # +1 / -1 while a shift is being corrected, 0 otherwise
    level: float = 0.0                  # the mean of the last k closed steps
    sigma: float = 0.0                  # the history's noise scale at the last closed step
    shifted: str | None = None          # "up" / "down" when the last closed step detected a shift
    detections: int = 0


class LevelShiftGuard:
    """Corrects a forecaster's forecasts after a level shift (module docstring).

    ``k`` steps in a row beyond ``z × sigma`` make a shift; ``window`` steps of history give
    ``sigma``; ``min_sigma_share`` bounds it below as a share of the level."""

    def __init__(self, *, k: int = 2, z: float = 3.0, window: int = 288, min_sigma_share: float = 0.02) -> None:
        if k < 1 or z <= 0 or window < 3 or min_sigma_share < 0:
            raise ValueError("LevelShiftGuard needs k >= 1, z > 0, window >= 3, min_sigma_share >= 0")
        self.k, self.z, self.window, self.min_sigma_share = k, z, window, min_sigma_share
        self._state: dict[str, _State] = {}

    def shifted(self, model: str) -> str | None:
        """``"up"`` / ``"down"`` when the last closed step of ``model`` detected a shift, else None."""
        s = self._state.get(model)
        return None if s is None else s.shifted

    def offset(self, model: str) -> float:
        """The correction added to ``model``'s forecasts now (0 when none)."""
        s = self._state.get(model)
        return 0.0 if s is None else s.offset

    def detections(self, model: str) -> int:
        s = self._state.get(model)
        return 0 if s is None else s.detections

    def correct(self, model: str, history: Sequence[float], end: float, step_s: float, raw: Forecast) -> Forecast:
        """``raw`` (the forecaster's forecast from ``history``, whose last step ends at ``end``),
        corrected for a level shift. A history whose end moved by one step is one new closed step;
        by more (a gap) or backwards, the guard starts over for that model."""
        s = self._state.setdefault(model, _State())
        new_step = s.end is None or end >= s.end + step_s * (1 - 1e-6)
        if new_step and history:
            one = s.end is not None and end < s.end + step_s * (1 + 1e-6)
            if not one:
                s.cor.clear()
                s.offset, s.direction = 0.0, 0
            elif s.raw_next is not None and s.cor_next is not None:
                y = float(history[-1])
                s.cor.append(y - s.cor_next)
            s.end = end
            s.shifted = None
            self._update(s, history)
        elif not new_step and s.end is not None and end < s.end - step_s * 1e-6:
            self._state[model] = s = _State()     # time went back: a new run
            return self.correct(model, history, end, step_s, raw)
        if not raw.values:
            return raw
        if new_step:
            s.offset = 0.0
            if s.direction != 0:
                off = s.level - raw.values[0]
                if abs(off) < s.sigma:      # the forecaster has caught up with the new level
                    s.direction = 0
                else:
                    s.offset = off
        values = tuple(max(0.0, v + s.offset) for v in raw.values)
        if new_step:
            s.raw_next, s.cor_next = raw.values[0], values[0]
        if s.offset == 0.0:
            return raw
        return Forecast(values, raw.method, raw.fallback)

    def _update(self, s: _State, history: Sequence[float]) -> None:
        s.sigma = noise_scale(history, window=self.window, min_share=self.min_sigma_share)
        s.level = statistics.fmean(float(v) for v in history[-self.k:])
        if len(s.cor) < self.k:
            return
        limit = self.z * s.sigma
        last = list(s.cor)[-self.k:]
        if all(e > limit for e in last) or all(e < -limit for e in last):
            s.direction = 1 if last[0] > 0 else -1
            s.shifted = "up" if s.direction > 0 else "down"
            s.detections += 1
