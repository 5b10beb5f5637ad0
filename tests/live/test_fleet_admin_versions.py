"""live/fleet_admin.py next to model versions: which versions name a node, and which added node
no version takes in (by list, or by a selector its labels do not match)."""

from __future__ import annotations

from inferlb.config.settings import FleetConfig, fleet_from_mapping
from inferlb.live.fleet_admin import naming_versions, unversioned_warnings


def _cfg(versions: list[dict[str, object]]) -> FleetConfig:
    return fleet_from_mapping({
        "models": [{"name": "m", "versions": versions}, {"name": "plain"}],
        "nodes": [{"name": "a", "url": "http://10.0.0.1:8000", "models": ["m", "plain"], "labels": {"track": "stable"}},
                  {"name": "b", "url": "http://10.0.0.2:8000", "models": ["m"], "labels": {"track": "canary"}},
                  {"name": "c", "url": "http://10.0.0.3:8000", "models": ["m", "plain"]}],
    })


def test_listed_versions_name_their_nodes_and_leave_the_others_out() -> None:
    cfg = _cfg([{"name": "v1", "nodes": ["a"]}, {"name": "v2", "nodes": ["a", "b"], "weight": 0.5}])
    assert naming_versions(cfg, "a") == ["models[m].versions[v1].nodes", "models[m].versions[v2].nodes"]
    assert naming_versions(cfg, "c") == []
    assert unversioned_warnings(cfg, "a") == [] and unversioned_warnings(cfg, "b") == []
    [line] = unversioned_warnings(cfg, "c")
    assert "models[m].versions[v1].nodes lists a" in line and "models[m].versions[v2].nodes lists a, b" in line


def test_a_selector_takes_in_what_it_matches_and_a_version_without_either_takes_every_node() -> None:
    cfg = _cfg([{"name": "v1", "selector": {"track": "stable"}}, {"name": "v2", "selector": {"track": "canary"}}])
    [line] = unversioned_warnings(cfg, "c")
    assert "models[m].versions[v1].selector is" in line and "no traffic for 'm'" in line
    cfg = _cfg([{"name": "v1", "nodes": ["a"]}, {"name": "v2"}])
    assert unversioned_warnings(cfg, "c") == []
