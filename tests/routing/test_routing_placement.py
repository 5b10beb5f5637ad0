"""Hardware placement (the node-selector filter, NodeSelector at load) and network distance (the
rtt scorer, the probe-time EWMA), without I/O."""

from __future__ import annotations

import collections
from typing import Any

import pytest
from pydantic import ValidationError

from inferlb.config.settings import fleet_from_mapping
from inferlb.errors import ConfigError
from inferlb.fleet.state import Fleet
from inferlb.health.isolation import RTT_ALPHA, observe
from inferlb.node_types import Sample
from inferlb.routing.profiles import build_router
from inferlb.routing.rtt import Rtt, RttParams
from inferlb.routing.selector import NodeSelector, NodeSelectorFilter
from inferlb.routing.types import NodeView, RouteRequest
from inferlb.types import ManualClock


def _node(name: str, labels: dict[str, str] | None = None, **kw: Any) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=32768, max_concurrency=64,
                    labels=tuple(sorted((labels or {}).items())), **kw)


def _fleet(models: list[dict[str, Any]] | None = None, nodes: list[dict[str, Any]] | None = None,
           **routing: Any) -> dict[str, Any]:
    return {"models": models or [{"name": "m"}],
            "nodes": nodes or [{"name": "a", "url": "http://127.0.0.1:1", "models": ["m"]}],
            "routing": routing or {"profile": "token-aware"}}


# ---------------------------------------------------------------- NodeSelector


def test_selector_forms() -> None:
    sel = NodeSelector.model_validate({"gpu": "h100", "gpu_memory_gib": ">= 40", "zone": "!= edge", "count": 8})
    assert sel.matches({"gpu": "h100", "gpu_memory_gib": "80", "count": "8"})
    assert sel.matches({"gpu": "h100", "gpu_memory_gib": "40.0", "count": "8.0", "zone": "dc1"})
    assert not sel.matches({"gpu": "h100", "gpu_memory_gib": "24", "count": "8"})      # too small
    assert not sel.matches({"gpu": "a100", "gpu_memory_gib": "80", "count": "8"})      # wrong type
    assert not sel.matches({"gpu": "h100", "gpu_memory_gib": "80", "count": "8", "zone": "edge"})
    assert not sel.matches({"gpu": "h100", "count": "8"})                               # label missing
    assert not sel.matches({"gpu": "h100", "gpu_memory_gib": "lots", "count": "8"})     # not a number
    assert sel.describe() == "gpu==h100, gpu_memory_gib>=40, zone!=edge, count==8"
    for text, ok in ((">40", False), ("> 39", True), ("<= 40", True), ("< 40", False), ("== 40", True)):
        assert NodeSelector.model_validate({"g": text}).matches({"g": "40"}) is ok, text


@pytest.mark.parametrize("bad,msg", [
    ({"gpu_memory_gib": ">= forty"}, "needs a number"),
    ({"gpu": ">="}, "has no value"),
    ({}, "at least one"),
    ({"gpu": ["h100"]}, "text or a number"),
    ({"gpu": True}, "text or a number"),
])
def test_selector_errors_are_clear(bad: dict[str, Any], msg: str) -> None:
    with pytest.raises(ValidationError, match=msg):
        NodeSelector.model_validate(bad)


def test_node_selector_filter_keeps_matching_nodes_and_says_why_others_go() -> None:
    f = NodeSelectorFilter()
    nodes = [_node("big", {"gpu": "h100", "mem": "80"}), _node("small", {"gpu": "l4", "mem": "24"}), _node("bare")]
    sel = NodeSelector.model_validate({"mem": ">= 40"})
    kept, out = f.apply(RouteRequest("m", 10, 10, selector=sel), nodes)
    assert [n.name for n in kept] == ["big"]
    assert {e.node for e in out} == {"small", "bare"} and all(e.by == "node-selector" for e in out)
    assert "mem>=40" in out[0].reason
    assert f.apply(RouteRequest("m", 10, 10), nodes) == (nodes, [])      # no selector: all stay


# ---------------------------------------------------------------- at load


def test_model_node_selector_fills_labels_and_routes_only_to_matching_nodes() -> None:
    cfg = fleet_from_mapping(_fleet(
        models=[{"name": "m", "node_selector": {"gpu_memory_gib": ">= 40"}}],
        nodes=[{"name": "big", "url": "http://127.0.0.1:1", "models": ["m"], "labels": {"gpu_memory_gib": 80}},
               {"name": "small", "url": "http://127.0.0.1:2", "models": ["m"], "labels": {"gpu_memory_gib": 24}}]))
    fleet = Fleet(cfg, ManualClock())
    views = fleet.views()
    assert dict(views[0].labels) == {"gpu_memory_gib": "80"}     # a YAML number kept as its text
    router = build_router("token-aware", seed=1)
    sel = cfg.models[0].node_selector
    picks = {router.decide(RouteRequest("m", 10, 10, selector=sel), views).pick for _ in range(30)}
    assert picks == {"big"}


