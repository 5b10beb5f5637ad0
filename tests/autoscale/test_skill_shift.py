"""The skill gate, the level-shift guard and the planner's rise path (issue 22, item 7).

Every test drives the objects with the history's end as its clock (steps of 300 s handed in by the
test): no wall clock, no sleep."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest

from inferlb.autoscale.forecast import Forecast
from inferlb.autoscale.planner import plan
from inferlb.autoscale.policy import Autoscaler, LoadHistory
from inferlb.autoscale.shift import LevelShiftGuard, noise_scale
from inferlb.autoscale.skill import SkillGate
from tests.autoscale.one_pool import CAP, STEP, Fixed, one_pool

# ------------------------------------------------------------------ the skill gate


def _feed(gate: SkillGate, series: list[float], forecast_of: Callable[[Sequence[float]], float],
          start: int = 3) -> list[Forecast]:
    out = []
    for n in range(start, len(series) + 1):
        hist = series[:n]
        out.append(gate.gate("m", hist, n * STEP, STEP, Forecast((float(forecast_of(hist)),) * 3, "hw")))
    return out


def test_gate_falls_back_to_the_last_value_when_the_forecast_is_worse_than_persistence() -> None:
    rng = random.Random(1)
    series = [100.0 + rng.gauss(0, 5) for _ in range(40)]
    gate = SkillGate(window=12, min_steps=6)
    # a forecast that wiggles by ±30 around the level: worse than the last value held
    out = _feed(gate, series, lambda h: 100.0 + (30.0 if len(h) % 2 else -30.0))
    assert all(f.method == "hw" for f in out[:6])            # open until min_steps are measured
    assert gate.closed("m") and out[-1].method == "reactive"
    assert out[-1].values == (series[-1],) * 3
    assert out[-1].fallback is not None and "no skill over persistence" in out[-1].fallback
    ef, ep = gate.errors("m")
    assert ef > ep > 0


def test_gate_keeps_a_forecast_that_beats_persistence() -> None:
    # a daily-like ramp the forecast knows exactly: persistence lags it by one step each time
    series = [10.0 * i for i in range(40)]
    gate = SkillGate(window=12, min_steps=6)
    out = _feed(gate, series, lambda h: h[-1] + 10.0)
    assert not gate.closed("m") and all(f.method == "hw" for f in out)
    assert gate.errors("m") == (0.0, 120.0)


def test_gate_advances_once_per_closed_step_and_starts_over_after_a_gap() -> None:
    gate = SkillGate(window=4, min_steps=2)
    hist = [1.0, 2.0, 3.0]
    for _ in range(3):                                      # every round of one step: one measurement
        gate.gate("m", hist, 900.0, STEP, Forecast((9.0,), "hw"))
    gate.gate("m", [*hist, 4.0], 1200.0, STEP, Forecast((9.0,), "hw"))
    assert gate.errors("m") == (5.0, 1.0)
    gate.gate("m", [*hist, 4.0, 5.0, 6.0], 1800.0, STEP, Forecast((9.0,), "hw"))   # two steps at once: a gap
    assert gate.errors("m") == (0.0, 0.0)


def test_gate_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        SkillGate(window=4, min_steps=5)


def test_autoscaler_plans_on_the_observed_load_while_the_gate_is_closed() -> None:
    """A forecaster that overshoots a flat load (~90 tokens/s) to 150 on every other step: without
    the gate the plan keeps the overshoot's replicas; with it, once min_steps are measured, the plan
    follows the load (90 / 0.5 / 100 → 2 replicas)."""
    wiggle = Fixed(lambda h: 150.0 if len(h) % 2 else 90.0)
    desired: dict[bool, list[int]] = {}
    for gated in (False, True):
        rng = random.Random(2)
        scaler = Autoscaler(one_pool(), wiggle, skill_gate=SkillGate(window=8, min_steps=4) if gated else None)
        series = [90.0 + rng.uniform(-1, 1) for _ in range(24)]
        got = []
        for n in range(10, 25):
            scaler.observe(LoadHistory(STEP, n * STEP, {"m": series[:n]}))
            scaler.forecast()
            got.append(scaler.plan(now=n * STEP, current={("m", "l4"): 2}, capacity=CAP).pools[0].recommended)
        desired[gated] = got
    assert 3 in desired[False][-6:]                          # 150 / 0.5 / 100 on the overshooting steps
    assert desired[True][-6:] == [2] * 6


# ------------------------------------------------------------------ the level-shift guard


def test_noise_scale_reads_the_steps_noise_not_the_level() -> None:
    rng = random.Random(3)
    series = [1000.0 + rng.gauss(0, 10) for _ in range(288)]
    assert 7.0 < noise_scale(series, window=288, min_share=0.0) < 13.0
    assert noise_scale([5.0] * 10, window=288, min_share=0.02) == pytest.approx(0.1)


def test_guard_relevels_after_a_step_down_and_lets_go_when_the_forecaster_caught_up() -> None:
    rng = random.Random(4)
    series = [200.0 + rng.gauss(0, 2) for _ in range(60)]
    guard = LevelShiftGuard(k=2, z=3.0, window=48)
    lagging = 200.0                                          # a forecaster that follows slowly (alpha 0.1)
    shifts = []
    for n in range(50, 80):
        if n > 60:
            series.append(100.0 + rng.gauss(0, 2))          # the level halves at step 61
        hist = series[:n] if n <= 60 else series
        lagging += 0.1 * (hist[-1] - lagging)
        f = guard.correct("m", hist, n * STEP, STEP, Forecast((lagging,) * 3, "slow"))
        shifts.append((n, guard.shifted("m"), f.values[0]))
    down = [n for n, s, _ in shifts if s == "down"]
    assert down and down[0] <= 63                            # k = 2 steps beyond 3 sigma
    after = [v for n, _, v in shifts if down[0] <= n < down[0] + 5]
    assert all(abs(v - 100.0) < 25.0 for v in after)         # re-levelled, not the lagging ~150
    assert guard.offset("m") == 0.0 or abs(shifts[-1][2] - 100.0) < 25.0


def test_guard_leaves_a_noisy_flat_series_alone() -> None:
    rng = random.Random(5)
    series = [300.0 + rng.gauss(0, 10) for _ in range(400)]
    guard = LevelShiftGuard(k=2, z=3.0)
    for n in range(100, 400):
        f = guard.correct("m", series[:n], n * STEP, STEP, Forecast((300.0,) * 2, "flat"))
        assert f.values == (300.0, 300.0)
    assert guard.detections("m") == 0


def test_a_detected_step_down_clears_the_stabilisation_window_once() -> None:
    """A forecaster stuck at the old level: the plan goes down in the round the guard detects the
    step down (stabilisation cleared), and without the guard it is held by the forecast."""
    stuck = Fixed(200.0)
    for guarded in (False, True):
        scaler = Autoscaler(one_pool(), stuck, level_shift=LevelShiftGuard(k=2, z=3.0) if guarded else None)
        series = [200.0 + (1.0 if i % 2 else -1.0) for i in range(30)]
        replicas = 4                                          # 200 / 0.5 / 100
        for n in range(30, 36):
            series.append((200.0 if n < 32 else 90.0) + (1.0 if n % 2 else -1.0))   # falls at step 32
            for r in range(5):                                # five rounds per step
                now = n * STEP + 60.0 * r
                scaler.observe(LoadHistory(STEP, n * STEP, {"m": list(series)}))
                scaler.forecast()
                replicas = scaler.plan(now=now, current={("m", "l4"): replicas}, capacity=CAP).pools[0].desired
        assert replicas == (2 if guarded else 4)
        assert scaler.releases == (1 if guarded else 0)


# ------------------------------------------------------------------ the rise path


def test_rise_path_fires_at_the_target_when_the_round_jumps_over_the_last_step() -> None:
    c = one_pool(burst_factor=1.0)
    cur = {("m", "l4"): 4}                                    # serve 400 tokens/s at capacity
    fc = {"m": Forecast((150.0,) * 3, "test")}

    def desired(recent: float, observed: float, ratio: float | None) -> tuple[int, bool]:
        p, _ = plan(c, now=0.0, forecasts=fc, observed={"m": observed}, capacity=CAP, current=cur, step_s=STEP,
                    recent={"m": recent}, rise_ratio=ratio)
        return p.pools[0].desired, p.pools[0].burst

    # 300 tokens/s this round: within the 400 the replicas serve at capacity, beyond 0.5 × 400
    assert desired(300.0, 150.0, None) == (3, False)          # the burst path alone: the forecast's 150 decides
    assert desired(300.0, 150.0, 1.5) == (6, True)            # risen 2x over the last step: 300 / 0.5, at once
    assert desired(300.0, 250.0, 1.5) == (5, False)           # risen 1.2x only: the observed 250 decides
    with pytest.raises(ValueError):
        Autoscaler(c, rise_ratio=1.0)
