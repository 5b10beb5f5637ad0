"""The cost-tier simulation (benchmarks/tiers_sim.py), on a short plan: tiered costs less than
all-strong and serves more than all-cheap; when the cheap tier degrades, the guard trips and keeps
the good share up where the same tiers without a guard lose it; a run is deterministic."""

from __future__ import annotations

from typing import Any

from benchmarks.tiers_sim import simulate, workload

DURATION = 120.0


def test_tiered_sits_between_all_strong_and_all_cheap_and_the_guard_catches_a_degraded_tier() -> None:
    reqs = workload(3, 6.0, DURATION)
    kw: dict[str, Any] = {"threshold": 0.25, "duration_s": DURATION, "seed": 3}
    strong = simulate("strong", "healthy", reqs, **kw).row()
    cheap = simulate("cheap", "healthy", reqs, **kw).row()
    tiered = simulate("tiered", "healthy", reqs, **kw).row()
    assert cheap["cost_usd"] < tiered["cost_usd"] < strong["cost_usd"]
    assert tiered["good_share"] > cheap["good_share"] + 0.03
    assert 0.5 < tiered["small_share"] < 0.95 and tiered["guard_trips"] == 0
    blind = simulate("tiered-noguard", "degraded", reqs, **kw).row()
    guarded = simulate("tiered", "degraded", reqs, **kw).row()
    assert guarded["guard_trips"] >= 1 and blind["guard_trips"] == 0
    assert guarded["trip_after_fault_s"] is not None and 0 <= guarded["trip_after_fault_s"] < 60
    assert guarded["good_after_fault"] > blind["good_after_fault"] + 0.1
    assert simulate("tiered", "degraded", reqs, **kw).row() == guarded
