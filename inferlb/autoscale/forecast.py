"""Forecasters: the load (tokens/s, or arrivals/s) of the next ``horizon`` steps from the past.

Every forecaster is a pure object with one method, :meth:`Forecaster.forecast`
``(history, horizon, season) -> Forecast``: ``history`` is a regular series (one value per step,
oldest first, no gaps: the observer fills empty steps with 0), ``season`` the number of steps in
one cycle (288 = one day at 5 min). No clock, no I/O, no state between calls, so a backtest drives
them exactly as the gateway does.

* ``seasonal-naive``: the value one season earlier (``y[t+h] = y[t+h-season]``), the textbook
  baseline. Needs one whole season.
* ``holt-winters``: additive Holt-Winters (exponential smoothing with an additive daily season),
  statsmodels' ``ExponentialSmoothing``; needs two seasons.
* ``mstl``: statsforecast's MSTL (seasonal-trend decomposition, AutoETS on the remainder); needs
  two seasons.
* ``reactive``: the last value for every step ahead: what a target-utilisation rule (the
  Kubernetes HPA formula ``desired = ceil(current × utilisation / target)``) provisions for.
* ``static``: the peak of the whole history (static peak provisioning).
* ``oracle``: the true future, handed to it (backtests only; perfect foresight).

The names a gateway may configure are one table, :data:`inferlb.config.autoscale.FORECASTERS`
(name → ``"module:attr"``, a user's own ``"module:attr"`` too: called with no argument, it returns a
:class:`Forecaster`); :func:`make_forecaster` resolves a name through it, or makes the oracle.

**Fallbacks, always said.** A forecaster fed too little history answers with the reactive
forecast and says why (``Forecast.fallback``); the statistical ones answer with seasonal-naive
(or reactive when that is short too) when their library is not installed
(``pip install 'inferlb[forecast]'``) or their fit fails. Forecasts are never negative.
docs/benchmarks.md ("Autoscaling forecasters") has the accuracy and CPU of each on synthetic
series, measured by ``python -m benchmarks.forecasters``.
"""

from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from inferlb.config.autoscale import FORECASTERS

__all__ = ["Forecast", "Forecaster", "HoltWinters", "Mstl", "Oracle", "Reactive", "SeasonalNaive", "StaticPeak",
           "make_forecaster"]


@dataclass(frozen=True)
class Forecast:
    """``values[i]``: the forecast ``i + 1`` steps after the last observed one. ``method``: the
    forecaster that actually produced them; ``fallback``: why it is not the one asked for (None
    when it is)."""

    values: tuple[float, ...]
    method: str
    fallback: str | None = None

    def peak(self, steps: int | None = None) -> float:
        """The largest value over the first ``steps`` (all by default); 0 when empty."""
        vals = self.values if steps is None else self.values[:max(1, steps)]
        return max(vals, default=0.0)


class Forecaster(Protocol):
    name: str

    def forecast(self, history: Sequence[float], horizon: int, season: int) -> Forecast: ...


def _clean(values: Sequence[float] | Any) -> tuple[float, ...]:
    out = []
    for v in values:
        f = float(v)
        out.append(max(0.0, f) if math.isfinite(f) else 0.0)
    return tuple(out)


class Reactive:
    """The last observed value, held: the load a target-utilisation rule sizes for."""

    name = "reactive"

    def forecast(self, history: Sequence[float], horizon: int, season: int) -> Forecast:
        last = float(history[-1]) if len(history) else 0.0
        return Forecast(_clean([last] * horizon), self.name)


def _reactive(history: Sequence[float], horizon: int, season: int, why: str) -> Forecast:
    f = Reactive().forecast(history, horizon, season)
    return Forecast(f.values, f.method, why)


class StaticPeak:
    """The peak of the whole history, for every step ahead."""

    name = "static"

    def forecast(self, history: Sequence[float], horizon: int, season: int) -> Forecast:
        if not len(history):
            return _reactive(history, horizon, season, "static: no history yet")
        return Forecast(_clean([max(history)] * horizon), self.name)


