"""The prefix / session affinity picker (routing/affinity.py) and its hashes (prefix.py), without I/O."""

from __future__ import annotations

import collections
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlb.errors import ConfigError
from inferlb.routing.affinity import Affinity, AffinityParams, affinity_key, load_bound
from inferlb.routing.prefix import BLOCK_CHARS, block_hashes, hrw_weights, name_hash, text_key
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeList, NodeView, RouteRequest

SYSTEM = "You are a careful assistant for the billing team. " * 30   # ~1,500 characters


def _node(name: str, inflight: int = 0, cap: int = 32768, healthy: bool = True, **kw: object) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=cap, max_concurrency=64,
                    inflight_requests=inflight, healthy=healthy, **kw)  # type: ignore[arg-type]


def _req(*, session: str | None = None, text: str = "", blocks: int = 16) -> RouteRequest:
    return RouteRequest(model="m", prompt_tokens=100, output_tokens=10,
                        prefix=block_hashes(text, blocks), session=None if session is None else text_key(session))


# ---------------------------------------------------------------- hashes


def test_block_hashes_are_chained_prefix_hashes() -> None:
    a = block_hashes(SYSTEM + "\nfirst question", 64)
    b = block_hashes(SYSTEM + "\nanother question entirely", 64)
    shared = len(SYSTEM) // BLOCK_CHARS
    assert a[:shared] == b[:shared]             # the same system prompt: the same leading blocks
    assert len(a) == len(SYSTEM + "\nfirst question") // BLOCK_CHARS   # full blocks only
    # a change in block 0 changes every later hash (the chain), not just block 0's
    c = block_hashes("X" + SYSTEM[1:], 64)
    assert all(x != y for x, y in zip(a, c, strict=False))
    assert block_hashes("short", 8) == ()
    assert len(block_hashes(SYSTEM, 3)) == 3


def test_hashes_are_stable_across_processes() -> None:
    # BLAKE2b, not Python's salted hash(): several gateways agree without sharing state.
    assert text_key("alice") == text_key("alice") != text_key("bob")
    assert block_hashes("a" * 64, 1) == (int.from_bytes(
        __import__("hashlib").blake2b(b"\0" * 8 + b"a" * 64, digest_size=8).digest(), "little"),)


def test_hrw_spreads_keys_evenly_and_moves_only_a_removed_nodes_keys() -> None:
    names = [f"node{i}" for i in range(10)]
    hashes = [name_hash(n) for n in names]
    owner = {}
    for k in range(20_000):
        w = hrw_weights(hashes, k)
        owner[k] = names[max(range(10), key=w.__getitem__)]
    counts = collections.Counter(owner.values())
    assert min(counts.values()) > 1700 and max(counts.values()) < 2300   # 2,000 each ± 15 %
    # remove node3: only its keys move
    rest = [n for n in names if n != "node3"]
    rest_h = [name_hash(n) for n in rest]
    for k in range(20_000):
        w = hrw_weights(rest_h, k)
        now = rest[max(range(9), key=w.__getitem__)]
        if owner[k] != "node3":
            assert now == owner[k]


# ---------------------------------------------------------------- the key


def test_the_session_wins_then_the_prefix_then_nothing() -> None:
    p = AffinityParams()
    by_session = affinity_key(_req(session="s1", text=SYSTEM), p)
    assert by_session is not None and by_session[:1] == ("session",)
    kind, key, blocks = affinity_key(_req(text=SYSTEM), p) or ("", 0, 0)
    assert kind == "prefix" and blocks == 16
    assert affinity_key(_req(text="hi"), p) is None
    no_session = affinity_key(_req(session="s1", text=SYSTEM), AffinityParams(session=False))
    assert no_session is not None and no_session[0] == "prefix"
    # a prompt shorter than prefix_blocks keys on its last full block
    short = SYSTEM[: 5 * BLOCK_CHARS + 3]
    assert affinity_key(_req(text=short), p)[2] == 5   # type: ignore[index]
    assert affinity_key(_req(text=short), AffinityParams(min_blocks=6)) is None


def test_params_reject_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ConfigError):
        build_router("prefix-affinity", params={"affinity": {"epsilon": 0.5, "typo": 1}})
    with pytest.raises(ConfigError):
        build_router("prefix-affinity", params={"affinity": {"epsilon": 0}})
    r = build_router("prefix-affinity", params={"affinity": {"prefix_blocks": 4}})
    assert r.prefix_blocks == 4 and build_router("token-aware").prefix_blocks == 0


