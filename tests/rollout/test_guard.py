"""The statistical guard with known inputs: Wilson and Newcombe bounds against published values,
Student's t and Welch's bounds on a ratio of geometric means, and the promote / hold / rollback
rule (rollout/guard.py), latency included."""

from __future__ import annotations

import math
import random

import pytest

from inferlb.config.rollout import RolloutCriteria, check_steps
from inferlb.rollout.guard import Counts, compare, guard
from inferlb.rollout.stats import LogMoments, diff_bounds, log_ratio_bounds, t_quantile, wilson, z_one_sided

Z95_TWO_SIDED = 1.959963984540054


def test_wilson_matches_published_values() -> None:
    # Newcombe (1998), Statistics in Medicine 17:857-872, table I: 81/263 → 0.2553 to 0.3662 (95 %).
    lo, hi = wilson(81, 263, Z95_TWO_SIDED)
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)
    # 0 events: the upper bound is z² / (n + z²), the lower 0.
    lo, hi = wilson(0, 100, Z95_TWO_SIDED)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(Z95_TWO_SIDED ** 2 / (100 + Z95_TWO_SIDED ** 2))
    assert wilson(0, 0, 1.96) == (0.0, 1.0)


def test_newcombe_difference_matches_the_published_example() -> None:
    # Newcombe (1998), Statistics in Medicine 17:873-890, method 10, example (a): 56/70 − 48/80 → 0.0524 to 0.3339.
    lo, hi = diff_bounds(56, 70, 48, 80, Z95_TWO_SIDED)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)


def test_one_sided_quantile() -> None:
    assert z_one_sided(0.95) == pytest.approx(1.6449, abs=1e-4)
    assert z_one_sided(0.99) == pytest.approx(2.3263, abs=1e-4)


def test_compare_statuses() -> None:
    z = z_one_sided(0.95)
    assert compare("errors", (0, 10), (0, 1000), margin=0.01, z=z, min_n=100).status == "collecting"
    # 5 % errors on 200 canary attempts against 0.1 % on 5,000: worse by more than 1 point.
    worse = compare("errors", (10, 200), (5, 5000), margin=0.01, z=z, min_n=100)
    assert worse.status == "worse" and worse.lower is not None and worse.lower > 0.01
    # 0 errors on 400: within 1 point of a 0.1 % baseline.
    assert compare("errors", (0, 400), (5, 5000), margin=0.01, z=z, min_n=100).status == "within"
    # 1 % on 100: neither shown worse nor shown within the 1-point margin.
    assert compare("errors", (1, 100), (5, 5000), margin=0.01, z=z, min_n=100).status == "inconclusive"


CRIT = RolloutCriteria(min_requests=100, confidence=0.95, max_error_rate_increase=0.01,
                       max_slo_miss_increase=0.05, min_step_s=30, max_step_s=600)
BASE = Counts(attempts=5000, failed=5, ok=4995, slo_missed=100)


def test_not_enough_requests_holds() -> None:
    v = guard(Counts(50, 0, 50, 0), BASE, CRIT, slo=True, step_age_s=60)
    assert v.action == "hold" and "collecting" in v.reason


def test_error_canary_is_rolled_back_slo_canary_too() -> None:
    v = guard(Counts(200, 10, 190, 4), BASE, CRIT, slo=True, step_age_s=60)
    assert v.action == "rollback" and "error rate" in v.reason
    slow = guard(Counts(400, 0, 400, 80), BASE, CRIT, slo=True, step_age_s=60)   # 20 % over the SLO vs 2 %
    assert slow.action == "rollback" and "SLO" in slow.reason
    # Without an SLO only the error test runs: the slow canary is not judged on latency.
    assert guard(Counts(400, 0, 400, 80), BASE, CRIT, slo=False, step_age_s=60).action == "promote"


def test_healthy_canary_is_promoted_only_after_min_step_s() -> None:
    healthy = Counts(400, 0, 400, 6)
    assert guard(healthy, BASE, CRIT, slo=True, step_age_s=10).action == "hold"
    v = guard(healthy, BASE, CRIT, slo=True, step_age_s=30)
    assert v.action == "promote" and [c.status for c in v.checks] == ["within", "within"]


def test_a_step_never_shown_safe_is_rolled_back_at_max_step_s() -> None:
    unclear = Counts(100, 1, 99, 2)
    assert guard(unclear, BASE, CRIT, slo=True, step_age_s=599).action == "hold"
    v = guard(unclear, BASE, CRIT, slo=True, step_age_s=600)
    assert v.action == "rollback" and "max_step_s" in v.reason


def test_a_bare_threshold_would_roll_back_on_noise_the_guard_does_not() -> None:
    # 2 errors in 100 attempts (2 %) against a 0.1 % baseline: a bare "error rate > 1 %" rule rolls
    # back; the bound says the data cannot tell yet (could be 0.2 %), so the guard holds.
    v = guard(Counts(100, 2, 98, 0), BASE, CRIT, slo=False, step_age_s=60)
    assert v.action == "hold" and v.checks[0].status == "inconclusive"


def test_criteria_and_steps_are_checked() -> None:
    with pytest.raises(ValueError):
        RolloutCriteria(min_step_s=100, max_step_s=10)
    with pytest.raises(ValueError):
        RolloutCriteria.model_validate({"confidnce": 0.9})
    assert check_steps([1, 5, 25, 50, 100]) == [1, 5, 25, 50, 100]
    bads: list[list[float]] = [[], [5, 1, 100], [1, 50], [0, 100], [50, 100, 100], [float("nan"), 100], [100]]
    for bad in bads:
        with pytest.raises(ValueError):
            check_steps(bad)


