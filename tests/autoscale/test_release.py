"""The forecast's upper band that releases a scale-down before the stabilisation window ends
(inferlb/autoscale/release.py; issue 22, item 7).

Every test drives the objects with the history's end as its clock (steps of 300 s and rounds of
60 s handed in by the test): no wall clock, no sleep."""

from __future__ import annotations

import pytest

from inferlb.autoscale.forecast import Forecast
from inferlb.autoscale.planner import plan
from inferlb.autoscale.policy import Autoscaler, LoadHistory
from inferlb.autoscale.release import ForecastRelease
from tests.autoscale.one_pool import CAP, STEP, Fixed, one_pool


def _fc(v: float) -> Forecast:
    return Forecast((v, v, v), "hw")


def test_band_is_the_quantile_of_the_one_step_errors_made_before_each_step_closed() -> None:
    rel = ForecastRelease(quantile=0.9, window=10, min_steps=5)
    series: list[float] = []
    for n in range(12):                       # the forecast is always 100; the load 100 + (n % 5) × 2
        series.append(100.0 + (n % 5) * 2.0)
        rel.record("m", series, n * STEP, STEP, _fc(100.0))
        if n < 5:
            assert rel.margin("m") is None and rel.upper("m", _fc(100.0)) is None   # before min_steps
    # eleven errors scored (steps 1..11), the last 10 kept: 2,4,6,8,0,2,4,6,8,0 → the 9th of 10 sorted
    assert rel.measured("m") == 10
    assert rel.margin("m") == 8.0
    up = rel.upper("m", _fc(100.0))
    assert up is not None and up.values == (108.0, 108.0, 108.0) and up.method == "hw+band"


def test_band_is_never_below_the_forecast_and_advances_once_per_closed_step() -> None:
    rel = ForecastRelease(quantile=0.5, window=8, min_steps=2)
    series: list[float] = []
    for n in range(6):                        # the forecast always overshoots: every error negative
        series.append(50.0)
        for _ in range(5):                    # five rounds on the same closed step score it once
            rel.record("m", series, n * STEP, STEP, _fc(80.0))
    assert rel.measured("m") == 5
    assert rel.margin("m") == 0.0
    # a gap of two steps restarts the pairing without scoring
    series.extend([50.0, 50.0])
    rel.record("m", series, 7 * STEP, STEP, _fc(80.0))
    assert rel.measured("m") == 5


def test_rejects_bad_settings() -> None:
    for bad in ({"quantile": 0.0}, {"quantile": 1.0}, {"window": 0}, {"window": 4, "min_steps": 5}):
        with pytest.raises(ValueError):
            ForecastRelease(**bad)
    with pytest.raises(ValueError):
        one_pool(release_quantile=1.0)


def test_planner_holds_a_scale_down_only_down_to_the_release_floor() -> None:
    c = one_pool()
    key = ("m", "l4")
    cur = {key: 6}
    fc = {"m": _fc(150.0)}                     # 150 / 0.5 / 100 → 3 recommended
    _, st = plan(c, now=0.0, forecasts={"m": _fc(300.0)}, observed={"m": 300.0}, capacity=CAP, current=cur,
                 step_s=STEP)                  # 6 recommended a round ago: the window holds at 6
    held, _ = plan(c, now=60.0, forecasts=fc, observed={"m": 150.0}, capacity=CAP, current=cur, step_s=STEP,
                   state=st)
    assert held.pools[0].desired == 6 and not held.pools[0].released
    freed, _ = plan(c, now=60.0, forecasts=fc, observed={"m": 150.0}, capacity=CAP, current=cur, step_s=STEP,
                    state=st, release={key: 4})
    assert freed.pools[0].desired == 4 and freed.pools[0].released
    assert "upper band: 4" in freed.pools[0].reason
    # a floor above the window's hold changes nothing; one below the recommendation never goes under it
    same, _ = plan(c, now=60.0, forecasts=fc, observed={"m": 150.0}, capacity=CAP, current=cur, step_s=STEP,
                   state=st, release={key: 9})
    assert same.pools[0].desired == 6 and not same.pools[0].released
    low, _ = plan(c, now=60.0, forecasts=fc, observed={"m": 150.0}, capacity=CAP, current=cur, step_s=STEP,
                  state=st, release={key: 1})
    assert low.pools[0].desired == 3