# ---------------------------------------------------------------- routing


def test_a_session_lands_on_one_node_whatever_the_prompt() -> None:
    router = build_router("prefix-affinity", seed=1)
    nodes = [_node(f"n{i}") for i in range(6)]
    picks = {router.decide(_req(session="alice", text=f"turn {i} " + "x" * (70 * i)), nodes).pick
             for i in range(20)}
    assert len(picks) == 1
    # different sessions spread over the nodes
    spread = {router.decide(_req(session=f"user{i}"), nodes).pick for i in range(60)}
    assert len(spread) >= 5


def test_requests_sharing_a_prefix_share_a_node() -> None:
    router = build_router("prefix-affinity", seed=1)
    nodes = [_node(f"n{i}") for i in range(6)]
    picks = {router.decide(_req(text=SYSTEM + f"\nquestion {i}"), nodes).pick for i in range(30)}
    assert len(picks) == 1


def test_the_audit_says_affinity_was_used_and_why() -> None:
    router = build_router("prefix-affinity", seed=1)
    nodes = [_node(f"n{i}") for i in range(4)]
    d = router.decide(_req(session="alice"), nodes)
    detail = d.to_json()["pick_detail"]
    assert detail["affinity"] == "session" and detail["hrw_first"] == d.pick and detail["escaped_total"] == 0
    assert "escape" not in detail                          # the key's own node took it
    assert "alice" not in str(detail)                      # the key, never the session id
    none = router.decide(_req(text="hi"), nodes).to_json()["pick_detail"]
    assert none == {"affinity": "none", "reason": "no session id and no full prompt block"}
    assert "pick_detail" not in build_router("token-aware").decide(_req(), nodes).to_json()


def test_an_overloaded_home_node_escapes_to_the_next_in_hrw_order() -> None:
    router = build_router("prefix-affinity", seed=1, params={"affinity": {"epsilon": 0.25, "min_bound": 1}})
    nodes = [_node(f"n{i}") for i in range(4)]
    home = router.decide(_req(session="alice"), nodes).pick
    order = [n for n in router.decide(_req(session="alice"), nodes).ranked]
    loaded = [_node(n.name, inflight=10 if n.name == home else 1) for n in nodes]
    d = router.decide(_req(session="alice"), loaded)
    assert d.pick == order[1]                               # the next node in the key's order
    assert d.ranked[-1] == home                             # still a fallback, last
    detail = d.pick_detail or {}
    assert detail["escaped"] == [{"node": home, "inflight": 10,
                                  "bound": load_bound(0.25, 13, 32768, 4 * 32768)}]
    assert detail["escaped_total"] == 1
    bound = load_bound(0.25, 13, 32768, 4 * 32768)
    esc = detail["escape"]                                  # in words, for the audit (and the metric)
    assert esc["from"] == home and esc["to"] == d.pick
    assert f"{home}, first in this session key's order, holds 10 request(s)" in esc["why"]
    assert f"load bound of {bound}" in esc["why"] and f"so {d.pick}" in esc["why"]
    assert d.to_json()["pick_detail"]["escape"] == esc



def test_filters_run_first_an_unhealthy_or_full_home_is_never_picked() -> None:
    router = build_router("prefix-affinity", seed=1)
    nodes = [_node(f"n{i}") for i in range(4)]
    home = router.decide(_req(session="alice"), nodes).pick
    sick = [_node(n.name, healthy=n.name != home) for n in nodes]
    d = router.decide(_req(session="alice"), sick)
    assert d.pick != home and home not in d.ranked
    full = [_node(n.name, inflight_tokens=32760 if n.name == home else 0) for n in nodes]
    assert router.decide(_req(session="alice"), full).pick != home


def test_sampled_fleets_keep_a_key_on_its_node_and_respect_filters() -> None:
    names = [f"node{i:04d}" for i in range(1000)]
    views = [_node(n, inflight=i % 7) for i, n in enumerate(names)]
    nl = NodeList(views, {"m": list(views)})
    router = build_router("prefix-affinity", seed=3)
    picks = collections.Counter(router.decide(_req(session="alice"), nl).pick for _ in range(50))
    assert len(picks) == 1
    d = router.decide(_req(session="alice"), nl)
    assert d.sampled == 16 and len(d.candidates) == 16
    # the 16 are the key's top 16 in HRW order over the whole pool
    w = hrw_weights([name_hash(n) for n in names], text_key("alice"))
    top = {names[i] for i in sorted(range(1000), key=w.__getitem__, reverse=True)[:16]}
    assert set(d.candidates) == top
    # the home node goes unhealthy: the key moves within its own top 16, not at random
    home = d.pick
    sick = [_node(v.name, inflight=v.inflight_requests, healthy=v.name != home) for v in views]
    d2 = router.decide(_req(session="alice"), NodeList(sick, {"m": list(sick)}))
    assert d2.pick in top and d2.pick != home


