"""Node selectors on a model version (config/versions.py): numeric comparisons in ``selector``
and ``node_selector``, joined with the model's ``node_selector`` for routing; clear errors at load."""

from __future__ import annotations

from typing import Any

import pytest

from inferlb.config.settings import fleet_from_mapping
from inferlb.errors import ConfigError
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeView, RouteRequest
from inferlb.versions.table import VersionTable


def _fleet(versions: list[dict[str, Any]], routing: dict[str, Any] | None = None, **model: Any) -> dict[str, Any]:
    def node(name: str, mem: str, gpu: str, track: str) -> dict[str, Any]:
        return {"name": name, "url": f"http://127.0.0.1:{9000 + ord(name[0])}", "models": ["m"],
                "labels": {"gpu_memory_gib": mem, "gpu": gpu, "track": track}}

    return {"models": [{"name": "m", "versions": versions, **model}],
            "nodes": [node("a", "24", "l4", "stable"), node("b", "80", "h100", "stable"),
                      node("c", "141", "h200", "canary"), node("d", "40", "a100", "canary")],
            "routing": routing or {"profile": "token-aware"}}


def _views(cfg: Any) -> list[NodeView]:
    return [NodeView(name=n.name, models=frozenset(n.models), capacity_tokens=n.capacity_tokens,
                     max_concurrency=n.max_concurrency, labels=tuple(sorted(n.labels.items()))) for n in cfg.nodes]


def test_a_versions_node_selector_joins_the_models_and_routing_applies_both() -> None:
    cfg = fleet_from_mapping(_fleet([
        {"name": "v1", "weight": 90},
        {"name": "v2", "weight": 10, "node_selector": {"gpu_memory_gib": ">=80"}},
    ], node_selector={"gpu": "!= l4"}))
    mv = VersionTable.from_fleet(cfg).get("m")
    assert mv is not None
    v1, v2 = mv.get("v1"), mv.get("v2")
    assert v1 is not None and v2 is not None
    assert sorted(v2.nodes) == ["a", "b", "c", "d"]                # the version runs on every node of the model…
    assert v2.selector is not None and v2.selector.describe() == "gpu!=l4, gpu_memory_gib>=80"
    assert v1.selector is not None and v1.selector.describe() == "gpu!=l4"   # …the model's alone for v1
    router = build_router("token-aware", seed=1)
    views = _views(cfg)
    for _ in range(20):   # …but a request for v2 lands only where both hold
        d = router.decide(RouteRequest("m", 100, 10, only=v2.nodes, selector=v2.selector), views)
        assert d.pick in ("b", "c")
    why = {e.node: e.reason for e in d.eliminated}
    assert set(why) == {"a", "d"} and why["d"] == "labels do not meet gpu!=l4, gpu_memory_gib>=80"
    d1 = router.decide(RouteRequest("m", 100, 10, only=v1.nodes, selector=v1.selector), views)
    assert d1.pick in ("b", "c", "d") and [e.node for e in d1.eliminated] == ["a"]


def test_a_versions_selector_takes_numeric_comparisons_too() -> None:
    cfg = fleet_from_mapping(_fleet([{"name": "big", "weight": 1, "selector": {"gpu_memory_gib": "> 40"}},
                                     {"name": "small", "weight": 1, "selector": {"gpu_memory_gib": "<= 40",
                                                                                 "track": "canary"}}]))
    mv = VersionTable.from_fleet(cfg).get("m")
    assert mv is not None
    assert {v.name: sorted(v.nodes) for v in mv.versions} == {"big": ["b", "c"], "small": ["d"]}
    assert all(v.selector is None for v in mv.versions)            # membership, not a per-request filter


@pytest.mark.parametrize(("versions", "model", "path", "words"), [
    ([{"name": "v1", "node_selector": {"gpu_memory_gib": ">= lots"}}], {},
     "models[0].versions[0].node_selector", "needs a number, not 'lots'"),
    ([{"name": "v1", "node_selector": {"gpu_memory_gib": ">= 200"}}], {},
     "models[0].versions[0].node_selector",
     "no node of version 'v1' of 'm' meets gpu_memory_gib>=200 (a: gpu_memory_gib>=200 (has gpu_memory_gib=24)"),
    # each holds somewhere, never together on the version's nodes
    ([{"name": "v1", "nodes": ["a", "d"], "node_selector": {"gpu_memory_gib": ">= 40"}}],
     {"node_selector": {"gpu": "l4"}}, "models[0].versions[0].node_selector",
     "meets the model's and the version's node_selector"),
    ([{"name": "v1", "selector": {"track": ">= 2"}}], {},
     "nodes[0].labels.track", "'stable' is not a number, but models[0].versions[0].selector compares it"),
    ([{"name": "v1", "node_selector": {}}], {}, "models[0].versions[0].node_selector", "at least one"),
    ([{"name": "v1", "node_selector": {"gpu": ["h100"]}}], {}, "models[0].versions[0].node_selector",
     "text or a number"),
])
def test_bad_version_selectors_are_config_errors_naming_the_key(versions: list[dict[str, Any]],
                                                                 model: dict[str, Any], path: str,
                                                                 words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        fleet_from_mapping(_fleet(versions, **model), source="fleet.yaml")
    assert exc.value.source == "fleet.yaml" and exc.value.path == path, exc.value
    assert words in exc.value.message, exc.value.message


def test_a_version_node_selector_without_the_filter_is_refused() -> None:
    doc = _fleet([{"name": "v1", "node_selector": {"gpu": "h100"}}],
                 routing={"profile": "token-aware", "filters": ["healthy", "serves-model"]})
    with pytest.raises(ConfigError) as exc:
        fleet_from_mapping(doc, source="fleet.yaml")
    assert exc.value.path == "models[0].versions[0].node_selector" and "would be ignored" in exc.value.message
