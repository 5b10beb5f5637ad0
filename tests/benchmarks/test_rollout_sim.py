"""The rollout simulation (benchmarks/rollout_sim.py): the real split, routing core, window and
rollout.bpmn over the emulator's engine in virtual time. A healthy v2 is promoted to 100 %, a v2
whose attempts fail 5 % of the time is rolled back at the first step, one twice as slow is rolled
back on its time per output token once its share loads its nodes, and no request fails."""

from __future__ import annotations

import asyncio

from benchmarks.rollout_sim import main, simulate


def test_healthy_v2_is_promoted_through_every_step() -> None:
    o = asyncio.run(simulate("healthy", rate=40.0, max_s=1500.0, seed=1))
    assert o.state == "completed" and o.failed == 0 and o.v2_faulted == 0
    assert [p for _, _, p in o.timeline] == [1.0, 5.0, 25.0, 50.0, 100.0]
    assert o.decided_after_s is not None and o.decided_after_s >= 4 * 30   # min_step_s at each of 4 steps


def test_v2_with_5_percent_errors_is_rolled_back_at_1_percent() -> None:
    o = asyncio.run(simulate("errors", rate=40.0, max_s=1500.0, seed=1))
    assert o.state == "rolled_back" and "error rate" in (o.reason or "")
    assert [p for _, _, p in o.timeline] == [1.0, 0.0]
    assert o.failed == 0                                   # every faulted attempt was retried elsewhere
    assert 0 < o.v2_served / o.requests < 0.02              # the bad version served about its 1 %


def test_v2_twice_as_slow_is_rolled_back_on_latency() -> None:
    o = asyncio.run(simulate("latency2x", rate=40.0, max_s=2100.0, seed=1))
    assert o.state == "rolled_back" and o.failed == 0
    assert (o.reason or "").startswith("tpot (time per output token at the node) slower than the baseline")
    # At 1 % and 5 % its idle nodes keep up with v1's loaded ones; the 25 % step loads them.
    assert [p for _, _, p in o.timeline] == [1.0, 5.0, 25.0, 0.0]


def test_the_command_prints_a_line_per_scenario(capsys: object) -> None:
    assert main(["--scenarios", "errors", "--max-s", "200"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "errors" in out and "SLO from the warm-up" in out
