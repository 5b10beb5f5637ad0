"""The statistical guard with known inputs: Wilson and Newcombe bounds against published values,
and the promote / hold / rollback rule (rollout/guard.py)."""

from __future__ import annotations

import pytest

from inferlb.config.rollout import RolloutCriteria, check_steps
from inferlb.rollout.guard import Counts, compare, guard
from inferlb.rollout.stats import diff_bounds, wilson, z_one_sided

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
    for bad in ([], [5, 1, 100], [1, 50], [0, 100], [50, 100, 100], [float("nan"), 100], [100]):
        with pytest.raises(ValueError):
            check_steps(bad)
