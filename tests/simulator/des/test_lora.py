"""LoRA adapters in the discrete-event simulation: a cold adapter's load time, LRU eviction, a
request waiting for a slot, the scraped view, and lora-affinity against adapter-blind routing."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.lora import LoraSpec
from inferlb.simulator.spec import BatchSpec, NodeSpec


@dataclass(frozen=True)
class Req:
    t: float
    adapter: str | None = "a"
    prompt_tokens: int = 100
    output_tokens: int = 10
    model: str | None = "m"
    priority: str | None = None
    stream: bool = True


def node(name: str, max_lora: int = 1, load_s: float = 1.0) -> NodeSpec:
    return NodeSpec(name=name, models=["m"], batching=BatchSpec(kv_tokens=65_536, step_base_s=0.01, step_per_seq_s=0.0,
                                                                prefill_s_per_token=0.0),
                    lora=LoraSpec(adapters=tuple("abcdefgh"), max_lora=max_lora, load_s=load_s))


def test_a_cold_adapter_costs_its_load_once_and_an_eviction_costs_it_again() -> None:
    sim = Simulation([node("n")], model="m", seed=1)
    res = sim.run([Req(0.0), Req(5.0), Req(10.0, adapter="b"), Req(15.0), Req(20.0, adapter=None)])
    assert res.ttft[0] == pytest.approx(1.01)      # load 1 s, then one 10 ms step
    assert res.ttft[1] == pytest.approx(0.01)      # warm
    assert res.ttft[2] == pytest.approx(1.01)      # b evicts a (one slot)
    assert res.ttft[3] == pytest.approx(1.01)      # a again: loaded again
    assert res.ttft[4] == pytest.approx(0.01)      # the base model needs no adapter
    assert sim.lora_totals() == {"requests": 4, "loads": 3, "evictions": 2, "waited_for_slot": 0}


def test_a_request_waits_for_a_slot_while_every_loaded_adapter_is_held() -> None:
    sim = Simulation([node("n", load_s=0.5)], model="m", seed=1)
    res = sim.run([Req(0.0, output_tokens=100), Req(0.1, adapter="b", output_tokens=1)])
    end_a = res.e2e[0]                              # 0.5 load + 100 steps
    assert end_a == pytest.approx(1.5)
    assert res.ttft[1] == pytest.approx(end_a - 0.1 + 0.5 + 0.01)   # a's slot freed, then b loads
    assert sim.lora_totals()["waited_for_slot"] == 1


def test_the_scrape_shows_running_and_waiting_adapters() -> None:
    sim = Simulation([node("n", load_s=10.0)], model="m", seed=1, scrape_s=1.0)
    sim.run([Req(0.0, output_tokens=1)], until=2.5)
    v = sim.routing_views()[0]
    assert (v.lora_running, v.lora_waiting, v.max_lora) == (frozenset(), frozenset({"a"}), 1)


def _zipf_run(profile: str, seed: int) -> tuple[float, float]:
    rng = random.Random(seed)
    weights = [1 / (k + 1) for k in range(8)]
    reqs, t = [], 0.0
    for _ in range(400):
        t += rng.expovariate(40.0)
        reqs.append(Req(t, adapter=rng.choices("abcdefgh", weights)[0], output_tokens=rng.randint(5, 40)))
    sim = Simulation([node(f"n{i}", max_lora=2, load_s=0.3) for i in range(4)], model="m", seed=seed,
                     profile=profile, scrape_s=0.5)
    res = sim.run(reqs)
    tot = sim.lora_totals()
    ttfts = sorted(res.ttft)
    return tot["loads"] / tot["requests"], ttfts[len(ttfts) // 2]


def test_lora_affinity_misses_fewer_adapters_than_adapter_blind_routing() -> None:
    aware, blind = _zipf_run("lora-affinity", 3), _zipf_run("token-aware", 3)
    assert aware[0] < 0.75 * blind[0], (aware, blind)
    assert aware[1] <= blind[1], (aware, blind)
