"""vLLM's KV event messages, decoded (vllm/distributed/kv_events.py is the publisher's source).

The wire: a ZeroMQ PUB multipart message ``[topic, seq, payload]``, ``seq`` an 8-byte big-endian
sequence number (0, 1, 2, … per publisher), ``payload`` a msgpack ``KVEventBatch``: ``ts``
(the engine's ``time.time()``), ``events``, ``data_parallel_rank``. The events are msgspec
tagged structs: ``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``,
``block_size``, ``lora_id``, ``medium``, ``lora_name``, then optional ``extra_keys``,
``group_idx``, …), ``BlockRemoved`` (``block_hashes``, ``medium``, ``group_idx``) and
``AllBlocksCleared``. msgspec writes a tagged struct either as an array whose first item is the
tag (``array_like=True``, as vLLM's earlier releases and llm-d's decoder expect) or as a map
with a ``type`` key (vLLM's current structs, no ``array_like``); :func:`decode_batch` reads both,
and a block hash as an integer (older releases) or bytes (newer ones), kept as it came: it only
names a block.

Contract: :func:`decode_batch` returns a :class:`Batch` or raises ValueError saying what is
wrong (a message that is not msgpack, a batch or event of the wrong shape, an unknown tag); the
subscriber counts it and skips the message. :func:`decode_seq` reads the sequence frame.
Blocks stored for a LoRA adapter, under another KV cache group than the first, or in a medium
other than the GPU's are kept out of the index by :func:`indexable` (a request's chain is the
base model's full-attention blocks; docs/kv-events.md says what that leaves out).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = ["AllBlocksCleared", "Batch", "BlockRemoved", "BlockStored", "Event", "decode_batch", "decode_seq",
           "indexable"]


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[Hashable, ...]
    parent_block_hash: Hashable | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[Hashable, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class Batch:
    ts: float
    events: tuple[Event, ...]
    data_parallel_rank: int | None = None


_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
           "extra_keys", "group_idx")
_REMOVED = ("block_hashes", "medium", "group_idx")
_decoder = msgspec.msgpack.Decoder()


def decode_seq(frame: bytes) -> int:
    """The sequence number of an 8-byte big-endian frame (ValueError otherwise)."""
    if len(frame) != 8:
        raise ValueError(f"a sequence frame has 8 bytes, not {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def _hash(v: Any, what: str) -> Hashable:
    if isinstance(v, bool) or not isinstance(v, int | bytes):
        raise ValueError(f"{what} is {type(v).__name__}, not an integer or bytes")
    return v


def _fields(raw: Any, names: Sequence[str], tag: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return {k: raw.get(k) for k in names}
    if isinstance(raw, list):
        return dict(zip(names, raw[1:], strict=False))
    raise ValueError(f"a {tag} event is a {type(raw).__name__}")


def _opt_int(v: Any, what: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{what} is not an integer")
    return v


def _opt_str(v: Any, what: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise ValueError(f"{what} is not a string")
    return v


def _event(raw: Any) -> Event:
    if isinstance(raw, list) and raw:
        tag = raw[0]
    elif isinstance(raw, dict):
        tag = raw.get("type")
    else:
        raise ValueError(f"an event is a {type(raw).__name__}, not a tagged array or map")
    if tag == "BlockStored":
        f = _fields(raw, _STORED, tag)
        hashes, tokens, size = f.get("block_hashes"), f.get("token_ids"), f.get("block_size")
        if not isinstance(hashes, list) or not isinstance(tokens, list):
            raise ValueError("BlockStored without block_hashes and token_ids lists")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError("BlockStored's block_size is not a positive integer")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in tokens):
            raise ValueError("BlockStored's token_ids are not all non-negative integers")
        parent = f.get("parent_block_hash")
        return BlockStored(tuple(_hash(h, "a block hash") for h in hashes),
                           None if parent is None else _hash(parent, "parent_block_hash"),
                           tuple(tokens), size, _opt_int(f.get("lora_id"), "lora_id"),
                           _opt_str(f.get("medium"), "medium"), _opt_str(f.get("lora_name"), "lora_name"),
                           _opt_int(f.get("group_idx"), "group_idx"))
    if tag == "BlockRemoved":
        f = _fields(raw, _REMOVED, tag)
        hashes = f.get("block_hashes")
        if not isinstance(hashes, list):
            raise ValueError("BlockRemoved without a block_hashes list")
        return BlockRemoved(tuple(_hash(h, "a block hash") for h in hashes), _opt_str(f.get("medium"), "medium"),
                            _opt_int(f.get("group_idx"), "group_idx"))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown event tag {str(tag)[:40]!r}")


def decode_batch(payload: bytes) -> Batch:
    """A ``KVEventBatch`` from its msgpack bytes (array or map form)."""
    try:
        raw = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not msgpack: {exc}") from None
    if isinstance(raw, list) and len(raw) >= 2:
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    elif isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    else:
        raise ValueError(f"a batch is a {type(raw).__name__}, not [ts, events, …] or a map")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not isinstance(events, list):
        raise ValueError("a batch without a numeric ts and an events list")
    return Batch(float(ts), tuple(_event(e) for e in events), _opt_int(rank, "data_parallel_rank"))


def indexable(ev: BlockStored | BlockRemoved) -> bool:
    """Whether the event is about blocks the index keys (see the module docstring)."""
    if ev.medium not in (None, "GPU", "gpu"):
        return False
    if ev.group_idx not in (None, 0):
        return False
    return not (isinstance(ev, BlockStored) and (ev.lora_id is not None or ev.lora_name is not None))
