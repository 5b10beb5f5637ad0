"""Closed-loop sessions in the DES (inferlb/simulator/des/closed.py): a turn leaves its think time
after the previous answer ended, never earlier; failures end a session; the open-loop path is the
same. Virtual time only."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from inferlb.simulator.des.closed import ClosedLoop, Session
from inferlb.simulator.des.prefix import PrefixCaches, PromptInfo
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.spec import BatchSpec, NodeSpec


@dataclass(frozen=True)
class Req:
    t: float
    prompt_tokens: int
    output_tokens: int = 20
    text: str = ""
    session: str | None = None
    model: str | None = "m"
    priority: str | None = None
    stream: bool = True


def node(name: str, *, delay: float = 0.0) -> NodeSpec:
    # 10 ms a step, 1 ms a prefilled token: a 20-token answer takes ~0.2 s, so an open-loop turn
    # 50 ms after the previous send would overlap it.
    return NodeSpec(name=name, models=["m"], prefix_cache=True, network_delay_s=delay,
                    batching=BatchSpec(kv_tokens=65_536, step_base_s=0.01, step_per_seq_s=0.0,
                                       prefill_s_per_token=0.001))


def sessions(n: int = 12, seed: int = 5) -> list[Session]:
    rng = random.Random(seed)
    out: list[Session] = []
    t = 0.0
    for k in range(n):
        t += rng.expovariate(4.0)
        turns = [Req(0.0, 200 + 100 * j, output_tokens=rng.randint(5, 40), text=f"s{k}" * (50 * (j + 1)),
                     session=f"s{k}") for j in range(rng.randint(2, 5))]
        out.append(Session(t, turns, [rng.expovariate(1 / 0.05) for _ in turns]))
    return out


def prompt_of(r: Req) -> PromptInfo | None:
    return PromptInfo(r.text, r.session) if r.text else None


def run(ss: list[Session], **kw: object) -> ClosedLoop:
    sim = ClosedLoop([node("a"), node("b", delay=0.02)], model="m", seed=1, prefill_cached=PrefixCaches(prompt_of),
                     **kw)  # type: ignore[arg-type]
    sim.run_sessions(ss)
    return sim


def test_a_turn_leaves_its_think_time_after_the_previous_answer_ended_never_before() -> None:
    ss = sessions()
    sim = run(ss)
    res = sim.results
    assert len(res) == sum(len(s.turns) for s in ss) and res.counts()["ok"] == len(res)
    row = {kj: i for i, kj in enumerate(sim.turn_of)}
    follow = 0
    for i, (k, j) in enumerate(sim.turn_of):
        assert sim.requests[i].t == res.t[i]
        if j == 0:
            assert res.t[i] == ss[k].start           # sessions arrive open loop, at their planned start
            continue
        p = row[(k, j - 1)]
        end = res.t[p] + res.e2e[p]                  # when the client had the previous answer (delay included)
        assert res.t[i] >= end
        assert res.t[i] == pytest.approx(end + ss[k].think_s[j - 1], abs=1e-9)   # the plan's think time
        follow += 1
    assert follow > 20
    # the rows are in arrival order
    assert list(res.t) == sorted(res.t)


def test_the_previous_answer_is_cached_before_the_next_turn_arrives() -> None:
    ss = [Session(0.0, [Req(0.0, 640, text="x" * 2560, session="s"), Req(0.0, 700, text="x" * 2560 + "y" * 240,
                                                                         session="s")], [0.0, 0.0])]
    sim = ClosedLoop([node("a")], model="m", seed=1, prefill_cached=(caches := PrefixCaches(prompt_of)))
    sim.run_sessions(ss)
    # zero think time: the second turn arrives the instant the first ends, its prefix already cached
    assert sim.results.t[1] == sim.results.e2e[0]
    assert caches.cached[1] >= 639


def test_same_sessions_same_run() -> None:
    a, b = run(sessions()), run(sessions())
    for col in ("t", "ttft", "e2e", "node", "outcome", "tokens"):
        assert getattr(a.results, col).tobytes() == getattr(b.results, col).tobytes()
    assert a.turn_of == b.turn_of and a.events == b.events


def test_one_turn_sessions_replay_the_open_loop_run_exactly() -> None:
    rng = random.Random(2)
    plan: list[Req] = []
    t = 0.0
    for k in range(60):
        t += rng.expovariate(2.0)
        plan.append(Req(t, rng.randint(100, 900), output_tokens=rng.randint(5, 60), text=f"p{k % 7}" * 200,
                        session=f"p{k}"))
    open_res = Simulation([node("a"), node("b", delay=0.02)], model="m", seed=1, timeout_s=1.5,
                          prefill_cached=PrefixCaches(prompt_of)).run(plan)
    closed = ClosedLoop([node("a"), node("b", delay=0.02)], model="m", seed=1, timeout_s=1.5,
                        prefill_cached=PrefixCaches(prompt_of))
    res = closed.run_sessions([Session(r.t, [r], []) for r in plan])
    for col in ("t", "ttft", "e2e", "queue", "node", "outcome", "tokens"):
        assert getattr(res, col).tobytes() == getattr(open_res, col).tobytes()     # NaN-safe, bit for bit
    assert res.end_s == open_res.end_s and closed.abandoned == closed.cut == 0
    counts = res.counts()
    assert counts["ok"] > 20 and counts["timeout"] > 0     # both paths of a row's end were exercised


def test_a_turn_that_is_not_ok_ends_its_session() -> None:
    ss = sessions()
    sim = run(ss, timeout_s=0.05)     # every answer takes longer: each first turn times out
    res = sim.results
    assert all(j == 0 for _, j in sim.turn_of)
    assert res.counts()["timeout"] == len(ss) == len(res)
    assert sim.abandoned == sum(len(s.turns) - 1 for s in ss)


def test_no_turn_is_sent_at_or_after_stop_s() -> None:
    ss = sessions()
    full = run(ss)
    stop = full.results.t[len(full.results) // 2]
    sim = ClosedLoop([node("a"), node("b", delay=0.02)], model="m", seed=1, prefill_cached=PrefixCaches(prompt_of))
    res = sim.run_sessions(ss, stop_s=stop)
    assert max(res.t) < stop
    assert len(res) + sim.cut == len(full.results)
    assert list(res.t) == [t for t in full.results.t if t < stop]     # the window's arrivals are the same
