"""The pair pick (routing/disagg.py): pure, deterministic for a seeded rng."""

from __future__ import annotations

import random

from inferlb.routing.disagg import pick_pair
from inferlb.routing.types import NodeView, RouteRequest

ROLES = {"p0": "prefill", "p1": "prefill", "d0": "decode", "d1": "decode", "x": "both"}


def _view(name: str, **kw: object) -> NodeView:
    base: dict[str, object] = {"name": name, "models": frozenset({"m"}), "capacity_tokens": 10_000,
                               "max_concurrency": 8}
    return NodeView(**{**base, **kw})  # type: ignore[arg-type]


def _req(prompt: int = 1000, output: int = 100, **kw: object) -> RouteRequest:
    return RouteRequest("m", prompt, output, **kw)  # type: ignore[arg-type]


def test_prefill_by_queued_prompt_tokens_and_decode_by_load_and_kv() -> None:
    views = [_view("p0", inflight_tokens=5000), _view("p1", inflight_tokens=1000),
             _view("d0", inflight_tokens=100, kv_usage=0.9), _view("d1", inflight_tokens=2000, kv_usage=0.1)]
    pair = pick_pair(_req(), views, ROLES, rng=random.Random(1))
    assert (pair.mode, pair.prefill_node, pair.decode_node) == ("disaggregated", "p1", "d1")
    assert pair.prefill is not None and pair.prefill.ranked == ["p1", "p0"]
    load_p1, queue_p1, total_p1 = pair.prefill.score_rows["p1"]
    assert load_p1 == 1 - (1000 + 1000) / 10_000 and queue_p1 == 1.0 and total_p1 == 0.8 * load_p1 + 0.2
    dload, kv, _ = pair.decode.score_rows["d1"]
    assert dload == 1 - (2000 + 1100) / 10_000 and kv == 0.9
    # Only role-capable nodes were candidates of each leg, the others eliminated with the reason.
    assert set(pair.decode.candidates) == {"d0", "d1"} and set(pair.prefill.candidates) == {"p0", "p1"}
    assert {e.reason for e in pair.decode.eliminated} == {"role prefill"}
    js = pair.to_json()
    assert js["pick"] == "d1" and js["disaggregation"]["pair"] == {"prefill": "p1", "decode": "d1"}
    assert js["disaggregation"]["prefill"]["scores"]["p1"]["prefill-load"] == round(load_p1, 4)


def test_a_tried_or_unhealthy_prefill_node_is_skipped_and_none_left_serves_whole() -> None:
    views = [_view("p0", healthy=False, unhealthy_reason="ejected"), _view("p1"), _view("d0")]
    pair = pick_pair(_req(exclude=frozenset({"p1"})), views, ROLES, rng=random.Random(1))
    assert (pair.mode, pair.prefill_node, pair.decode_node) == ("colocated", None, "d0")
    assert pair.prefill is not None and {e.reason for e in pair.prefill.eliminated} >= {"ejected", "already tried"}
    strict = pick_pair(_req(exclude=frozenset({"p1"})), views, ROLES, rng=random.Random(1), colocated_fallback=False)
    assert (strict.mode, strict.decode_node) == ("none", None)


def test_short_prompts_and_unsplittable_endpoints_go_whole() -> None:
    views = [_view("p0"), _view("d0")]
    assert pick_pair(_req(prompt=10), views, ROLES, rng=random.Random(1), min_prompt_tokens=64).mode == "colocated"
    assert pick_pair(_req(), views, ROLES, rng=random.Random(1), colocated=True).prefill is None
    assert pick_pair(_req(prompt=64), views, ROLES, rng=random.Random(1), min_prompt_tokens=64).mode == "disaggregated"


def test_a_both_node_is_not_paired_with_itself() -> None:
    views = [_view("x"), _view("p0", inflight_tokens=3000), _view("d0", inflight_tokens=9000)]
    pair = pick_pair(_req(), views, ROLES, rng=random.Random(1))
    assert (pair.prefill_node, pair.decode_node) == ("p0", "x")
    alone = pick_pair(_req(), [_view("x")], ROLES, rng=random.Random(1))
    assert (alone.mode, alone.decode_node) == ("colocated", "x")


def test_full_nodes_are_eliminated_and_ties_spread_by_the_rng() -> None:
    views = [_view("p0"), _view("p1"), _view("d0", inflight_requests=8), _view("d1")]
    pair = pick_pair(_req(), views, ROLES, rng=random.Random(1))
    assert pair.decode_node == "d1"
    assert any(e.node == "d0" and e.reason.startswith("full") for e in pair.decode.eliminated)
    picks = {pick_pair(_req(), views, ROLES, rng=random.Random(s)).prefill_node for s in range(20)}
    assert picks == {"p0", "p1"}
    assert pick_pair(_req(), views, ROLES, rng=random.Random(3)).prefill_node == \
        pick_pair(_req(), views, ROLES, rng=random.Random(3)).prefill_node
