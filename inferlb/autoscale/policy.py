"""The autoscaler as a backtest (or the gateway) drives it: ``observe(history) → forecast() → plan()``.

:class:`Autoscaler` holds no clock and does no I/O: the caller hands it the observed history,
the time, the replicas in place and the capacity model, and gets forecasts and a plan back. The
gateway's rounds (``processes/autoscale.bpmn``, :mod:`.runner`) and a discrete-event backtest use
the same object, so a backtest measures what production would do::

    scaler = Autoscaler(cfg, make_forecaster("holt-winters"), gpu_prices={"h100": 4.1})
    for now in rounds:
        scaler.observe(LoadHistory(step_s=300, end=now, tokens={"m": series_up_to_now}))
        forecasts = scaler.forecast()
        plan = scaler.plan(now=now, current={("m", "h100"): 3}, capacity=capacities)
        apply(plan.desired())          # the backtest's own fleet model
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from inferlb.autoscale.capacity import Capacity
from inferlb.autoscale.forecast import Forecast, Forecaster, make_forecaster
from inferlb.autoscale.planner import Plan, PlannerState, plan
from inferlb.autoscale.release import ForecastRelease
from inferlb.autoscale.shift import LevelShiftGuard
from inferlb.autoscale.skill import SkillGate
from inferlb.config.autoscale import AutoscaleConfig

__all__ = ["Autoscaler", "LoadHistory"]


@dataclass(frozen=True)
class LoadHistory:
    """Observed load per model: one value per step (tokens/s), oldest first, the last step ending at ``end``.

    ``recent``: per model, tokens/s of the last round alone (its arrivals, plus the queue's backlog
    when the observer sees it), what the planner's burst path compares with the replicas in place;
    ``routed``: per pool (model, gpu), tokens/s the router sent it over ``routed_share_s``, what
    each pool is sized from. Either may be empty (no burst path; cheapest-first allocation)."""

    step_s: float
    end: float
    tokens: Mapping[str, Sequence[float]]
    arrivals: Mapping[str, Sequence[float]] = field(default_factory=dict)
    recent: Mapping[str, float] = field(default_factory=dict)
    routed: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def last(self, model: str) -> float:
        s = self.tokens.get(model) or ()
        return float(s[-1]) if len(s) else 0.0


class Autoscaler:
    """Forecast and plan for every pool of ``cfg`` (see the module docstring)."""

    def __init__(self, cfg: AutoscaleConfig, forecaster: Forecaster | None = None, *,
                 gpu_prices: Mapping[str, float] | None = None, level_shift: LevelShiftGuard | None = None,
                 rise_ratio: float | None = None, skill_gate: SkillGate | None = None,
                 release: ForecastRelease | None = None) -> None:
        """``level_shift``: corrects the forecasts after a level shift and, at a detected step
        down, clears the pools' scale-down stabilisation once (:mod:`.shift`); ``skill_gate``:
        plans on the reactive forecast while the forecaster does not beat persistence
        (:mod:`.skill`); ``rise_ratio``: the planner's rise path
        (:func:`~inferlb.autoscale.planner.plan`); ``release``: the forecast's upper band, which
        lets a scale-down go before the stabilisation window ends (:mod:`.release`; made from
        ``cfg.release_quantile`` when that is set and none is given). All off by default."""
        if rise_ratio is not None and rise_ratio <= 1.0:
            raise ValueError("rise_ratio must be > 1 (the last round's load over the last closed step's)")
        self.cfg = cfg
        self.forecaster = forecaster or make_forecaster(cfg.forecaster)
        self.gpu_prices = dict(gpu_prices or {})
        self.level_shift = level_shift
        self.rise_ratio = rise_ratio
        self.skill_gate = skill_gate
        if release is None and cfg.release_quantile is not None:
            release = ForecastRelease(quantile=cfg.release_quantile)
        self.release = release
        self.band_releases = 0                            # pool-rounds the upper band let below the window's hold
        self.state = PlannerState()
        self.history: LoadHistory | None = None
        self.forecasts: dict[str, Forecast] = {}
        self.releases = 0                                 # stabilisation windows cleared at a step down
        self._released: dict[str, int] = {}               # model -> the guard's detections when last cleared

    @property
    def models(self) -> list[str]:
        return sorted({p.model for p in self.cfg.pools})

    def horizon_steps(self, step_s: float) -> int:
        """Steps a forecast must cover: the slowest cold start plus one round, plus one step."""
        lead = max((p.cold_start_s for p in self.cfg.pools), default=0.0) + self.cfg.interval_s
        return max(1, math.ceil(lead / step_s)) + 1

    def season_steps(self, step_s: float) -> int:
        return max(1, round(self.cfg.season_s / step_s))

    def observe(self, history: LoadHistory) -> None:
        self.history = history

    def forecast(self) -> dict[str, Forecast]:
        """One forecast per model of the pools, from the last observed history."""
        h = self.history
        if h is None:
            raise RuntimeError("observe() a history before forecast()")
        horizon, season = self.horizon_steps(h.step_s), self.season_steps(h.step_s)
        out: dict[str, Forecast] = {}
        for m in self.models:
            series = list(h.tokens.get(m, ()))
            f = self.forecaster.forecast(series, horizon, season)
            if self.level_shift is not None:
                f = self.level_shift.correct(m, series, h.end, h.step_s, f)
            if self.skill_gate is not None:
                f = self.skill_gate.gate(m, series, h.end, h.step_s, f)
            if self.release is not None:
                self.release.record(m, series, h.end, h.step_s, f)
            out[m] = f
        self.forecasts = out
        return self.forecasts

    def plan(self, *, now: float, current: Mapping[tuple[str, str], int],
             capacity: Mapping[tuple[str, str], Capacity]) -> Plan:
        """The plan for ``now``; remembers the recommendations for scale-down stabilisation."""
        h = self.history
        if h is None:
            raise RuntimeError("observe() a history before plan()")
        if self.level_shift is not None:
            for m in self.models:
                # A step down detected at this closed step: the level moved k steps beyond the
                # noise, which is not the flapping the stabilisation window guards against; the
                # window is cleared once per detection, so the scale-down happens this round.
                seen = self.level_shift.detections(m)
                if self.level_shift.shifted(m) == "down" and self._released.get(m, 0) != seen:
                    self._released[m] = seen
                    self.releases += 1
                    self.state = PlannerState({k: v for k, v in self.state.recommendations.items() if k[0] != m})
        observed = {m: h.last(m) for m in self.models}
        floors: dict[tuple[str, str], int] | None = None
        if self.release is not None:
            upper = {m: u for m, f in self.forecasts.items() if (u := self.release.upper(m, f)) is not None}
            if upper:
                # The same plan on the upper band, with no window: each pool's replicas there are
                # the most its scale-down is held at this round (planner step 4).
                band, _ = plan(self.cfg, now=now, forecasts={**self.forecasts, **upper}, observed=observed,
                               capacity=capacity, current=current, step_s=h.step_s, gpu_prices=self.gpu_prices,
                               state=None, recent=h.recent or None, routed=h.routed or None,
                               rise_ratio=self.rise_ratio)
                floors = {d.key: d.recommended for d in band.pools if d.model in upper}
        out, self.state = plan(self.cfg, now=now, forecasts=self.forecasts, observed=observed, capacity=capacity,
                               current=current, step_s=h.step_s, gpu_prices=self.gpu_prices, state=self.state,
                               recent=h.recent or None, routed=h.routed or None, rise_ratio=self.rise_ratio,
                               release=floors)
        self.band_releases += sum(1 for d in out.pools if d.released)
        return out
