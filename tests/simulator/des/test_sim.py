"""The event loop: ordering, the virtual clock, cold starts, drains, the controller hook, outcomes."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pytest

from inferlb.routing.profiles import build_router
from inferlb.simulator.des.admission import OpenAdmission
from inferlb.simulator.des.engine import FastCore
from inferlb.simulator.des.node import DesNode
from inferlb.simulator.des.results import OUTCOMES
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


def node(name: str, step: float = 0.01, kv: int = 65_536) -> NodeSpec:
    return NodeSpec(name=name, models=["m"], batching=BatchSpec(kv_tokens=kv, step_base_s=step, step_per_seq_s=0.0,
                                                                prefill_s_per_token=0.0))


def test_a_single_request_takes_exactly_the_engines_time() -> None:
    sim = Simulation([node("a")], model="m", seed=1)
    res = sim.run([Req(1.0, output_tokens=10)])
    (row,) = list(res.rows())
    assert row.outcome == "ok" and row.node == "a" and row.tokens == 10
    assert math.isclose(row.ttft or 0, 0.01) and math.isclose(row.e2e or 0, 0.10)   # 10 steps of 10 ms
    assert res.end_s == pytest.approx(1.10)


def test_node_steps_at_t_come_before_an_arrival_at_t() -> None:
    # The first request's 5th (last) step ends at exactly t = 0.05: the second, arriving then,
    # must find the node idle (composed on arrival, no wait for a step in progress).
    sim = Simulation([node("a", step=0.01)], model="m", seed=1)
    res = sim.run([Req(0.0, output_tokens=5), Req(0.05, output_tokens=1)])
    assert res.e2e[1] == pytest.approx(0.01)
    fc = FastCore(node("a").batching)   # type: ignore[arg-type]
    s0 = fc.submit(100, 5, 0.0)
    fc.advance(0.05)
    assert s0.finished_at == pytest.approx(0.05)


def test_same_seed_same_results_and_no_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    reqs = [Req(i * 0.013, prompt_tokens=50 + i % 300, output_tokens=1 + (i * 7) % 90) for i in range(600)]
    specs = [preset_spec(f"n{i}", p, ["m"]) for i, p in enumerate(["h100", "a100", "l4", "t4"])]
    first = Simulation(specs, model="m", seed=3).run(reqs)

    def no_clock() -> float:
        raise AssertionError("the simulation read the wall clock")

    monkeypatch.setattr(time, "monotonic", no_clock)
    monkeypatch.setattr(time, "time", no_clock)
    again = Simulation(specs, model="m", seed=3).run(reqs)
    assert list(first.rows()) == list(again.rows())
    assert {n.name for n in first.nodes} == {"n0", "n1", "n2", "n3"}
    assert first.counts()["ok"] == 600


def test_requests_must_come_sorted() -> None:
    with pytest.raises(ValueError, match="sorted"):
        Simulation([node("a")], model="m").run([Req(2.0), Req(1.0)])


def test_cold_start_node_takes_traffic_only_when_ready_and_costs_from_the_start() -> None:
    added: list[float] = []

    def controller(sim: Simulation) -> None:
        if not added:
            added.append(sim.now)
            sim.add_node(node("b"), cold_start_s=30.0)

    sim = Simulation([node("a")], model="m", seed=1, controller=controller, control_every_s=10.0)
    res = sim.run([Req(float(t)) for t in range(0, 80)])
    assert added == [10.0]
    b = next(n for n in res.nodes if n.name == "b")
    assert b.added_at == 10.0 and b.ready_at == 40.0
    on_b = [r.t for r in res.rows() if r.node == "b"]
    assert on_b and min(on_b) >= 40.0
    assert b.up_s(res.end_s) == pytest.approx(res.end_s - 10.0)     # the cold start is paid for
    assert sum(res.gpu_hours().values()) == pytest.approx((res.end_s + res.end_s - 10.0) / 3600)


def test_drain_stops_routing_and_removes_when_idle() -> None:
    def controller(sim: Simulation) -> None:
        if sim.now == 5.0:
            sim.drain_node("a")
            assert [n.state for n in sim.nodes_info() if n.name == "a"] in (["draining"], [])

    sim = Simulation([node("a"), node("b")], model="m", seed=1, controller=controller, control_every_s=5.0)
    reqs = [Req(i * 0.25, output_tokens=40) for i in range(60)]
    res = sim.run(reqs)
    a = next(n for n in res.nodes if n.name == "a")
    assert a.removed_at is not None and 5.0 <= a.removed_at <= 5.5   # its last request ended
    assert all(r.node == "b" for r in res.rows() if r.t > 5.0)
    assert res.counts()["ok"] == 60


def test_remove_node_fails_what_runs_on_it() -> None:
    def controller(sim: Simulation) -> None:
        if sim.now == 1.0:
            sim.remove_node("a")

    sim = Simulation([node("a")], model="m", seed=1, controller=controller, control_every_s=1.0)
    res = sim.run([Req(0.5, output_tokens=1000), Req(2.0)])
    rows = list(res.rows())
    assert rows[0].outcome == "failed" and rows[0].reason == "the node was removed"
    assert rows[1].outcome == "no_node"


def test_controller_runs_every_period_with_a_window_of_counts() -> None:
    seen: list[tuple[float, int, int]] = []

    def controller(sim: Simulation) -> None:
        w = sim.take_window()
        seen.append((sim.now, w.arrivals, w.completed))

    sim = Simulation([node("a")], model="m", seed=1, controller=controller, control_every_s=2.0)
    sim.run([Req(i * 0.5) for i in range(16)])     # arrivals 0 .. 7.5 s
    # timers at t run before an arrival at t: the window ending at 2.0 holds 0, 0.5, 1, 1.5; the
    # run ends when the last request (7.5 s) is answered, before a control at 8.0
    assert seen == [(2.0, 4, 4), (4.0, 4, 4), (6.0, 4, 4)]


def test_client_timeout_aborts_on_the_node() -> None:
    sim = Simulation([node("a", step=0.1)], model="m", seed=1, timeout_s=1.0)
    res = sim.run([Req(0.0, output_tokens=100), Req(0.0, output_tokens=2)])
    rows = list(res.rows())
    assert rows[0].outcome == "timeout" and rows[1].outcome == "ok"
    assert res.end_s == pytest.approx(1.0)


def test_gateway_cap_and_no_node() -> None:
    sim = Simulation([node("a")], model="m", seed=1, admission=OpenAdmission(max_inflight=1))
    res = sim.run([Req(0.0, output_tokens=50), Req(0.1), Req(1.0, model="other")])
    assert [r.outcome for r in res.rows()] == ["ok", "rejected", "no_node"]
    assert set(res.counts()) == set(OUTCOMES)


def test_prefill_hook_and_routing_profile_by_name() -> None:
    calls: list[tuple[int, str]] = []

    def cached(i: int, r: object, n: DesNode) -> int:
        calls.append((i, n.name))
        return 900

    spec = NodeSpec(name="a", models=["m"], batching=BatchSpec(step_base_s=0.01, prefill_s_per_token=0.001))
    res = Simulation([spec], model="m", prefill_cached=cached).run([Req(0.0, prompt_tokens=1000, output_tokens=1)])
    assert calls == [(0, "a")] and res.ttft[0] == pytest.approx(0.01 + 0.1 + 0.00005)
    rr = Simulation([node("a"), node("b"), node("c")], model="m", profile="round-robin")
    got = [r.node for r in rr.run([Req(i * 10.0) for i in range(6)]).rows()]
    assert got == ["a", "b", "c", "a", "b", "c"]
    assert isinstance(Simulation([node("a")], router=build_router("least-connections")).router.name, str)
    with pytest.raises(Exception, match="unknown routing profile"):
        Simulation([node("a")], profile="nope")