@pytest.mark.parametrize("models,nodes,routing,where,msg", [
    ([{"name": "m", "node_selector": {"gpu": "h100"}}],
     [{"name": "a", "url": "http://127.0.0.1:1", "models": ["m"], "labels": {"gpu": "l4"}}], {},
     "models[0].node_selector", "no node serving 'm' meets gpu==h100 (a: gpu==h100 (has gpu=l4))"),
    ([{"name": "m", "node_selector": {"mem": ">= 40"}}],
     [{"name": "a", "url": "http://127.0.0.1:1", "models": ["m"], "labels": {"mem": "lots"}}], {},
     "nodes[0].labels.mem", "'lots' is not a number"),
    ([{"name": "m", "node_selector": {"mem": ">= forty"}}], None, {}, "models[0].node_selector: mem:",
     "needs a number, not 'forty'"),
    ([{"name": "m", "node_selector": {"gpu": "h100"}}],
     [{"name": "a", "url": "http://127.0.0.1:1", "models": ["m"], "labels": {"gpu": "h100"}}],
     {"profile": "custom", "filters": ["healthy", "serves-model"], "scorers": {"least-requests": 1.0}},
     "models[0].node_selector", "leaves out 'node-selector'"),
])
def test_bad_placement_config_is_a_clear_error_at_load(models: list[dict[str, Any]], nodes: Any,
                                                       routing: dict[str, Any], where: str, msg: str) -> None:
    with pytest.raises(ConfigError) as err:
        fleet_from_mapping(_fleet(models=models, nodes=nodes, **routing))
    text = str(err.value)
    assert where in text and msg in text, text


# ---------------------------------------------------------------- rtt


def test_rtt_scores_near_over_far_and_unknown_at_the_median() -> None:
    s = Rtt(RttParams(reference_ms=10))
    near, far, new = _node("near", rtt_ms=1.0), _node("far", rtt_ms=90.0), _node("new")
    assert s.score(RouteRequest("m", 1, 1), near) == pytest.approx(10 / 11)
    assert s.score(RouteRequest("m", 1, 1), far) == pytest.approx(0.1)
    assert s.score(RouteRequest("m", 1, 1), new) == 0.5
    scores = s.score_all(RouteRequest("m", 1, 1), [near, far, new])
    assert scores[2] == pytest.approx(10 / (10 + 45.5))      # the median of 1 and 90
    assert all(0 <= x <= 1 for x in scores)


def _probe(node: str, at: float, ms: float, status: int | None = 200) -> dict[str, Any]:
    return Sample(node, "probe", status == 200, at, at, latency_ms=ms, status=status).to_json()


def test_the_probe_time_feeds_an_ewma_on_the_node_view() -> None:
    clock = ManualClock()
    fleet = Fleet(fleet_from_mapping(_fleet()), clock)
    assert fleet.views()[0].rtt_ms is None
    observe(fleet, [_probe("a", 1.0, 20.0)])
    assert fleet.views()[0].rtt_ms == 20.0
    observe(fleet, [_probe("a", 2.0, 10.0)])
    assert fleet.views()[0].rtt_ms == pytest.approx((1 - RTT_ALPHA) * 20 + RTT_ALPHA * 10)
    observe(fleet, [_probe("a", 2.0, 10.0)])                   # the same sample again: no change
    observe(fleet, [_probe("a", 3.0, 5000.0, status=None)])   # a timeout says nothing about distance
    assert fleet.views()[0].rtt_ms == pytest.approx(18.0)


def test_far_nodes_lose_traffic_while_near_ones_have_room() -> None:
    nodes = [{"name": n, "url": f"http://127.0.0.1:{i + 1}", "models": ["m"], "capacity_tokens": 8000}
             for i, n in enumerate(("near1", "near2", "edge1", "edge2"))]
    clock = ManualClock()
    fleet = Fleet(fleet_from_mapping(_fleet(nodes=nodes)), clock)
    observe(fleet, [_probe("near1", 1, 1.0), _probe("near2", 1, 1.5), _probe("edge1", 1, 60.0),
                    _probe("edge2", 1, 80.0)])
    router = build_router("custom", filters=["healthy", "serves-model", "has-capacity"],
                          scorers={"outstanding-tokens": 1.0, "rtt": 1.0}, seed=1)
    served: collections.Counter[str] = collections.Counter()
    for _ in range(14):   # 14 × 500 tokens: the near nodes end half full, the edge ones idle
        d = router.decide(RouteRequest("m", 400, 100), fleet.views())
        assert d.pick is not None
        fleet.acquire(d.pick, 500)
        served[d.pick] += 1
    assert served["edge1"] == served["edge2"] == 0 and served["near1"] == served["near2"] == 7
    # the near nodes full: now the edge takes the traffic rather than nobody
    fleet.acquire("near1", 4500)
    fleet.acquire("near2", 4500)
    for _ in range(4):
        d = router.decide(RouteRequest("m", 400, 100), fleet.views())
        assert d.pick is not None
        fleet.acquire(d.pick, 500)
        served[d.pick] += 1
    assert served["edge1"] + served["edge2"] == 4
