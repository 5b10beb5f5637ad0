"""Decoding vLLM's KV event messages (inferlb/kvevents/wire.py) from bytes built as vLLM builds them."""

from __future__ import annotations

import msgspec
import pytest

from inferlb.kvevents.wire import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch, decode_seq, indexable
from tests.kvevents.vllm_format import ArrayBatch, ArrayRemoved, ArrayStored, Batch, Cleared, Removed, Stored, encode


def test_the_current_map_form_with_bytes_hashes() -> None:
    h1, h2 = b"\x01" * 32, b"\x02" * 32
    raw = encode(Batch(ts=1700000000.5, data_parallel_rank=0, events=[
        Stored([h1, h2], None, list(range(32)), 16, None, "GPU", None, group_idx=0),
        Removed([h1], "GPU"),
        Cleared(),
    ]))
    b = decode_batch(raw)
    assert b.ts == 1700000000.5 and b.data_parallel_rank == 0
    stored, removed, cleared = b.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == (h1, h2) and stored.parent_block_hash is None
    assert stored.token_ids == tuple(range(32)) and stored.block_size == 16 and stored.medium == "GPU"
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == (h1,)
    assert isinstance(cleared, AllBlocksCleared)
    assert indexable(stored) and indexable(removed)


def test_the_array_form_of_earlier_releases_with_integer_hashes() -> None:
    raw = encode(ArrayBatch(ts=5.0, events=[ArrayStored([11, 12], 10, list(range(32)), 16, None, None),
                                            ArrayRemoved([11], None)]))
    assert msgspec.msgpack.decode(raw)[1][0][0] == "BlockStored"       # truly tagged arrays
    b = decode_batch(raw)
    stored, removed = b.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == (11, 12) and stored.parent_block_hash == 10
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == (11,)


def test_lora_other_groups_and_cpu_blocks_are_kept_out_of_the_index() -> None:
    b = decode_batch(encode(Batch(ts=1.0, events=[
        Stored([1], None, list(range(16)), 16, None, "GPU", "my-adapter"),
        Stored([2], None, list(range(16)), 16, None, "GPU", None, group_idx=1),
        Stored([3], None, list(range(16)), 16, None, "CPU", None)])))
    assert [indexable(e) for e in b.events] == [False, False, False]  # type: ignore[arg-type]


@pytest.mark.parametrize("payload, what", [
    (b"\xc1", "not msgpack"),
    (encode([1.0]), "a batch is a list"),
    (encode({"ts": "x", "events": []}), "numeric ts"),
    (encode([1.0, [["Mystery", 1]]]), "unknown event tag"),
    (encode([1.0, [["BlockStored", [1], None, [1, -2], 16]]]), "token_ids"),
    (encode([1.0, [["BlockStored", [1.5], None, [1], 16]]]), "not an integer or bytes"),
    (encode([1.0, [["BlockStored", [1], None, [1], 0]]]), "block_size"),
    (encode([1.0, [7]]), "not a tagged array or map"),
])
def test_malformed_messages_say_what_is_wrong(payload: bytes, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        decode_batch(payload)


def test_sequence_frames() -> None:
    assert decode_seq((258).to_bytes(8, "big")) == 258
    assert decode_seq((-1).to_bytes(8, "big", signed=True)) == -1
    with pytest.raises(ValueError):
        decode_seq(b"\x00")
