"""The feedback guard (tiers/guard.py) on an injected clock: it trips on a rising error or SLO-miss
rate, sends probes only, restores after the cool-down with hysteresis, and counts only its window."""

from __future__ import annotations

from inferlb.config.tiers import TierGuardConfig
from inferlb.tiers.guard import TierGuard
from inferlb.types import ManualClock

CFG = TierGuardConfig(window_s=60, min_requests=10, max_error_rate=0.1, max_slo_miss_rate=0.2, recover_ratio=0.5,
                      cooldown_s=30, probe_share=0.1)


def feed(g: TierGuard, clock: ManualClock, n: int, *, errors: int = 0, missed: int = 0,
         step: float = 0.1) -> list[bool]:
    out = []
    for i in range(n):
        t = g.observe(clock.monotonic(), error=i < errors, slo_missed=errors <= i < errors + missed)
        if t is not None:
            out.append(t.tripped)
        clock.advance(step)
    return out


def test_it_trips_on_errors_only_past_min_requests_and_the_threshold() -> None:
    clock = ManualClock()
    g = TierGuard(CFG)
    assert feed(g, clock, 9, errors=9) == []          # 9 < min_requests: no decision yet
    g2 = TierGuard(CFG)
    assert feed(g2, clock, 10, errors=1) == []        # 10 % is not above 10 %
    assert feed(g, clock, 1) == [True]                # 9 of 10 failed
    assert g.tripped and "error rate 0.900 > 0.1" in g.reason and g.trips == 1
    assert g.takes(0.05) and not g.takes(0.5)         # probes (share 0.1) only


def test_it_trips_on_slo_misses_and_restores_with_hysteresis_after_the_cool_down() -> None:
    clock = ManualClock()
    g = TierGuard(CFG)
    assert feed(g, clock, 9, missed=2) == []          # 2/9, but under min_requests
    assert feed(g, clock, 1, missed=1) == [True]      # the 10th: 3/10 = 30 % > 20 %
    assert "SLO-miss rate" in g.reason
    # Probes at 15 % misses: under the threshold but over 0.5 x it: held, even after the cool-down.
    clock.advance(31)
    assert feed(g, clock, 20, missed=3) == [] and g.tripped
    # The window moves on; good probes (none missed) restore once the cool-down is over.
    clock.advance(61)
    assert feed(g, clock, 10) == [False]
    assert not g.tripped and g.restores == 1 and g.takes(0.99)


def test_no_restore_inside_the_cool_down_and_half_open_without_probes() -> None:
    clock = ManualClock()
    g = TierGuard(CFG)
    feed(g, clock, 10, errors=10)
    assert g.tripped
    assert feed(g, clock, 10, step=1.0) == []         # clean probes, but only 10 s after the trip
    clock.advance(25)
    assert g.update(clock.monotonic()) is not None and not g.tripped
    half = TierGuard(CFG.model_copy(update={"probe_share": 0.0}))
    feed(half, clock, 10, errors=10)
    assert half.tripped and not half.takes(0.0)
    clock.advance(29)
    assert half.update(clock.monotonic()) is None
    clock.advance(1)
    t = half.update(clock.monotonic())
    assert t is not None and not t.tripped and "half-open" in t.reason
    assert half.rates(clock.monotonic())[0] == 0      # a fresh window


def test_old_outcomes_leave_the_window() -> None:
    clock = ManualClock()
    g = TierGuard(CFG)
    feed(g, clock, 5, errors=5)
    clock.advance(61)
    assert feed(g, clock, 10) == [] and not g.tripped  # the old errors are out of the window
    assert g.rates(clock.monotonic())[1] == 0.0