class SeasonalNaive:
    """``y[t+h] = y[t+h-season]`` (repeating the last season for horizons past one season)."""

    name = "seasonal-naive"

    def forecast(self, history: Sequence[float], horizon: int, season: int) -> Forecast:
        n = len(history)
        if season < 1 or n < season:
            return _reactive(history, horizon, season,
                             f"seasonal-naive needs one season ({season} steps); history has {n}")
        last = history[n - season:]
        return Forecast(_clean([last[i % season] for i in range(horizon)]), self.name)


class _Statistical:
    """A model from an optional library; seasonal-naive when the library is missing or the fit fails."""

    name = "statistical"
    module = ""
    min_seasons = 2

    def _fit(self, history: Sequence[float], horizon: int, season: int) -> Sequence[float]:
        raise NotImplementedError

    def forecast(self, history: Sequence[float], horizon: int, season: int) -> Forecast:
        n = len(history)
        need = self.min_seasons * season
        if season < 2 or n < need:
            return _reactive(history, horizon, season,
                             f"{self.name} needs {self.min_seasons} seasons ({need} steps); history has {n}")
        try:
            importlib.import_module(self.module)
        except ImportError:
            why = f"{self.name}: {self.module} is not installed (pip install 'inferlb[forecast]')"
            return self._fallback(history, horizon, season, why)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # convergence chatter; a bad fit shows in the figures
                values = _clean(self._fit(history, horizon, season))
        except Exception as exc:  # a library's numerical failure must not stop a round
            return self._fallback(history, horizon, season, f"{self.name} fit failed: {type(exc).__name__}: {exc}")
        if len(values) != horizon:
            return self._fallback(history, horizon, season, f"{self.name} returned {len(values)} values")
        return Forecast(values, self.name)

    @staticmethod
    def _fallback(history: Sequence[float], horizon: int, season: int, why: str) -> Forecast:
        f = SeasonalNaive().forecast(history, horizon, season)
        return Forecast(f.values, f.method, why if f.fallback is None else f"{why}; {f.fallback}")


class HoltWinters(_Statistical):
    """Additive Holt-Winters, statsmodels ``ExponentialSmoothing(seasonal="add")``, no trend
    (a trend extrapolated over a ramp overshoots; the season carries the daily ramps)."""

    name = "holt-winters"
    module = "statsmodels"

    def _fit(self, history: Sequence[float], horizon: int, season: int) -> Sequence[float]:
        hw = importlib.import_module("statsmodels.tsa.holtwinters")
        model = hw.ExponentialSmoothing([float(v) for v in history], trend=None, seasonal="add",
                                        seasonal_periods=season, initialization_method="heuristic")
        return list(model.fit().forecast(horizon))


class Mstl(_Statistical):
    """statsforecast ``MSTL(season_length=season)``: STL decomposition, AutoETS on the trend."""

    name = "mstl"
    module = "statsforecast"

    def _fit(self, history: Sequence[float], horizon: int, season: int) -> Sequence[float]:
        np = importlib.import_module("numpy")
        models = importlib.import_module("statsforecast.models")
        out = models.MSTL(season_length=season).forecast(y=np.asarray(history, dtype=float), h=horizon)
        return list(out["mean"])


class Oracle:
    """Perfect foresight for comparison: ``future(len(history), horizon)`` gives the true values."""

    name = "oracle"

    def __init__(self, future: Callable[[int, int], Sequence[float]]) -> None:
        self.future = future

    def forecast(self, history: Sequence[float], horizon: int, season: int) -> Forecast:
        return Forecast(_clean(self.future(len(history), horizon)), self.name)


def make_forecaster(name: str, *, future: Callable[[int, int], Sequence[float]] | None = None) -> Forecaster:
    """The forecaster called ``name``: one of :data:`~inferlb.config.autoscale.FORECASTERS` or a
    ``module:attr`` of your own (PluginError when it does not resolve), or ``oracle``, which needs
    ``future`` (ValueError without it)."""
    if name == "oracle":
        if future is None:
            raise ValueError("the oracle forecaster needs the future (backtests only)")
        return Oracle(future)
    forecaster: Forecaster = FORECASTERS.load(name)()
    return forecaster
