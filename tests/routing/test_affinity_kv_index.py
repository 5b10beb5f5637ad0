"""The affinity picker with the KV-event index's hits (routing/affinity.py, ``RouteRequest.kv_hits``)."""

from __future__ import annotations

import random
from dataclasses import replace

from inferlb.routing.affinity import Affinity
from inferlb.routing.prefix import block_hashes, hrw_weights, name_hash, text_key
from inferlb.routing.types import NodeView, RouteRequest

TEXT = "a long shared system prompt " * 40


def _node(name: str, inflight: int = 0) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=32768, max_concurrency=64,
                    inflight_requests=inflight)


NODES = [_node(f"n{i}") for i in range(4)]


def _req(**kw: object) -> RouteRequest:
    base = RouteRequest(model="m", prompt_tokens=100, output_tokens=10, prefix=block_hashes(TEXT, 16),
                        session=text_key("s1"))
    return replace(base, **kw)  # type: ignore[arg-type]


def _hrw_order(key: int) -> list[str]:
    w = hrw_weights([name_hash(n.name) for n in NODES], key)
    return [NODES[i].name for i in sorted(range(len(NODES)), key=w.__getitem__, reverse=True)]


def test_the_node_holding_the_longest_prefix_goes_first_whatever_the_hash_says() -> None:
    hrw = _hrw_order(text_key("s1"))
    last = hrw[-1]
    req = _req(kv_hits=((hrw[0], 2), (hrw[1], 0), (hrw[2], 1), (last, 9)), kv_blocks=12)
    ranked, detail = Affinity().rank_detail(req, [(n, 0.5) for n in NODES], random.Random(1))
    assert ranked[0] == last and ranked[1] == hrw[0] and ranked[2] == hrw[2]
    assert detail["affinity"] == "kv-index"
    assert detail["kv_index"] == {"used": True, "blocks": 12, "held": {last: 9, hrw[0]: 2, hrw[2]: 1}}


def test_no_node_holding_anything_keeps_the_hash_order_and_a_fallback_says_why() -> None:
    hrw = _hrw_order(text_key("s1"))
    scored = [(n, 0.5) for n in NODES]
    ranked, detail = Affinity().rank_detail(_req(kv_hits=tuple((n.name, 0) for n in NODES), kv_blocks=3), scored,
                                            random.Random(1))
    assert ranked == hrw and detail["affinity"] == "session" and detail["kv_index"]["used"] is True
    ranked, detail = Affinity().rank_detail(_req(kv_fallback="n2: silent"), scored, random.Random(1))
    assert ranked == hrw and detail["kv_index"] == {"used": False, "fallback": "n2: silent"}


def test_the_load_bound_still_applies_to_the_index_pick() -> None:
    nodes = [_node("a", inflight=40), _node("b"), _node("c"), _node("d")]
    req = _req(kv_hits=(("a", 9), ("b", 0), ("c", 3), ("d", 0)), kv_blocks=12)
    ranked, detail = Affinity().rank_detail(req, [(n, 0.5) for n in nodes], random.Random(1))
    assert ranked[0] == "c" and ranked[-1] == "a" and detail["escape"]["from"] == "a"


def test_preselect_on_a_sampled_fleet_takes_the_holders_first() -> None:
    pool = [_node(f"p{i}") for i in range(50)]
    req = _req(kv_hits=(("p7", 5), ("p30", 8)), kv_blocks=10)
    picked = Affinity().preselect(req, pool, 4)
    assert picked is not None and [n.name for n in picked[:2]] == ["p30", "p7"] and len(picked) == 4
