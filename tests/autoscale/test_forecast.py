"""Forecasters on synthetic seasonal series whose future is known exactly."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from inferlb.autoscale.forecast import (
    Forecast,
    HoltWinters,
    Mstl,
    Oracle,
    Reactive,
    SeasonalNaive,
    StaticPeak,
    make_forecaster,
)
from inferlb.config.autoscale import AutoscaleConfig
from inferlb.errors import PluginError

SEASON = 48


def wave(n: int, *, base: float = 1000.0, amp: float = 600.0, trend: float = 0.0) -> list[float]:
    return [base + amp * math.sin(2 * math.pi * t / SEASON) + trend * t for t in range(n)]


def test_seasonal_naive_repeats_the_last_season_exactly() -> None:
    y = wave(3 * SEASON + 10)
    f = SeasonalNaive().forecast(y[:-10], 10, SEASON)
    assert f.method == "seasonal-naive" and f.fallback is None
    assert f.values == pytest.approx(y[-10:], abs=1e-9)
    # past one season it wraps around the last season
    long = SeasonalNaive().forecast(y[:2 * SEASON], SEASON + 3, SEASON)
    assert long.values[SEASON:] == pytest.approx(long.values[:3])


def test_reactive_holds_the_last_value_and_static_the_peak() -> None:
    y = [5.0, 9.0, 7.0, 3.0]
    assert Reactive().forecast(y, 3, 2).values == (3.0, 3.0, 3.0)
    assert StaticPeak().forecast(y, 2, 2).values == (9.0, 9.0)


def test_too_little_history_falls_back_to_reactive_and_says_why() -> None:
    y = wave(SEASON - 1)
    f = SeasonalNaive().forecast(y, 4, SEASON)
    assert f.method == "reactive" and f.values == (y[-1],) * 4
    assert f.fallback is not None and "one season" in f.fallback and str(SEASON - 1) in f.fallback
    hw = HoltWinters().forecast(wave(SEASON + 5), 4, SEASON)   # needs two seasons
    assert hw.method == "reactive" and hw.fallback is not None and "2 seasons" in hw.fallback
    empty = Reactive().forecast([], 2, SEASON)
    assert empty.values == (0.0, 0.0)


def test_a_missing_library_falls_back_to_seasonal_naive_and_says_so() -> None:
    class Missing(HoltWinters):
        name = "missing-lib"
        module = "inferlb_no_such_forecasting_library"

    y = wave(3 * SEASON)
    f = Missing().forecast(y, 5, SEASON)
    assert f.method == "seasonal-naive"
    assert f.fallback is not None and "not installed" in f.fallback
    assert f.values == pytest.approx(SeasonalNaive().forecast(y, 5, SEASON).values)


@pytest.mark.parametrize("cls", [HoltWinters, Mstl], ids=["holt-winters", "mstl"])
def test_statistical_models_learn_a_clean_season(cls: type[HoltWinters] | type[Mstl]) -> None:
    pytest.importorskip(cls.module)
    y = wave(6 * SEASON + 12, trend=0.0)
    f = cls().forecast(y[:-12], 12, SEASON)
    assert f.method == cls.name and f.fallback is None
    # noiseless, stationary: within 2 % of the amplitude at every step
    assert max(abs(a - b) for a, b in zip(f.values, y[-12:], strict=True)) < 0.02 * 600


def test_forecasts_are_never_negative() -> None:
    y = [100.0, 0.0] * (2 * SEASON)
    for name in ("seasonal-naive", "reactive", "static"):
        assert min(make_forecaster(name).forecast([-5.0, *y[1:]], 6, SEASON).values) >= 0.0


def test_oracle_reads_the_future_it_is_given() -> None:
    y = wave(100)
    f = Oracle(lambda n, h: y[n:n + h]).forecast(y[:90], 5, SEASON)
    assert f.values == pytest.approx(y[90:95])
    with pytest.raises(ValueError, match="future"):
        make_forecaster("oracle")
    with pytest.raises(PluginError, match="unknown forecaster 'prophet'"):
        make_forecaster("prophet")


class Flat:
    """A forecaster of the operator's own: a constant."""

    name = "flat"

    def forecast(self, history: Sequence[float], horizon: int, season: int) -> Forecast:
        return Forecast((7.0,) * horizon, self.name)


def test_a_forecaster_of_ones_own_by_module_attr() -> None:
    own = f"{__name__}:Flat"
    assert AutoscaleConfig.model_validate({"forecaster": own}).forecaster == own   # checked at load
    f = make_forecaster(own).forecast([1.0, 2.0], 3, SEASON)
    assert f.values == (7.0, 7.0, 7.0) and f.method == "flat"
    with pytest.raises(ValueError, match=f"cannot load forecaster '{__name__}:Nope'"):   # a ValidationError
        AutoscaleConfig.model_validate({"forecaster": f"{__name__}:Nope"})
    with pytest.raises(ValueError, match="unknown forecaster 'oracle'"):   # backtests only: not configurable
        AutoscaleConfig.model_validate({"forecaster": "oracle"})