def _step_down(scaler: Autoscaler, fall_at: int, steps: int) -> list[int]:
    """A flat 190 tokens/s (±2) for ``fall_at`` steps, then 90 (±2): the replicas after each round."""
    series: list[float] = []
    replicas = 4                               # 192 / 0.5 / 100
    out = []
    for n in range(steps):
        series.append((190.0 if n < fall_at else 90.0) + (2.0 if n % 2 else -2.0))
        for r in range(5):                     # five rounds per step
            scaler.observe(LoadHistory(STEP, n * STEP, {"m": list(series)}))
            scaler.forecast()
            replicas = scaler.plan(now=n * STEP + 60.0 * r, current={("m", "l4"): replicas},
                                   capacity=CAP).pools[0].desired
            out.append(replicas)
    return out


def test_autoscaler_releases_at_a_step_down_once_its_band_is_measured() -> None:
    """The last value held as the forecast (a step down is seen at the step that closes after it):
    without the band the window holds 4 replicas until its 300 s have passed (four more rounds);
    with the band (persistence's errors on the flat level: ±4) the plan on 92 + 4 fits 2 at once."""
    last = Fixed(lambda h: h[-1])
    fall = 40
    plain = _step_down(Autoscaler(one_pool(), last), fall, fall + 3)
    banded_scaler = Autoscaler(one_pool(release_quantile=0.95), last)
    assert isinstance(banded_scaler.release, ForecastRelease)        # made from the config
    banded = _step_down(banded_scaler, fall, fall + 3)
    first = fall * 5                                                  # the first round that sees 90 closed
    assert plain[first:first + 4] == [4, 4, 4, 4] and plain[first + 4] == 2
    assert banded[first] == 2
    assert banded_scaler.band_releases >= 1
    assert plain[:first] == banded[:first] == [4] * first             # nothing changes before the fall


def test_no_release_before_min_steps_and_none_when_the_band_is_wide() -> None:
    """A forecaster that undershoots by up to 120 tokens/s: the band (its 95 % error) keeps the
    replicas the window holds; before min_steps there is no band at all."""
    last = Fixed(lambda h: h[-1])
    wide = Autoscaler(one_pool(), last, release=ForecastRelease(quantile=0.95, window=288, min_steps=24))
    short = _step_down(wide, 10, 13)                                  # 10 steps measured: no band
    assert short[50:54] == [4] * 4 and wide.band_releases == 0

    jumpy = Fixed(lambda h: h[-1] - (120.0 if len(h) % 3 == 0 else 0.0))
    scaler = Autoscaler(one_pool(), jumpy, release=ForecastRelease(quantile=0.95, window=288, min_steps=24))
    out = _step_down(scaler, 40, 43)
    # 92 + the band's ~120 → 5 replicas wanted on the band: above the window's 4, so nothing is released
    assert scaler.band_releases == 0
    assert out[200:204] == [4] * 4


def test_recent_keeps_the_band_wide_right_after_the_load_came_in_above_its_forecast() -> None:
    """One crowd in a calm day is beyond the 95 % quantile's tail; ``recent`` = 2 keeps its error
    in the margin for the two closed steps after it, then the calm band is back."""
    rel = ForecastRelease(quantile=0.95, window=288, min_steps=24, recent=2)
    calm = ForecastRelease(quantile=0.95, window=288, min_steps=24)
    series: list[float] = []
    margins: list[tuple[float | None, float | None]] = []
    for n in range(60):
        series.append(300.0 if n == 50 else 100.0 + (1.0 if n % 2 else -1.0))
        for r in (rel, calm):
            r.record("m", series, n * STEP, STEP, _fc(100.0))
        margins.append((rel.margin("m"), calm.margin("m")))
    assert margins[49] == (1.0, 1.0)
    assert margins[50] == (200.0, 1.0) and margins[51] == (200.0, 1.0)
    assert margins[52] == (1.0, 1.0)
    with pytest.raises(ValueError):
        ForecastRelease(window=8, min_steps=4, recent=9)
