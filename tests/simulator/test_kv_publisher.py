"""The emulator's KV event publisher (inferlb/simulator/kv_publisher.py) speaks vLLM's format."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from inferlb.simulator.kv_publisher import KVPublisher
from inferlb.simulator.prefix_cache import PrefixCache
from inferlb.simulator.spec import NodeSpec
from tests.kvevents.vllm_format import Batch, Removed, Stored


async def test_its_batches_decode_as_vllms_own_structs() -> None:
    pub = KVPublisher(clock=lambda: 123.5)
    await pub.start()
    try:
        cache = PrefixCache(2, sink=pub.sink)
        cache.lookup("a" * 64 + "b" * 64 + "c" * 64)        # 3 blocks stored, 1 evicted: one batch
        await asyncio.sleep(0)                               # one loop turn: the batch goes out
        assert pub.sent == 1
        seq, payload = next(iter(pub._buffer))
        batch = msgspec.msgpack.decode(payload, type=Batch)  # vLLM's KVEventBatch, strictly typed
        assert seq == 0 and batch.ts == 123.5 and batch.data_parallel_rank == 0
        stored, removed = batch.events
        assert isinstance(stored, Stored) and len(stored.block_hashes) == 3 and stored.block_size == 16
        assert len(stored.token_ids) == 48 and stored.parent_block_hash is None and stored.medium == "GPU"
        assert isinstance(removed, Removed) and removed.block_hashes == stored.block_hashes[:1]
    finally:
        await pub.stop()
    pub.flush()                    # a stopped publisher sends nothing (and does not fail)


def test_the_spec_needs_a_prefix_cache_for_events() -> None:
    with pytest.raises(ValueError, match="kv_events_port needs prefix_cache"):
        NodeSpec(name="x", models=["m"], kv_events_port=0)
    assert NodeSpec(name="x", models=["m"], prefix_cache=True, kv_events_port=5557).kv_events_port == 5557
