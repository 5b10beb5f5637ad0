"""The feedback hook: on_finish with the decision and the node's own times, ticks off the request path,
and the learned router's loop (observe, train, route) closed in virtual time."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from inferlb.routing.profiles import build_router
from inferlb.simulator.des.admission import ADMIT, QUEUE, Pools, Verdict
from inferlb.simulator.des.feedback import Finished, LearnedFeedback
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.presets import preset_spec
from inferlb.simulator.spec import BatchSpec, NodeSpec


@dataclass(frozen=True)
class Req:
    t: float
    prompt_tokens: int = 100
    output_tokens: int = 10
    model: str | None = "m"
    priority: str | None = None
    stream: bool = True


def node(name: str, step: float = 0.01) -> NodeSpec:
    return NodeSpec(name=name, models=["m"], batching=BatchSpec(kv_tokens=65_536, step_base_s=step,
                                                                step_per_seq_s=0.0, prefill_s_per_token=0.0))


class OneAtATime:
    """A gateway that runs one request at a time and queues the rest (FIFO)."""

    def __init__(self) -> None:
        self.busy = False
        self.queue: list[int] = []

    def admit(self, i: int, pool: str, priority: str | None, now: float, pools: Pools) -> Verdict:
        if self.busy:
            self.queue.append(i)
            return Verdict(QUEUE)
        self.busy = True
        return Verdict(ADMIT)

    def release(self, i: int, now: float, ok: bool, pools: Pools) -> list[int]:
        if self.queue:
            return [self.queue.pop(0)]
        self.busy = False
        return []

    def tick(self, now: float, pools: Pools) -> tuple[list[int], list[tuple[int, str]]]:
        return [], []

    def next_timer(self) -> float | None:
        return None


@dataclass
class Recorder:
    tick_s: float = 0.5
    done: list[Finished] = field(default_factory=list)
    ticks: list[float] = field(default_factory=list)

    def on_finish(self, done: Finished) -> None:
        self.done.append(done)

    def tick(self, now: float) -> None:
        self.ticks.append(now)


def test_on_finish_gets_the_decision_and_the_nodes_times_not_the_gateway_queue() -> None:
    fb = Recorder()
    # Gateway cap 1: the second request waits in the gateway queue until the first ends (0.1 s).
    sim = Simulation([node("a")], model="m", seed=1, feedback=fb, admission=OneAtATime())
    res = sim.run([Req(0.0, output_tokens=10), Req(0.0, output_tokens=5, stream=False), Req(0.2, model="other")])
    by_row = {d.row: d for d in fb.done}
    assert set(by_row) == {0, 1, 2}
    first, second, none = by_row[0], by_row[1], by_row[2]
    assert first.outcome == "ok" and first.node == "a" and first.decision.pick == "a" and first.stream
    assert first.ttft_s == pytest.approx(0.01) and first.e2e_s == pytest.approx(0.10) and first.tokens == 10
    # Node's time: 5 steps of 10 ms, although the client waited for the first request too.
    assert second.queue_s == pytest.approx(0.10) and second.e2e_s == pytest.approx(0.05)
    assert res.e2e[1] == pytest.approx(second.queue_s + second.e2e_s) and not second.stream
    assert none.outcome == "no_node" and none.node is None and none.e2e_s is None
    assert all(d.at >= d.request.t for d in fb.done)


def test_on_finish_for_failures_and_timeouts_and_ticks_at_a_fixed_virtual_period() -> None:
    fb = Recorder(tick_s=0.25)
    sim = Simulation([node("a", step=0.1)], model="m", seed=1, timeout_s=1.0, feedback=fb)
    sim.run([Req(0.0, output_tokens=100), Req(0.0, output_tokens=2)])
    assert sorted((d.row, d.outcome) for d in fb.done) == [(0, "timeout"), (1, "ok")]
    assert fb.ticks[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert all(b - a == pytest.approx(0.25) for a, b in zip(fb.ticks, fb.ticks[1:], strict=False))
    with pytest.raises(ValueError, match="tick_s"):
        Simulation([node("a")], model="m", feedback=Recorder(tick_s=0.0))


def test_learned_feedback_closes_the_loop_in_virtual_time() -> None:
    router = build_router("learned", seed=3, predictor={"min_samples": 20})
    fb = LearnedFeedback(router, log=True, failure_cost_s=60.0)
    assert fb.tick_s == pytest.approx(0.25)     # the lifecycle's train_interval_s
    specs = [preset_spec("fast", "h100", ["m"]), preset_spec("slow", "l4", ["m"])]
    reqs = [Req(i * 0.05, prompt_tokens=100 + (i * 37) % 400, output_tokens=8 + (i * 13) % 120, stream=i % 3 != 0)
            for i in range(600)]
    res = Simulation(specs, router=router, model="m", seed=3, feedback=fb).run(reqs)
    lc = router.lifecycle
    assert res.counts()["ok"] == 600
    assert fb.observed == 600 and fb.trained == lc.learned >= 580   # the last few may wait for a tick
    assert lc.state == "active" and lc.fallbacks_total >= 20        # token-aware decided while it warmed up
    # Only decisions the learned policy made itself are logged, each with its propensity and cost.
    assert 0 < len(fb.logged) == 600 - lc.fallbacks_total == len(fb.logged_rows)
    for row, dec in zip(fb.logged_rows, fb.logged, strict=True):
        assert 0 < dec.learned["propensity"] <= 1 and dec.learned.get("fallback") is None
        assert dec.reward == pytest.approx(res.e2e[row]) and not math.isnan(dec.reward)
    with pytest.raises(ValueError, match="lifecycle"):
        LearnedFeedback(build_router("token-aware"))