def test_the_top_k_cache_notices_a_changed_pool() -> None:
    aff = Affinity(AffinityParams())
    pool = [_node(f"a{i}") for i in range(40)]
    first = [n.name for n in aff.preselect(_req(session="s"), pool, 8) or []]
    assert [n.name for n in aff.preselect(_req(session="s"), pool, 8) or []] == first
    renamed = [_node(f"b{i}") for i in range(40)]          # same size, other nodes
    again = [n.name for n in aff.preselect(_req(session="s"), renamed, 8) or []]
    assert again and all(name.startswith("b") for name in again)
    assert aff.preselect(_req(text="hi"), pool, 8) is None  # no key: the router draws at random


# ---------------------------------------------------------------- the bound, as a property


@settings(max_examples=300, deadline=None)
@given(loads=st.lists(st.integers(0, 200), min_size=1, max_size=24),
       caps=st.lists(st.sampled_from([8192, 16384, 32768, 65536, 131072]), min_size=24, max_size=24),
       eps=st.floats(0.01, 3.0), floor=st.integers(1, 16), key=st.text(min_size=1, max_size=12))
def test_affinity_never_picks_a_node_past_its_bound(loads: list[int], caps: list[int], eps: float, floor: int,
                                                   key: str) -> None:
    nodes = [_node(f"n{i}", inflight=x, cap=caps[i]) for i, x in enumerate(loads)]
    aff = Affinity(AffinityParams(epsilon=eps, min_bound=floor))
    ranked, detail = aff.rank_detail(_req(session=key), [(n, 0.5) for n in nodes], random.Random(0))
    assert sorted(ranked) == sorted(n.name for n in nodes)
    pick = next(n for n in nodes if n.name == ranked[0])
    total, cap = sum(loads), sum(n.capacity_tokens for n in nodes)
    assert pick.inflight_requests + 1 <= load_bound(eps, total, pick.capacity_tokens, cap, floor)
    # and it is the first node in the key's HRW order that is under its bound
    w = hrw_weights([name_hash(n.name) for n in nodes], text_key(key))
    for i in sorted(range(len(nodes)), key=w.__getitem__, reverse=True):
        n = nodes[i]
        if n.inflight_requests + 1 <= load_bound(eps, total, n.capacity_tokens, cap, floor):
            assert n.name == pick.name
            break
    assert detail["escaped_total"] == len([e for e in detail["escaped"]]) or detail["escaped_total"] > 4


@settings(max_examples=200, deadline=None)
@given(states=st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.integers(0, 40_000)), min_size=1, max_size=40),
       key=st.text(min_size=1, max_size=8), prompt=st.integers(1, 8000))
def test_affinity_never_bypasses_the_filters(states: list[tuple[bool, int, int]], key: str, prompt: int) -> None:
    """Whatever the key and the loads: the pick is healthy, has room for the request, and is
    under its load bound among the nodes that passed the filters."""
    nodes = [_node(f"n{i}", inflight=r, healthy=ok, inflight_tokens=t) for i, (ok, r, t) in enumerate(states)]
    router = build_router("prefix-affinity", seed=1)
    req = RouteRequest("m", prompt, 100, session=text_key(key))
    d = router.decide(req, nodes)
    if d.pick is None:
        return
    pick = next(n for n in nodes if n.name == d.pick)
    assert pick.healthy
    assert pick.inflight_requests < pick.max_concurrency
    assert pick.inflight_tokens == 0 or pick.inflight_tokens + req.tokens <= pick.capacity_tokens
    passed = [n for n in nodes if n.name in d.ranked]
    assert all(n.healthy for n in passed)
    total, cap = sum(n.inflight_requests for n in passed), sum(n.capacity_tokens for n in passed)
    assert pick.inflight_requests + 1 <= load_bound(0.5, total, pick.capacity_tokens, cap, 8)
