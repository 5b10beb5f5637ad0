"""The DES's prefix caches (the emulator's PrefixCache behind ``prefill_cached``), affinity
inputs in routing, and network delay (client times, the gateway's ``rtt_ms``): virtual time only."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import pytest

from inferlb.routing.prefix import block_hashes
from inferlb.routing.profiles import build_router
from inferlb.simulator.des.node import RTT_ALPHA
from inferlb.simulator.des.prefix import PrefixCaches, PromptInfo
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.prefix_cache import BLOCK_TOKENS
from inferlb.simulator.spec import BatchSpec, NodeSpec


@dataclass(frozen=True)
class Req:
    t: float
    prompt_tokens: int
    output_tokens: int = 4
    text: str = ""
    session: str | None = None
    model: str | None = "m"
    priority: str | None = None
    stream: bool = True


def prompt_of(r: Req) -> PromptInfo | None:
    return PromptInfo(r.text, r.session) if r.text else None


def node(name: str, *, cache: bool = True, delay: float = 0.0, cache_tokens: int | None = None) -> NodeSpec:
    # 10 ms a step, 1 ms a prefilled token, nothing else: times are exact sums.
    return NodeSpec(name=name, models=["m"], prefix_cache=cache, prefix_cache_tokens=cache_tokens,
                    network_delay_s=delay,
                    batching=BatchSpec(kv_tokens=65_536, step_base_s=0.01, step_per_seq_s=0.0,
                                       prefill_s_per_token=0.001))


TEXT = "abcdefgh" * 320          # 2,560 characters: 40 full blocks, 640 tokens at 4 bytes a token


def test_a_repeated_prompt_hits_the_nodes_cache_and_skips_its_prefill() -> None:
    caches = PrefixCaches(prompt_of)
    sim = Simulation([node("a")], model="m", seed=1, prefill_cached=caches)
    res = sim.run([Req(0.0, 640, text=TEXT), Req(10.0, 640, text=TEXT), Req(20.0, 640, text=TEXT[:1280] + "x" * 1280)])
    assert res.ttft[0] == pytest.approx(0.01 + 640 * 0.001)     # cold: the whole prompt prefilled
    assert res.ttft[1] == pytest.approx(0.01 + 1 * 0.001)       # 639 cached: the last token is always computed
    assert res.ttft[2] == pytest.approx(0.01 + 320 * 0.001)     # 20 shared blocks of 40
    assert caches.cached == {0: 0, 1: 639, 2: 320}
    tot = caches.totals()
    assert tot["queries_tokens"] == 3 * 40 * BLOCK_TOKENS and tot["hits_tokens"] == (40 + 20) * BLOCK_TOKENS
    assert tot["hit_rate"] == pytest.approx(60 / 120)


def test_caches_are_per_node_and_only_where_the_spec_has_one() -> None:
    caches = PrefixCaches(prompt_of)
    # round-robin: a, b, a, b: the second visit to each node hits; "b" has no cache at all.
    sim = Simulation([node("a"), node("b", cache=False)], profile="round-robin", model="m", seed=1,
                     prefill_cached=caches)
    res = sim.run([Req(float(i), 640, text=TEXT) for i in range(4)])
    names = [r.node for r in res.rows()]
    assert names == ["a", "b", "a", "b"]
    assert caches.cached == {0: 0, 2: 639}     # never asked about b's: it has no cache
    assert res.ttft[1] == res.ttft[3] == pytest.approx(0.65)
    assert set(caches.per_node()) == {"a"}


def test_the_lru_is_the_emulators_capacity_in_blocks() -> None:
    caches = PrefixCaches(prompt_of)
    other = "zyxwvuts" * 320
    sim = Simulation([node("a", cache_tokens=40 * BLOCK_TOKENS)], model="m", seed=1, prefill_cached=caches)
    sim.run([Req(0.0, 640, text=TEXT), Req(5.0, 640, text=other), Req(10.0, 640, text=TEXT)])
    assert caches.cached[2] == 0              # 40 blocks hold one prompt: the other evicted it


def test_affinity_routing_reads_the_prompt_blocks_and_the_session() -> None:
    specs = [node(f"n{i}") for i in range(4)]
    # Same session, different texts: one node. Same text, no session: one node. Many sessions: spread.
    reqs = [Req(i * 0.5, 64, text=f"turn {i} " * 40, session="s-1") for i in range(8)]
    reqs += [Req(10 + i * 0.5, 64, text=TEXT) for i in range(8)]
    reqs += [Req(20 + i * 0.5, 64, text=f"{i:04d}" * 64, session=f"s-{i}") for i in range(40)]
    caches = PrefixCaches(prompt_of)
    res = Simulation(specs, router=build_router("prefix-affinity", seed=1), model="m", seed=1,
                     prefill_cached=caches).run(reqs)
    nodes = [r.node for r in res.rows()]
    assert len(set(nodes[:8])) == 1 and len(set(nodes[8:16])) == 1
    assert len(Counter(nodes[16:])) == 4
    # With token-aware the same prompts are spread by load, and the prompt is not hashed for routing.
    router = build_router("token-aware", seed=1)
    assert router.prefix_blocks == 0
    assert res.reasons == {}


def test_the_prompt_is_built_once_a_dispatch() -> None:
    calls: list[float] = []

    def counting(r: Req) -> PromptInfo | None:
        calls.append(r.t)
        return prompt_of(r)

    caches = PrefixCaches(counting)
    Simulation([node("a"), node("b")], router=build_router("prefix-affinity", seed=1), model="m", seed=1,
               prefill_cached=caches).run([Req(0.0, 640, text=TEXT), Req(1.0, 640, text=TEXT)])
    assert calls == [0.0, 1.0]
    assert block_hashes(TEXT, 16) == block_hashes(TEXT, 40)[:16]


def test_network_delay_adds_to_the_clients_times_and_feeds_rtt_ms() -> None:
    sim = Simulation([node("near", cache=False), node("far", cache=False, delay=0.2)], profile="round-robin",
                     model="m", seed=1, scrape_s=5.0)
    views = {v.name: v for v in sim.routing_views()}
    assert views["near"].rtt_ms is None and views["far"].rtt_ms is None     # no probe yet
    res = sim.run([Req(0.0, 10), Req(0.0, 10), Req(12.0, 10), Req(12.0, 10)])
    by_node = {r.node: r for r in res.rows() if r.t == 0.0}
    alone = 0.01 + 10 * 0.001                                             # one prefill step
    assert by_node["near"].ttft == pytest.approx(alone)
    assert by_node["far"].ttft == pytest.approx(alone + 0.2)
    assert by_node["far"].e2e == pytest.approx((by_node["near"].e2e or 0) + 0.2)
    views = {v.name: v for v in sim.routing_views()}
    assert views["near"].rtt_ms == 0.0 and views["far"].rtt_ms == pytest.approx(200.0)   # scraped at 5 and 10 s
    # The gateway learned a TTFT that includes the round trip.
    assert views["far"].ttft_s is not None and views["near"].ttft_s is not None
    assert views["far"].ttft_s - views["near"].ttft_s == pytest.approx(0.2)


def test_rtt_alpha_is_the_gateways() -> None:
    from inferlb.health.isolation import RTT_ALPHA as GATEWAY_ALPHA
    assert RTT_ALPHA == GATEWAY_ALPHA


def test_no_prompt_no_key_no_hit() -> None:
    caches = PrefixCaches(prompt_of)
    res = Simulation([node("a")], model="m", seed=1, prefill_cached=caches).run([Req(0.0, 640), Req(1.0, 640)])
    assert caches.cached == {0: 0, 1: 0}
    assert math.isclose(res.ttft[1], 0.65)