# -- latency ------------------------------------------------------------------------------------------

def _times(n: int, *, scale: float, seed: int, sigma: float = 0.5) -> LogMoments:
    """``n`` lognormal node times of median ``scale`` seconds (seeded), as the window sums them."""
    rng = random.Random(seed)
    total = LogMoments()
    for _ in range(n):
        x = math.log(scale) + rng.gauss(0.0, sigma)
        total = total + LogMoments(1, x, x * x)
    return total


def test_t_quantile_matches_the_tables() -> None:
    # Student's t, one-sided: 0.95 at df 5, 10, 30 and 0.99 at df 10 (any table of the t distribution).
    for conf, df, want in ((0.95, 5, 2.015), (0.95, 10, 1.812), (0.95, 30, 1.697), (0.99, 10, 2.764)):
        assert t_quantile(conf, df) == pytest.approx(want, abs=2e-3)
    assert t_quantile(0.95, math.inf) == pytest.approx(z_one_sided(0.95))


def test_log_ratio_bounds_cover_a_known_ratio() -> None:
    # Two fixed samples: logs {0, 1, 2} and {1, 2, 3} (means 1 and 2, variance 1 each): the ratio of
    # geometric means is e; Welch: se = sqrt(2/3), df = 4, t(0.95, 4) = 2.132.
    a = LogMoments(3, 3.0, 0.0 + 1.0 + 4.0)
    b = LogMoments(3, 6.0, 1.0 + 4.0 + 9.0)
    est, lo, hi = log_ratio_bounds(b, a, 0.95)
    half = 2.132 * math.sqrt(2 / 3)
    assert est == pytest.approx(math.e)
    assert lo == pytest.approx(math.exp(1 - half), rel=2e-3) and hi == pytest.approx(math.exp(1 + half), rel=2e-3)
    with pytest.raises(ValueError):
        log_ratio_bounds(LogMoments(1, 0.0, 0.0), a, 0.95)


LAT = RolloutCriteria(min_requests=100, confidence=0.95, max_error_rate_increase=0.01, max_latency_ratio=1.5,
                      min_step_s=30, max_step_s=600)


def _with(counts: Counts, **latency: LogMoments) -> Counts:
    return Counts(counts.attempts, counts.failed, counts.ok, counts.slo_missed, latency)


def test_a_2_9x_slower_canary_is_rolled_back_and_the_reason_says_which_metric_and_by_how_much() -> None:
    base = _with(BASE, e2e=_times(5000, scale=0.2, seed=1))
    slow = _with(Counts(400, 0, 400, 0), e2e=_times(400, scale=0.58, seed=2))
    v = guard(slow, base, LAT, slo=False, step_age_s=60)
    assert v.action == "rollback"
    lat = next(c for c in v.checks if c.test == "latency_e2e")
    assert lat.status == "worse" and lat.estimate == pytest.approx(2.9, rel=0.1)
    assert lat.lower is not None and 1.5 < lat.lower < 2.9
    assert v.reason.startswith("e2e (end-to-end time at the node) slower than the baseline: ")
    assert f"{lat.estimate:.2f}× its geometric mean" in v.reason and f"≥ {lat.lower:.2f}× at 0.95" in v.reason
    # The error test alone would have promoted it.
    assert [c.status for c in v.checks if c.test == "errors"] == ["within"]


def test_equal_latency_gives_no_latency_verdict() -> None:
    base = _with(BASE, ttft=_times(5000, scale=0.05, seed=3), tpot=_times(5000, scale=0.01, seed=4))
    same = _with(Counts(400, 0, 400, 0), ttft=_times(400, scale=0.05, seed=5), tpot=_times(400, scale=0.01, seed=6))
    v = guard(same, base, LAT, slo=False, step_age_s=60)
    assert v.action == "promote"
    assert {c.test: c.status for c in v.checks} == {"errors": "within", "latency_ttft": "within",
                                                    "latency_tpot": "within"}
    for c in v.checks[1:]:
        assert c.estimate is not None and 0.9 < c.estimate < 1.1 and c.upper is not None and c.upper <= 1.5


def test_too_few_times_hold_and_decide_nothing() -> None:
    base = _with(BASE, e2e=_times(5000, scale=0.2, seed=1))
    few = _with(Counts(400, 0, 400, 0), e2e=_times(30, scale=0.58, seed=2))    # 2.9× slower, but 30 < 100
    v = guard(few, base, LAT, slo=False, step_age_s=60)
    assert v.action == "hold" and "latency_e2e collecting (30/100 canary, 5000/100 baseline)" in v.reason
    assert next(c for c in v.checks if c.test == "latency_e2e").lower is None


def test_latency_tests_are_off_without_a_ratio_and_absent_without_times() -> None:
    base = _with(BASE, e2e=_times(5000, scale=0.2, seed=1))
    slow = _with(Counts(400, 0, 400, 0), e2e=_times(400, scale=0.58, seed=2))
    off = RolloutCriteria.model_validate({**LAT.model_dump(), "max_latency_ratio": None})
    assert guard(slow, base, off, slo=False, step_age_s=60).action == "promote"
    assert [c.test for c in guard(Counts(400, 0, 400, 0), BASE, LAT, slo=False, step_age_s=60).checks] == ["errors"]
    with pytest.raises(ValueError):
        RolloutCriteria(max_latency_ratio=1.0)     # "no slower at all" can never be shown
