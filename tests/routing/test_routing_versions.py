"""The routing core's model-version filter (``RouteRequest.only``): applied to the pool before
sampling, so a canary on 1 node of 200 is always found; the nodes left out are counted."""

from __future__ import annotations

from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeList, NodeView, RouteRequest


def _nodes(n: int) -> NodeList:
    views = [NodeView(name=f"n{i}", models=frozenset({"m"}), capacity_tokens=10_000, max_concurrency=8)
             for i in range(n)]
    return NodeList(views, {"m": list(views)})


def test_only_the_versions_nodes_are_considered_even_when_sampling() -> None:
    nodes = _nodes(200)
    router = build_router("token-aware", seed=3)   # samples 16 of a larger pool
    for _ in range(50):
        d = router.decide(RouteRequest("m", 100, 50, only=frozenset({"n137"})), nodes)
        assert d.pick == "n137" and d.counts["model-version"] == 199
    wider = router.decide(RouteRequest("m", 100, 50, only=frozenset(f"n{i}" for i in range(40))), nodes)
    assert wider.pick is not None and int(wider.pick[1:]) < 40 and wider.sampled is not None


def test_no_node_of_the_version_means_no_pick_and_none_means_every_node() -> None:
    nodes = _nodes(4)
    router = build_router("round-robin", seed=1)
    assert router.decide(RouteRequest("m", 1, 1, only=frozenset({"elsewhere"})), nodes).pick is None
    assert router.decide(RouteRequest("m", 1, 1, only=frozenset()), nodes).pick is None
    picks = {router.decide(RouteRequest("m", 1, 1), nodes).pick for _ in range(8)}
    assert picks == {"n0", "n1", "n2", "n3"}
    d = router.decide(RouteRequest("m", 1, 1, only=frozenset({"n1", "n2"}), exclude=frozenset({"n1"})), nodes)
    assert d.pick == "n2"
