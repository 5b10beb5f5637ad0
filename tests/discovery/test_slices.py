"""The pure half of discovery (discovery/slices.py): EndpointSlices → endpoints, the slice
cache under watch events, and the plan (add, keep, drain, remove once drained, undrain, replace);
plus how discovered rows merge with the file and operators' overrides (live/fleet_admin.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from inferlb.config.discovery import KubernetesDiscoveryConfig
from inferlb.config.settings import fleet_from_mapping
from inferlb.discovery.slices import Change, Observed, SliceCache, endpoints_of, observed, plan
from inferlb.errors import Conflict
from inferlb.live.fleet_admin import merge_overrides, patch_node, remove_node, set_drained
from inferlb.store.overrides import NodeOverride
from tests.discovery.apiserver import FIX

LIST = json.loads((FIX / "endpointslice_list.json").read_text())


def cfg(**over: Any) -> KubernetesDiscoveryConfig:
    return KubernetesDiscoveryConfig.model_validate({"service": "llm", "port": "http", "node": {"models": ["llm"]},
                                                     **over})


def slice_(endpoints: list[dict[str, Any]], ports: list[dict[str, Any]] | None = None, name: str = "s",
           address_type: str = "IPv4") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "1"}, "addressType": address_type,
            "endpoints": endpoints, "ports": ports if ports is not None else [{"name": "http", "port": 8000}]}


def ep(addr: str, pod: str | None = None, **conditions: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"addresses": [addr], "conditions": conditions}
    if pod:
        out["targetRef"] = {"kind": "Pod", "name": pod}
    return out


def test_endpoints_serving_means_ready_and_not_terminating() -> None:
    got = endpoints_of(cfg(), slice_([ep("10.0.0.1", "p1", ready=True), ep("10.0.0.2", "p2"),
                                      ep("10.0.0.3", "p3", ready=False),
                                      ep("10.0.0.4", "p4", ready=False, serving=True, terminating=True),
                                      ep("10.0.0.5", "p5", ready=True, terminating=True),
                                      {"addresses": [], "conditions": {"ready": True}}]))
    assert [(e.name, e.url, e.serving) for e in got] == [
        ("p1", "http://10.0.0.1:8000", True), ("p2", "http://10.0.0.2:8000", True),   # unset ready: ready
        ("p3", "http://10.0.0.3:8000", False), ("p4", "http://10.0.0.4:8000", False),
        ("p5", "http://10.0.0.5:8000", False)]


def test_ports_names_addresses_and_prefixes() -> None:
    two = [{"name": "http", "port": 8000}, {"name": "metrics", "port": 9090}]
    assert endpoints_of(cfg(port="metrics"), slice_([ep("10.0.0.1", "p")], two))[0].url == "http://10.0.0.1:9090"
    assert endpoints_of(cfg(port="grpc"), slice_([ep("10.0.0.1", "p")], two)) == []        # the slice lacks it
    assert endpoints_of(cfg(port=None), slice_([ep("10.0.0.1", "p")], two)) == []          # ambiguous: none
    assert endpoints_of(cfg(port=None), slice_([ep("10.0.0.1", "p")]))[0].url == "http://10.0.0.1:8000"
    v6 = endpoints_of(cfg(scheme="https", name_prefix="k8s-"), slice_([ep("fd00::7")], address_type="IPv6"))[0]
    assert (v6.name, v6.url, v6.pod) == ("k8s-fd00--7", "https://[fd00::7]:8000", None)


def test_the_cache_follows_list_and_watch_events() -> None:
    cache = SliceCache()
    cache.replace(LIST["items"], LIST["metadata"]["resourceVersion"])
    assert set(cache.slices) == {"llm-5x8kq", "llm-q2w7z"} and cache.resource_version == "48211"
    seen = observed(cfg(), cache)
    assert {n: o.serving for n, o in seen.items()} == {"llm-6f7d8c9b5-aaaaa": True, "llm-6f7d8c9b5-bbbbb": True,
                                                       "llm-6f7d8c9b5-ddddd": False}
    assert seen["llm-6f7d8c9b5-aaaaa"].spec == {"models": ["llm"], "name": "llm-6f7d8c9b5-aaaaa",
                                                "url": "http://10.244.1.17:8000"}
    for line in (FIX / "watch_terminating.jsonl").read_text().splitlines():
        event = json.loads(line)
        changed = cache.apply(event["type"], event["object"])
        assert changed == (event["type"] != "BOOKMARK")
    assert cache.resource_version == "48247"
    assert not observed(cfg(), cache)["llm-6f7d8c9b5-aaaaa"].serving
    deleted = json.loads((FIX / "watch_deleted.jsonl").read_text())
    assert cache.apply("DELETED", deleted["object"]) and "llm-5x8kq" not in cache.slices
    assert not cache.apply("DELETED", deleted["object"])           # already gone


def test_a_pod_in_two_slices_serves_if_either_says_so() -> None:
    cache = SliceCache()
    cache.replace([slice_([ep("10.0.0.1", "p", ready=False)], name="a"),
                   slice_([ep("10.0.0.1", "p", ready=True)], name="b")], "1")
    assert observed(cfg(), cache)["p"].serving


def row(name: str, url: str = "http://10.0.0.1:8000", drained: bool = False) -> NodeOverride:
    return NodeOverride(name, "discovery", {"models": ["llm"], "name": name, "url": url}, drained=drained)


def obs(name: str, serving: bool = True, url: str = "http://10.0.0.1:8000") -> Observed:
    return Observed({"models": ["llm"], "name": name, "url": url}, serving)


def test_plan_adds_serving_pods_and_ignores_pods_never_ready() -> None:
    rows, changes = plan({}, {"a": obs("a"), "b": obs("b", serving=False)}, set(), at=5.0)
    assert list(rows) == ["a"] and changes == [Change("a", "add")]
    assert rows["a"].source == "discovery" and not rows["a"].drained and rows["a"].updated_at == 5.0
    again, changes = plan(rows, {"a": obs("a"), "b": obs("b", serving=False)}, set(), at=9.0)
    assert again == rows and changes == []                        # steady: nothing moves


def test_plan_drains_first_and_removes_only_once_drained() -> None:
    current = {"a": row("a"), "b": row("b")}
    rows, changes = plan(current, {"a": obs("a", serving=False)}, set(), at=1.0)   # a terminating, b gone
    assert changes == [Change("a", "drain"), Change("b", "drain")]
    assert rows["a"].drained and rows["b"].drained
    rows2, changes = plan(rows, {"a": obs("a", serving=False)}, {"b"}, at=2.0)     # b drained, a still busy
    assert changes == [Change("b", "remove")] and list(rows2) == ["a"] and rows2["a"].drained
    rows3, changes = plan(rows2, {}, {"a"}, at=3.0)
    assert rows3 == {} and changes == [Change("a", "remove")]


def test_plan_undrains_a_pod_ready_again_and_replaces_a_moved_one() -> None:
    rows, changes = plan({"a": row("a", drained=True), "b": row("b")},
                         {"a": obs("a"), "b": obs("b", url="http://10.0.0.9:8000")}, set(), at=1.0)
    assert changes == [Change("a", "undrain"), Change("b", "replace")]
    assert not rows["a"].drained and rows["b"].spec["url"] == "http://10.0.0.9:8000"


FLEET = fleet_from_mapping({"models": [{"name": "llm"}],
                            "nodes": [{"name": "file-0", "url": "http://127.0.0.1:9", "models": ["llm"]}]})


def test_merge_takes_discovered_rows_and_the_file_wins_a_name() -> None:
    eff = merge_overrides(FLEET, [], discovered=[row("p1"), row("p2", drained=True),
                                                 row("file-0", url="http://10.0.0.5:8000")])
    assert eff.sources == {"file-0": "file", "p1": "discovery", "p2": "discovery"}
    assert eff.drained == frozenset({"p2"})
    assert next(n for n in eff.cfg.nodes if n.name == "file-0").url == "http://127.0.0.1:9"


def test_operators_may_drain_a_discovered_node_but_not_patch_or_remove_it() -> None:
    eff = merge_overrides(FLEET, [], discovered=[row("p1")])
    rows = set_drained(eff, [], "p1", True, key_id="admin:x", at=1.0)
    assert merge_overrides(FLEET, rows, discovered=[row("p1")]).drained == frozenset({"p1"})
    with pytest.raises(Conflict) as exc:
        patch_node(eff, [], "p1", {"weight": 2.0}, key_id=None, at=1.0)
    assert exc.value.code == "discovered_node"
    with pytest.raises(Conflict) as exc:
        remove_node(eff, [], "p1", drained_here=True, force=True, key_id=None, at=1.0)
    assert exc.value.code == "discovered_node"


def test_config_errors_name_the_key_path() -> None:
    from inferlb.errors import ConfigError

    base = {"models": [{"name": "llm"}], "nodes": []}
    cases = [({"service": "llm", "node": {"models": ["nope"]}}, "discovery[0].node.models[0]", "unknown model"),
             ({"service": "llm", "node": {"models": ["llm"], "capacity_tokens": 0}},
              "discovery[0].node.capacity_tokens", "greater than 0"),
             ({"service": "llm", "node": {"models": ["llm"], "colour": "red"}}, "discovery[0].node.colour",
              "unknown key"),
             ({"service": "llm", "node": {}}, "discovery[0].node.models", "required"),
             ({"service": "llm", "label_selector": "app=llm", "node": {"models": ["llm"]}}, "discovery[0]",
              "exactly one of service or label_selector"),
             ({"service": "llm", "node": {"models": ["llm"], "url": "http://x"}}, "discovery[0]", "node.url"),
             ({"kind": "consul", "service": "llm", "node": {"models": ["llm"]}}, "discovery[0].kind", "kubernetes"),
             ({"service": "llm", "node": {"models": ["llm"]}, "watch_s": 0}, "discovery[0].watch_s", "greater")]
    for entry, path, words in cases:
        with pytest.raises(ConfigError) as exc:
            fleet_from_mapping(copy.deepcopy({**base, "discovery": [entry]}), source="fleet.yaml")
        assert exc.value.path == path and words in exc.value.message, (entry, exc.value)
    ok = fleet_from_mapping({**base, "discovery": [{"label_selector": "app=llm", "node": {"models": ["llm"]}}]})
    assert ok.discovery[0].selector() == "app=llm"
