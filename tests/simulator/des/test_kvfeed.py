"""The event-fed index in the DES (inferlb/simulator/des/kvfeed.py) and the prefix cache's events
(inferlb/simulator/prefix_cache.py ``sink``)."""

from __future__ import annotations

from dataclasses import dataclass

from inferlb.routing.kvindex import KVIndex, chain_keys, sim_token_ids
from inferlb.routing.prefix import BLOCK_CHARS
from inferlb.routing.profiles import build_router
from inferlb.simulator.des.kvfeed import KVFeed
from inferlb.simulator.des.prefix import PrefixCaches, PromptInfo
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.prefix_cache import BLOCK_TOKENS, PrefixCache, RemovedEvent, StoredEvent
from inferlb.simulator.spec import BatchSpec, NodeSpec


@dataclass(frozen=True)
class Req:
    t: float
    prompt_tokens: int
    output_tokens: int
    text: str
    model: str | None = "m"
    priority: str | None = None
    stream: bool = True


def _block(c: str) -> str:
    return c * BLOCK_CHARS


SHARED = "".join(_block(c) for c in "abcde")             # 5 blocks
FIRST = SHARED + "".join(_block(c) for c in "fghijklmnopqrstu")   # 21 blocks
SECOND = SHARED + "".join(_block(c) for c in "FGHIJKLMNOPQRSTU")  # shares the first 5 only


def _nodes() -> list[NodeSpec]:
    return [NodeSpec(name=f"n{i}", models=["m"], prefix_cache=True,
                     batching=BatchSpec(kv_tokens=65_536, step_base_s=0.01, step_per_seq_s=0.0,
                                        prefill_s_per_token=0.0001)) for i in range(4)]


def _run(feed: KVFeed | None, t2: float = 5.0) -> tuple[list[str], PrefixCaches]:
    caches = PrefixCaches(lambda r: PromptInfo(r.text), sink_of=feed.sink_for if feed is not None else None)
    router = build_router("prefix-affinity", seed=1, params={"affinity": {"session": False}})
    sim = Simulation(_nodes(), router=router, model="m", seed=1, prefill_cached=caches)
    if feed is not None:
        sim.kv_feed = feed
        feed.clock = lambda: sim.now
    res = sim.run([Req(0.0, len(FIRST) // 4, 4, FIRST), Req(t2, len(SECOND) // 4, 4, SECOND)])
    return [res.nodes[k].name for k in res.node], caches


def test_the_cache_emits_stored_runs_and_evictions() -> None:
    events: list[StoredEvent | RemovedEvent] = []
    c = PrefixCache(8, sink=events.append)
    c.lookup(SHARED)
    c.lookup(SHARED + _block("z") + _block("y"))
    assert [type(e) for e in events] == [StoredEvent, StoredEvent]
    first, second = events
    assert isinstance(first, StoredEvent) and isinstance(second, StoredEvent)
    assert first.parent_block_hash is None and len(first.block_hashes) == 5 and len(first.token_ids) == 80
    assert second.parent_block_hash == first.block_hashes[-1] and len(second.block_hashes) == 2
    c.lookup(_block("q") * 3)
    assert isinstance(events[-1], RemovedEvent) and events[-1].block_hashes == first.block_hashes[:2]
    idx = KVIndex()                     # what a consumer rebuilds from them: the prompt's own chain
    for e in events:
        if isinstance(e, StoredEvent):
            idx.stored("x", e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size)
        else:
            idx.removed("x", e.block_hashes)
    keys = chain_keys(sim_token_ids(SHARED + _block("z")), BLOCK_TOKENS)
    assert idx.match(keys, ["x"]) == {"x": 0}                          # its first two blocks were evicted
    assert idx.blocks("x") == 8 == len(c)


def test_the_index_sends_a_shared_prefix_where_it_is_cached_and_the_hash_does_not() -> None:
    hashed, hcaches = _run(None)
    assert hashed[0] != hashed[1] and hcaches.cached[1] == 0           # block 16 differs: another node
    feed = KVFeed(KVIndex(), lag_s=0.05)
    fed, caches = _run(feed)
    assert fed[0] == fed[1] and caches.cached[1] == 5 * BLOCK_TOKENS
    assert feed.used == 2 and feed.fallbacks == {}


def test_a_lagging_or_dropped_stream_falls_back_to_the_hash() -> None:
    late = KVFeed(KVIndex(max_lag_s=2.0), lag_s=3.0)
    nodes, _ = _run(late)
    assert nodes == _run(None)[0] and late.fallbacks == {"lagging": 1}
    dropped = KVFeed(KVIndex(max_lag_s=2.0), drop_at=0.0)
    nodes, _ = _run(dropped)
    assert nodes == _run(None)[0] and dropped.fallbacks == {"silent": 1}
    fresh = KVFeed(KVIndex(max_lag_s=2.0), lag_s=1.0)                  # late but under max_lag_s: used
    nodes, _ = _run(fresh)
    assert nodes[0] == nodes[1] and fresh.used == 2
