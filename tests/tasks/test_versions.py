"""request/evaluate resolves the model version (pinned or sticky) and routing/select routes over
that version's nodes only; the other versions serve only when every node of it is down; a
fallback model gets its own version; dispatch asks for the version's upstream name."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from inferlb.app import request_end
from inferlb.config.settings import Settings, fleet_from_mapping
from inferlb.engine.scope import Runtime, build_runtime
from inferlb.tasks.evaluate import evaluate
from inferlb.tasks.routing import fallback, select
from inferlb.types import ManualClock
from tests.tasks.conftest import start


@pytest.fixture
def vrt() -> Runtime:
    cfg = fleet_from_mapping({
        "models": [{"name": "m", "fallbacks": ["f"], "upstream_name": "m-base",
                    "versions": [{"name": "v1", "weight": 50, "nodes": ["a", "b"]},
                                 {"name": "v2", "weight": 50, "nodes": ["c"], "upstream_name": "m-v2"}]},
                   {"name": "f", "version": "static-1"}],
        "nodes": [{"name": n, "url": f"http://127.0.0.1:{9000 + i}", "models": ["m", "f"]}
                  for i, n in enumerate("abc")],
    })
    return build_runtime(Settings(), cfg, clock=ManualClock(), seed=1, end=partial(request_end, audit=lambda r: None))


def _route(rt: Runtime, **kw: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    scope, data = start(rt, **kw)
    data["evaluation"] = evaluate(scope, data, {})
    return scope, data, data["evaluation"]


def test_a_user_keeps_a_version_and_routing_uses_only_its_nodes(vrt: Runtime) -> None:
    seen: dict[str, set[str]] = {}
    for i in range(60):
        scope, data, ev = _route(vrt, user=f"u{i % 6}", tenant="t")
        assert ev["ok"] and ev["version"] == scope.record.model_version
        routing = select(scope, data, {})
        version_nodes = {"v1": {"a", "b"}, "v2": {"c"}}[ev["version"]]
        assert routing["ok"] and routing["node"] in version_nodes and routing["version"] == ev["version"]
        assert scope.record.decisions[-1]["version"] == ev["version"]
        assert scope.record.decisions[-1]["eliminated_counts"].get("model-version") == 3 - len(version_nodes)
        seen.setdefault(f"u{i % 6}", set()).add(ev["version"])
        assert scope.upstream_model() == ("m-v2" if ev["version"] == "v2" else "m-base")
    assert all(len(v) == 1 for v in seen.values()) and {"v1", "v2"} <= set().union(*seen.values())


def test_pinning_and_unknown_versions(vrt: Runtime) -> None:
    scope, data, ev = _route(vrt, model_version="v2")
    assert ev["version"] == "v2" and scope.version_pinned
    bad = _route(vrt, model_version="v9")[2]
    assert (bad["ok"], bad["status"], bad["code"], bad["param"]) == (False, 400, "model_version_not_found",
                                                                     "x-inferlb-model-version")
    # A model without versions accepts its static label only.
    assert _route(vrt, model="f", model_version="static-1")[2]["ok"]
    assert _route(vrt, model="f", model_version="v1")[2]["code"] == "model_version_not_found"


def _down(rt: Runtime, *names: str) -> None:
    for n in names:
        st = rt.fleet.nodes[n]
        rt.fleet.transition(st, "down", "test")


def test_other_versions_serve_only_when_every_node_of_the_version_is_down(vrt: Runtime) -> None:
    _down(vrt, "c")
    vrt.fleet.health = vrt.fleet.health.model_copy(update={"outlier": vrt.fleet.health.outlier.model_copy(
        update={"panic_threshold_percent": 0})})
    scope, data, _ = _route(vrt, model_version=None, user="x")
    scope.version = vrt.versions.get("m").get("v2")   # type: ignore[union-attr]
    routing = select(scope, data, {})
    assert routing["ok"] and routing["version"] == "v1" and routing["node"] in ("a", "b")
    assert scope.record.model_version == "v1" and scope.record.decisions[-1]["version_fallback_from"] == "v2"
    # Pinned: no other version serves it.
    scope, data, _ = _route(vrt, model_version="v2")
    assert not select(scope, data, {})["ok"]


def test_busy_nodes_keep_their_version(vrt: Runtime) -> None:
    node = vrt.fleet.nodes["c"]
    node.inflight_requests = node.cfg.max_concurrency    # full, but up
    scope, data, _ = _route(vrt)
    scope.version = vrt.versions.get("m").get("v2")   # type: ignore[union-attr]
    routing = select(scope, data, {})
    assert not routing["ok"] and routing["version"] == "v2"


def test_a_fallback_model_gets_its_own_version(vrt: Runtime) -> None:
    scope, data, _ = _route(vrt, user="u1")
    out = fallback(scope, data, {})
    assert out["ok"] and scope.model == "f" and scope.version is None
    assert scope.record.model_version == "static-1"
