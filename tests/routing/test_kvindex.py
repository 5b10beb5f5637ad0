"""The KV-event-fed index (inferlb/routing/kvindex.py): re-keying by the events' tokens, bounds,
removal and clear, and when a node's stream is stale."""

from __future__ import annotations

import pytest

from inferlb.routing.kvindex import KVIndex, chain_keys, sim_chain_keys, sim_token_ids

TOKENS = list(range(100, 164))          # 4 blocks of 16


def test_keys_do_not_depend_on_the_engines_hashes_nor_on_how_events_split_a_chain() -> None:
    a, b = KVIndex(), KVIndex()
    a.stored("n", ["e1", "e2", "e3", "e4"], None, TOKENS, 16)          # one event, opaque engine hashes
    b.stored("n", [11, 12], None, TOKENS[:32], 16)                      # two events, other hashes
    b.stored("n", [13, 14], 12, TOKENS[32:], 16)
    keys = chain_keys(TOKENS, 16)
    assert a.match(keys, ["n"]) == b.match(keys, ["n"]) == {"n": 4}
    assert a.match(chain_keys(TOKENS[:40], 16), ["n"]) == {"n": 2}     # 2 full blocks of the 40 tokens
    other = TOKENS[:16] + [1] * 48                                       # the same first block only
    assert a.match(chain_keys(other, 16), ["n", "m"]) == {"n": 1, "m": 0}


def test_a_block_whose_parent_is_unknown_is_counted_not_guessed() -> None:
    idx = KVIndex()
    assert idx.stored("n", [2], 1, TOKENS[16:32], 16) == 0
    assert idx.nodes["n"].orphans == 1 and idx.total == 0


def test_removal_and_clear() -> None:
    idx = KVIndex()
    idx.stored("n", [1, 2, 3], None, TOKENS[:48], 16)
    idx.stored("m", [7], None, TOKENS[:16], 16)
    keys = chain_keys(TOKENS, 16)
    assert idx.removed("n", [2, 99]) == 1
    assert idx.match(keys, ["n", "m"]) == {"n": 1, "m": 1}              # consecutive from the first block
    idx.clear("n")
    assert idx.match(keys, ["n", "m"]) == {"n": 0, "m": 1}
    assert idx.blocks("n") == 0 and idx.total == 1


def test_bounded_per_node_and_in_total_oldest_first() -> None:
    idx = KVIndex(max_blocks_per_node=3, max_blocks=5)
    idx.stored("n", [1, 2, 3, 4], None, TOKENS, 16)
    assert idx.blocks("n") == 3 and idx.nodes["n"].evicted == 1
    keys = chain_keys(TOKENS, 16)
    assert idx.match(keys, ["n"]) == {"n": 0}                            # the first (oldest) went
    idx.stored("m", [5, 6, 7], None, [9] * 48, 16)
    assert idx.total == 5 and idx.blocks("n") + idx.blocks("m") == 5
    idx.stored("m", [8], 7, [8] * 16, 16)
    assert idx.total == 5


def test_stale_after_a_lost_gap_until_recovered_lagging_and_silent() -> None:
    idx = KVIndex(max_lag_s=2.0, recover_s=30.0)
    assert idx.usable("n", 0.0) == "no stream"
    assert idx.batch("n", 0, 100.0, 100.0) is None
    assert idx.usable("n", 100.0) is None
    assert idx.batch("n", 0, 100.0, 100.1) == "old"
    assert idx.batch("n", 3, 101.0, 101.0) == "gap"
    idx.stored("n", [1], None, TOKENS[:16], 16)
    idx.gap_lost("n", 3, 101.0)
    assert idx.blocks("n") == 0 and idx.usable("n", 110.0) == "gap" and idx.usable("n", 131.5) is None
    idx.batch("n", 4, 130.0, 135.0)                                      # 5 s late
    assert idx.usable("n", 135.0) == "lagging"
    idx.batch("n", 5, 136.0, 136.1)
    assert idx.usable("n", 136.1) is None
    idx.sent("n", 140.0)
    assert idx.usable("n", 141.0) is None and idx.usable("n", 142.5) == "silent"
    idx.batch("n", 6, 142.6, 142.6)
    assert idx.usable("n", 142.6) is None


def test_a_first_batch_past_zero_is_a_gap() -> None:
    idx = KVIndex()
    assert idx.batch("n", 7, 1.0, 1.0) == "gap"
    idx.resumed("n", 7)
    assert idx.batch("n", 8, 1.0, 1.0) is None


def test_emulated_tokens_align_with_text_blocks() -> None:
    text = "x" * 70 + "y" * 10
    ids = sim_token_ids(text)
    assert len(ids) == 20 and sim_token_ids(text[:64]) == ids[:16]
    assert chain_keys(ids, 16) == chain_keys(sim_token_ids(text[:64]), 16)
    with pytest.raises(ValueError):
        KVIndex(max_blocks=0)


def test_the_memoised_emulated_chain_is_the_chain_of_the_emulated_tokens() -> None:
    texts = ["q" * 64, "conversation turn one. " * 40, "conversation turn one. " * 40 + "and a reply " * 30]
    for text in (t[:len(t) // 4 * 4] for t in texts):       # whole tokens: the two agree
        for size in (16, 4):
            assert sim_chain_keys(text, size) == chain_keys(sim_token_ids(text), size)
    assert sim_chain_keys("q" * 63, 16) == [] != chain_keys(sim_token_ids("q" * 63), 16)   # a cut last token
    for text in texts:
        for size in (16, 4):
            assert sim_chain_keys(text, size) == chain_keys(sim_token_ids(text), size)
    assert sim_chain_keys(texts[2], 16, max_blocks=3) == chain_keys(sim_token_ids(texts[2]), 16)[:3]
