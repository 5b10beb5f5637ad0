"""Backoff: Envoy full jitter, bounds and mean over 10⁴ draws."""

from __future__ import annotations

import random
import statistics

import pytest

from inferlb.tasks.retry import backoff_delay


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
def test_full_jitter_range_and_mean(n: int) -> None:
    rng = random.Random(n)
    upper = min(0.25, (2**n - 1) * 0.025)
    xs = [backoff_delay(n, 0.025, 0.25, rng.random()) for _ in range(10_000)]
    assert all(0 <= x < upper for x in xs)
    assert statistics.mean(xs) == pytest.approx(upper / 2, rel=0.03)
