"""The backtest's offline optimum (bench/autoscale_optimum.py) against an exhaustive search."""

from __future__ import annotations

import itertools
import random

import pytest

from inferlb.bench.autoscale_optimum import offline_optimum


def _ready(pattern: tuple[int, ...], k: int, before: int) -> list[bool]:
    """When one replica billed on ``pattern`` serves: once billed for more than k steps in a row,
    ``before`` of them before the window (when billed from step 0 on)."""
    out, run = [], before
    for b in pattern:
        run = run + 1 if b else 0
        out.append(bool(b) and run > k)
    return out


def _brute(need: list[int], k: int, ready0: int, replicas: int) -> int:
    """The least billed steps over every on/off pattern of every replica; a replica not ready at
    the start may also be started 1..k steps before the window (billed that much more)."""
    steps = len(need)
    options: list[list[tuple[int, list[bool]]]] = []
    for j in range(replicas):
        opts = []
        for p in itertools.product((0, 1), repeat=steps):
            if j < ready0:
                opts.append((sum(p), _ready(p, k, k)))     # ready at the start: as if started long before
                continue
            for m in range(k + 1):
                opts.append((sum(p) + m, _ready(p, k, m)))
        options.append(opts)
    best = None
    for combo in itertools.product(*options):
        if all(sum(r[t] for _, r in combo) >= need[t] for t in range(steps)):
            cost = sum(c for c, _ in combo)
            best = cost if best is None else min(best, cost)
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_optimum_is_the_least_schedule_an_exhaustive_search_finds(seed: int) -> None:
    rng = random.Random(seed)
    steps, k = 7, rng.choice([1, 2])
    need = [rng.choice([0, 1, 1, 2]) for _ in range(steps)]
    need[0] = rng.choice([0, 1, 2])
    ready0 = need[0]
    got = offline_optimum([float(n) for n in need], 1.0, step_s=3600.0, cold_start_s=k * 3600.0, min_replicas=0,
                          ready_at_start=ready0)
    assert got["need"] == need
    assert got["gpu_hours"] == _brute(need, k, ready0, 2)


def test_gaps_shorter_than_the_cold_start_are_bridged_and_longer_ones_stopped() -> None:
    # one replica needed, then 1 idle step, then needed again: bridging (1) beats a restart (cold start 2)
    short = offline_optimum([1, 0, 1], 1.0, step_s=3600, cold_start_s=7200, min_replicas=0)
    assert short["gpu_hours"] == 3 and short["billed"] == [1, 1, 1]
    # a gap of 4 with a cold start of 2: stop, then start again 2 steps early
    long = offline_optimum([1, 0, 0, 0, 0, 1], 1.0, step_s=3600, cold_start_s=7200, min_replicas=0)
    assert long["gpu_hours"] == 1 + 2 + 1 and long["billed"] == [1, 0, 0, 1, 1, 1]
    # a replica not ready at the start pays its cold start before the window
    cold = offline_optimum([2, 2], 1.0, step_s=3600, cold_start_s=3600, min_replicas=0, ready_at_start=1)
    assert cold["gpu_hours"] == 2 + 2 + 1
    # demand in tokens/s over a replica's capacity, floored at min_replicas and capped at max
    assert offline_optimum([0, 250, 5000], 100.0, step_s=60, cold_start_s=0, max_replicas=10)["need"] == [1, 3, 10]
    with pytest.raises(ValueError):
        offline_optimum([1.0], 0.0, step_s=60, cold_start_s=0)
