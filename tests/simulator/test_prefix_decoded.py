"""A finished request's answer stays in its node's prefix cache (vLLM keeps a finished sequence's
decoded blocks): the cache alone, the discrete-event model, the real-time node, and that the
two agree on the same conversation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from inferlb.routing.prefix import BLOCK_CHARS
from inferlb.simulator.des.prefix import PrefixCaches, PromptInfo
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.openai_format import answer_text, completion_body, prompt_text_of, prompt_tokens_of
from inferlb.simulator.prefix_cache import BLOCK_TOKENS, PrefixCache, finished_sequence
from inferlb.simulator.spec import BatchSpec, FaultSpec, NodeSpec

SYSTEM = "".join(chr(65 + i % 26) for i in range(BLOCK_CHARS * 10))     # 10 blocks
ASK1 = "q" * 100
ASK2 = "r" * 100
N = 40                     # answer tokens: 230 characters of "tok0 tok1 ... tok39 "


def turn1() -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK1}]


def turn2() -> list[dict[str, Any]]:
    return [*turn1(), {"role": "assistant", "content": answer_text(N)}, {"role": "user", "content": ASK2}]


P1 = prompt_text_of({"messages": turn1()}, "chat")          # 741 chars: 11 full blocks
P2 = prompt_text_of({"messages": turn2()}, "chat")
DONE1 = finished_sequence(P1, answer_text(N))             # 972 chars: 15 full blocks, 12 left over


def test_the_answer_text_is_what_the_node_sends() -> None:
    body = completion_body(chat=True, rid="x", model="m", created=0, fingerprint="n", prompt_tokens=1,
                           completion_tokens=N, finish_reason="stop")
    import json
    assert json.loads(body)["choices"][0]["message"]["content"] == answer_text(N)
    assert answer_text(3) == "tok0 tok1 tok2 " and answer_text(0) == ""
    assert P2.startswith(DONE1 + "\n") and len(P1) // BLOCK_CHARS == 11 and len(DONE1) == 972


def test_a_finished_answer_hits_on_the_next_turn_and_its_partial_block_is_not_cached() -> None:
    c = PrefixCache(capacity_blocks=100)
    assert c.lookup(P1) == 0 and len(c) == 11
    assert c.insert(DONE1) == 15 and len(c) == 15            # 4 more full blocks; the 12-char tail is not one
    before = (c.queries_tokens, c.hits_tokens)
    assert before == (11 * BLOCK_TOKENS, 0)                   # inserting is not a query
    assert c.lookup(P2) == 15                                 # not 16: the next block only starts like the tail
    # The prompt-only model: the resent answer misses.
    old = PrefixCache(capacity_blocks=100)
    old.lookup(P1)
    assert old.lookup(P2) == 11
    # Another answer (other text, or a shorter one) shares only what it really has in common.
    other = PrefixCache(capacity_blocks=100)
    other.lookup(P1)
    other.insert(finished_sequence(P1, answer_text(10)))
    assert 11 <= other.lookup(P2) < 15
    assert finished_sequence("", "tok0 ") == ""               # no prompt text, nothing to keep
    assert finished_sequence("ab", "cd", chat=False) == "abcd"


def test_inserting_respects_the_capacity_and_the_lru() -> None:
    c = PrefixCache(capacity_blocks=15)
    c.lookup(P1)
    c.insert(DONE1)
    assert len(c) == 15
    c.insert("z" * BLOCK_CHARS * 3)                           # 3 new blocks: the 3 oldest go
    assert len(c) == 15
    assert c.lookup(P2) == 0                                  # the chain's first blocks were the oldest
    c2 = PrefixCache(capacity_blocks=15)
    c2.insert(DONE1)
    c2.lookup("y" * BLOCK_CHARS)                              # one block in: the oldest out
    assert len(c2) == 15
    c3 = PrefixCache(capacity_blocks=15)
    c3.lookup(P1)
    c3.insert(DONE1)
    c3.insert(DONE1[: 11 * BLOCK_CHARS])                      # refreshed, nothing added
    assert len(c3) == 15 and c3.lookup(P2) == 15


# -- the discrete-event model -------------------------------------------------------------------


@dataclass(frozen=True)
class Req:
    t: float
    prompt_tokens: int
    output_tokens: int
    text: str
    model: str | None = "m"
    priority: str | None = None
    stream: bool = True


def prompt_of(r: Req) -> PromptInfo | None:
    return PromptInfo(r.text) if r.text else None


def des_node(cache_tokens: int | None = None) -> NodeSpec:
    # 10 ms a step, 1 ms a prefilled token: times are exact sums.
    return NodeSpec(name="a", models=["m"], prefix_cache=True, prefix_cache_tokens=cache_tokens,
                    batching=BatchSpec(kv_tokens=65_536, step_base_s=0.01, step_per_seq_s=0.0,
                                       prefill_s_per_token=0.001))


def conversation(t2: float) -> list[Req]:
    return [Req(0.0, prompt_tokens_of({"messages": turn1()}, "chat"), N, P1),
            Req(t2, prompt_tokens_of({"messages": turn2()}, "chat"), 4, P2)]


def test_the_des_caches_a_completed_answer_and_only_from_its_completion() -> None:
    caches = PrefixCaches(prompt_of)
    res = Simulation([des_node()], model="m", seed=1, prefill_cached=caches).run(conversation(10.0))
    assert caches.cached == {0: 0, 1: 15 * BLOCK_TOKENS}
    prompt2 = conversation(10.0)[1].prompt_tokens
    assert res.ttft[1] == pytest.approx(0.01 + (prompt2 - 15 * BLOCK_TOKENS) * 0.001)
    # Sent before the first answer ended (it takes ~0.6 s): only the prompt's blocks are there.
    early = PrefixCaches(prompt_of)
    Simulation([des_node()], model="m", seed=1, prefill_cached=early).run(conversation(0.1))
    assert early.cached[1] == 11 * BLOCK_TOKENS
    # The prompt-only model.
    old = PrefixCaches(prompt_of, decoded=False)
    Simulation([des_node()], model="m", seed=1, prefill_cached=old).run(conversation(10.0))
    assert old.cached[1] == 11 * BLOCK_TOKENS


def test_the_des_keeps_nothing_of_a_request_that_did_not_complete() -> None:
    caches = PrefixCaches(prompt_of)
    reqs = conversation(10.0)
    long = Req(0.0, reqs[0].prompt_tokens, 1000, P1)          # 1,000 steps of 10 ms: past the 2 s timeout
    Simulation([des_node()], model="m", seed=1, prefill_cached=caches, timeout_s=2.0).run([long, reqs[1]])
    assert caches.cached[1] == 11 * BLOCK_TOKENS


def test_the_des_cache_capacity_holds_with_answers() -> None:
    caches = PrefixCaches(prompt_of)
    sim = Simulation([des_node(cache_tokens=15 * BLOCK_TOKENS)], model="m", seed=1, prefill_cached=caches)
    other = Req(5.0, 160, 1, "x" * BLOCK_CHARS * 10)         # 10 other blocks push the chain's oldest out
    sim.run([conversation(10.0)[0], other, conversation(10.0)[1]])
    assert caches.cached[2] == 0
    assert all(c["blocks"] <= 15 for c in caches.per_node().values())


# -- the real-time node, and the two agreeing --------------------------------------------------


async def test_the_real_time_node_and_the_des_agree_on_a_conversation() -> None:
    spec = NodeSpec(name="c", models=["m"], base_ttft_s=0.001, prefill_s_per_token=0.00001, tpot_s=0.00001,
                    prefix_cache=True, prefix_cache_tokens=4096)
    bodies = [{"model": "m", "max_tokens": N, "messages": turn1(), "stream": True},
              {"model": "m", "max_tokens": 4, "messages": turn2()}]
    async with SimFleet([spec]) as sim, aiohttp.ClientSession() as http:
        url = sim.url("c")
        for body in bodies:      # one after the other: the first answer has ended before the second turn
            async with http.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                await r.read()
        async with http.get(url + "/sim/stats") as r:
            node_cache = (await r.json())["engine"]["prefix_cache"]
    caches = PrefixCaches(prompt_of)
    Simulation([des_node(cache_tokens=4096)], model="m", seed=1, prefill_cached=caches).run(conversation(10.0))
    des = caches.per_node()["a"]
    assert node_cache["hits_tokens"] == des["hits_tokens"] == 15 * BLOCK_TOKENS
    assert node_cache["queries_tokens"] == des["queries_tokens"]
    assert node_cache["blocks"] == des["blocks"]


async def test_a_cut_answer_leaves_only_its_prompt_in_the_real_time_nodes_cache() -> None:
    spec = NodeSpec(name="c", models=["m"], base_ttft_s=0.001, prefill_s_per_token=0.00001, tpot_s=0.00001,
                    prefix_cache=True, prefix_cache_tokens=4096)
    async with SimFleet([spec]) as sim, aiohttp.ClientSession() as http:
        url = sim.url("c")
        await sim.nodes["c"].set_faults(FaultSpec(drop_after_tokens=5))
        body = {"model": "m", "max_tokens": N, "messages": turn1(), "stream": True}
        with pytest.raises(aiohttp.ClientPayloadError):
            async with http.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
        await sim.nodes["c"].set_faults(FaultSpec())
        async with http.post(url + "/v1/chat/completions", json={"model": "m", "max_tokens": 1,
                                                                  "messages": turn2()}) as r:
            assert r.status == 200
        async with http.get(url + "/sim/stats") as r:
            node_cache = (await r.json())["engine"]["prefix_cache"]
    assert node_cache["hits_tokens"] == 11 * BLOCK_TOKENS
