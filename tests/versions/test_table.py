"""Version config checks at load (key paths) and the runtime table (overrides, swaps, reload)."""

from __future__ import annotations

from typing import Any

import pytest

from inferlb.config.settings import fleet_from_mapping
from inferlb.errors import ConfigError
from inferlb.versions.table import VersionTable


def _fleet(versions: list[dict[str, Any]], **model: Any) -> dict[str, Any]:
    return {
        "models": [{"name": "m", "versions": versions, **model}, {"name": "other"}],
        "nodes": [
            {"name": "a", "url": "http://127.0.0.1:9001", "models": ["m"], "labels": {"track": "stable"}},
            {"name": "b", "url": "http://127.0.0.1:9002", "models": ["m"], "labels": {"track": "stable"}},
            {"name": "c", "url": "http://127.0.0.1:9003", "models": ["m"], "labels": {"track": "canary"}},
            {"name": "d", "url": "http://127.0.0.1:9004", "models": ["other"]},
        ],
    }


def _error(versions: list[dict[str, Any]]) -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        fleet_from_mapping(_fleet(versions), source="fleet.yaml")
    return exc.value


def test_versions_resolve_nodes_by_name_selector_or_default() -> None:
    cfg = fleet_from_mapping(_fleet([
        {"name": "v1", "weight": 90, "selector": {"track": "stable"}},
        {"name": "v2", "weight": 10, "nodes": ["c"], "upstream_name": "m-v2"},
        {"name": "all", "weight": 0},
    ]))
    t = VersionTable.from_fleet(cfg)
    mv = t.get("m")
    assert mv is not None and t.get("other") is None
    assert {v.name: sorted(v.nodes) for v in mv.versions} == {"v1": ["a", "b"], "v2": ["c"], "all": ["a", "b", "c"]}
    assert mv.get("v2") is not None and mv.get("v2").upstream_name == "m-v2"   # type: ignore[union-attr]
    assert mv.shares() == {"v1": 0.9, "v2": 0.1, "all": 0.0}
    assert [v.name for v in mv.alternatives("v2")] == ["v1"]          # weight 0 takes no traffic


@pytest.mark.parametrize(("versions", "path", "words"), [
    ([{"name": "v1", "nodes": ["a"]}, {"name": "v2", "nodes": ["zz"]}], "models[0].versions[1].nodes[0]",
     "unknown node 'zz'"),
    ([{"name": "v1", "nodes": ["d"]}], "models[0].versions[0].nodes[0]", "does not serve model 'm'"),
    ([{"name": "v1", "weight": 0}, {"name": "v2", "weight": 0}], "models[0].versions", "positive number"),
    ([{"name": "v1", "selector": {"track": "nightly"}}], "models[0].versions[0]", "no node of model 'm' matches"),
    ([{"name": "v1", "nodes": ["a"], "selector": {"track": "stable"}}], "models[0].versions[0]", "not both"),
    ([{"name": "v1"}, {"name": "v1"}], "models[0].versions[1].name", "duplicate version name"),
    ([{"name": "v 1"}], "models[0].versions[0].name", "version name"),
    ([{"name": "v1", "weight": -1}], "models[0].versions[0].weight", "greater than or equal to 0"),
    ([{"name": "v1", "nodes": []}], "models[0].versions[0].nodes", "empty node list"),
    ([{"name": "v1", "wieght": 3}], "models[0].versions[0].wieght", "unknown key"),
])
def test_bad_versions_are_config_errors_with_the_key_path(versions: list[dict[str, Any]], path: str,
                                                          words: str) -> None:
    err = _error(versions)
    assert err.path == path and err.source == "fleet.yaml"
    assert words in err.message, err.message


def test_overrides_swap_whole_and_reject_bad_weights() -> None:
    cfg = fleet_from_mapping(_fleet([{"name": "v1", "weight": 100}, {"name": "v2", "weight": 0, "nodes": ["c"]}]))
    t = VersionTable.from_fleet(cfg)
    before = t.get("m")
    t.set_weights("m", {"v1": 95, "v2": 5})
    after = t.get("m")
    assert after is not before and after is not None and after.overridden
    assert before is not None and before.shares()["v2"] == 0.0           # a reader's snapshot never changes
    for bad in ({"v3": 1.0}, {"v1": -1.0}, {"v1": float("nan")}, {"v1": 0.0, "v2": 0.0}):
        with pytest.raises(ValueError):
            t.set_weights("m", bad)
        assert t.get("m") is after                                      # nothing applied
    with pytest.raises(ValueError):
        t.set_weights("other", {"x": 1.0})
    t.clear_weights("m")
    cleared = t.get("m")
    assert cleared is not None and not cleared.overridden and cleared.shares()["v2"] == 0.0


def test_swap_config_keeps_overrides_of_versions_that_still_exist() -> None:
    cfg = fleet_from_mapping(_fleet([{"name": "v1", "weight": 100}, {"name": "v2", "weight": 0, "nodes": ["c"]}]))
    t = VersionTable.from_fleet(cfg)
    t.set_weights("m", {"v1": 75, "v2": 25})
    # A reload: v2 moves to node b, a new version v3 appears.
    new = fleet_from_mapping(_fleet([{"name": "v1", "weight": 100}, {"name": "v2", "weight": 0, "nodes": ["b"]},
                                     {"name": "v3", "weight": 0, "nodes": ["a"]}]))
    t.swap_config(new)
    mv = t.get("m")
    assert mv is not None and mv.overridden
    assert {v.name: (v.weight, sorted(v.nodes)) for v in mv.versions} == {
        "v1": (75.0, ["a", "b", "c"]), "v2": (25.0, ["b"]), "v3": (0.0, ["a"])}
    t.swap_config(fleet_from_mapping({**_fleet([]), "models": [{"name": "m"}, {"name": "other"}]}))
    assert t.get("m") is None and t.models() == []


def test_requests_without_a_user_are_drawn_per_request() -> None:
    cfg = fleet_from_mapping(_fleet([{"name": "v1", "weight": 50}, {"name": "v2", "weight": 50, "nodes": ["c"]}]))
    t = VersionTable.from_fleet(cfg)
    got = {t.assign("m", None, None, f"req-{i}").name for i in range(200)}   # type: ignore[union-attr]
    assert got == {"v1", "v2"}
    sticky = {t.assign("m", "acme", "alice", f"req-{i}").name for i in range(200)}   # type: ignore[union-attr]
    assert len(sticky) == 1
