"""vLLM's KV event structs as vllm/distributed/kv_events.py declares them (msgspec tagged structs,
the same field names, order and options), in both the current map form and the array form of
earlier releases (``array_like=True``): the bytes the tests decode are what vLLM sends."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["ArrayBatch", "ArrayStored", "Batch", "Cleared", "Removed", "Stored", "encode"]


class _Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class Stored(_Event, tag="BlockStored"):
    block_hashes: list[Any]
    parent_block_hash: Any | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class Removed(_Event, tag="BlockRemoved"):
    block_hashes: list[Any]
    medium: str | None
    group_idx: int | None = None


class Cleared(_Event, tag="AllBlocksCleared"):
    pass


class Batch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Stored | Removed | Cleared]
    data_parallel_rank: int | None = None


class _ArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class ArrayStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class ArrayRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class ArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[ArrayStored | ArrayRemoved]
    data_parallel_rank: int | None = None


def encode(batch: Any) -> bytes:
    return msgspec.msgpack.Encoder().encode(batch)
