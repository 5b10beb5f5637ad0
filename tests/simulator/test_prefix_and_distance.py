"""The emulator's prefix cache (LRU of block hashes; a hit cuts prefill) and network delay (edge nodes)."""

from __future__ import annotations

import aiohttp
import pytest

from inferlb.config.health import HealthConfig
from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.health.isolation import observe
from inferlb.health.probe import Prober
from inferlb.routing.prefix import BLOCK_CHARS
from inferlb.simulator.batching import BatchCore
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.prefix_cache import BLOCK_TOKENS, PrefixCache
from inferlb.simulator.spec import BatchSpec, NodeSpec
from inferlb.types import ManualClock, SystemClock

TEXT = "".join(chr(65 + i % 26) for i in range(BLOCK_CHARS * 10))   # 10 blocks


def test_prefix_cache_counts_leading_blocks_and_evicts_the_oldest() -> None:
    c = PrefixCache(capacity_blocks=12)
    assert c.lookup(TEXT) == 0 and len(c) == 10
    assert c.lookup(TEXT + "more text" * 20) == 10                     # the same start: 10 blocks cached
    assert c.lookup("z" + TEXT[1:]) == 0                               # block 0 differs: the chain breaks
    assert len(c) == 12                                                # capacity held, oldest evicted
    assert c.lookup(TEXT) < 10                                         # some of TEXT's blocks were evicted
    assert c.to_json()["hits_tokens"] == c.hits_tokens and c.hits_tokens % BLOCK_TOKENS == 0
    with pytest.raises(ValueError):
        PrefixCache(0)


def test_a_cached_prefix_is_not_prefilled() -> None:
    spec = BatchSpec(kv_tokens=16_000, step_base_s=0.01, step_per_seq_s=0.0, prefill_s_per_token=0.001,
                     watermark=0.0)
    t0 = ManualClock().monotonic()
    cold, warm = BatchCore(spec), BatchCore(spec)
    a = cold.submit(1000, 1, t0)
    b = warm.submit(1000, 1, t0, cached_tokens=960)
    for core in (cold, warm):
        core.advance(t0 + 100.0)
    assert a.first_token_at == pytest.approx(t0 + 0.01 + 1.0)          # 1,000 tokens prefilled
    assert b.first_token_at == pytest.approx(t0 + 0.01 + 0.04)         # only the 40 uncached ones
    assert warm.submit(10, 1, t0, cached_tokens=50).cached_tokens == 9   # the last token is always computed


async def test_the_node_reports_hits_and_prefills_only_the_uncached_part() -> None:
    spec = NodeSpec(name="c", models=["m"], base_ttft_s=0.001, prefill_s_per_token=0.0001, tpot_s=0.0001,
                    prefix_cache=True, prefix_cache_tokens=4096)
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "system", "content": TEXT},
                                                         {"role": "user", "content": "hi"}]}
    async with SimFleet([spec]) as sim, aiohttp.ClientSession() as http:
        url = sim.url("c")
        for _ in range(2):
            async with http.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                assert (await r.json())["usage"]["prompt_tokens"] == 161    # usage counts the whole prompt
        async with http.get(url + "/sim/stats") as r:
            cache = (await r.json())["engine"]["prefix_cache"]
        ttft_total = sim.nodes["c"].metrics.ttft.total   # the timing model's TTFTs, not a wall clock
    assert cache["hits_tokens"] == 10 * BLOCK_TOKENS and cache["capacity_blocks"] == 4096 // BLOCK_TOKENS
    # 161 prompt tokens (642 bytes): the first prefills all, the second the one after 10 cached blocks
    assert ttft_total == pytest.approx((0.001 + 161 * 0.0001) + (0.001 + 1 * 0.0001))


async def test_an_edge_nodes_network_delay_shows_in_its_probe_round_trip() -> None:
    """The real prober against emulated nodes, one of them 0.3 s away: its round-trip estimate is
    the larger (an ordering with a 0.3 s margin, not a timing bound)."""
    specs = [NodeSpec(name="near", models=["m"]), NodeSpec(name="edge", models=["m"], network_delay_s=0.3)]
    async with SimFleet(specs) as sim:
        cfg = fleet_from_mapping({"models": [{"name": "m"}], "nodes": [
            {"name": n, "url": sim.url(n), "models": ["m"], "kind": "sim"} for n in ("near", "edge")]})
        health = HealthConfig.model_validate({"probe": {"timeout_s": 5.0}})
        prober = Prober(cfg.nodes, health, SystemClock())
        fleet = Fleet(cfg, ManualClock())
        try:
            for _ in range(2):
                observe(fleet, [s.to_json() for s in await prober.collect()])
        finally:
            await prober.close()
    rtt = {v.name: v.rtt_ms for v in fleet.views()}
    assert rtt["near"] is not None and rtt["edge"] is not None
    assert rtt["edge"] >= 300.0 > rtt["near"]
