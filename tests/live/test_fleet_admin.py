"""The fleet changed live (live/fleet_admin.py) with an injected clock: overrides merged into the
file's fleet, the running fleet reconciled without losing node state, drains and removals settled
only when no request is in flight, and every refusal a ClientError with nothing changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inferlb.config.settings import FleetConfig, fleet_from_mapping
from inferlb.errors import ConfigError, Conflict, InvalidRequest, NotFound
from inferlb.fleet.state import Fleet
from inferlb.health.isolation import isolate, restore
from inferlb.live.fleet_admin import (
    add_node,
    apply_fleet,
    config_version,
    merge_overrides,
    patch_node,
    remove_node,
    set_drained,
    settle,
)
from inferlb.store.overrides import NodeOverride
from inferlb.types import ManualClock
from tests.support import certs


def base(n: int = 3, **extra: Any) -> FleetConfig:
    return fleet_from_mapping({
        "models": [{"name": "m"}, {"name": "solo"}],
        "nodes": [{"name": f"n{i}", "url": f"http://127.0.0.1:{9000 + i}",
                   "models": ["m"] + (["solo"] if i == 0 else []),
                   "capacity_tokens": 1000, "max_concurrency": 10} for i in range(n)],
        "health": {"slow_start": {"window_s": 30}},
        **extra,
    })


def make() -> tuple[Fleet, ManualClock, FleetConfig]:
    clock = ManualClock()
    cfg = base()
    return Fleet(cfg, clock), clock, cfg


def routable(f: Fleet) -> set[str]:
    return {v.name for v in f.views() if v.healthy}


def test_merge_applies_patches_adds_drains_and_removals() -> None:
    cfg = base()
    rows = [NodeOverride("n1", "file", {"weight": 3.0}),
            NodeOverride("n2", "file", {}, drained=True, removed=True),
            NodeOverride("x", "admin", {"name": "x", "url": "http://127.0.0.1:9100", "models": ["m"]}, drained=True),
            NodeOverride("gone", "file", {"weight": 9.0})]          # the file no longer has it: ignored
    eff = merge_overrides(cfg, rows)
    assert [n.name for n in eff.cfg.nodes] == ["n0", "n1", "x"]
    assert next(n for n in eff.cfg.nodes if n.name == "n1").weight == 3.0
    assert eff.sources == {"n0": "file", "n1": "file", "x": "admin"}
    assert eff.drained == frozenset({"x"})
    assert eff.version == config_version(eff.cfg) != config_version(cfg)
    assert merge_overrides(cfg, []).version == config_version(cfg)


def test_merge_refuses_a_node_both_in_the_file_and_added_by_an_operator() -> None:
    rows = [NodeOverride("n1", "admin", {"name": "n1", "url": "http://127.0.0.1:1", "models": ["m"]})]
    with pytest.raises(ConfigError) as e:
        merge_overrides(base(), rows, source="fleet.yaml")
    assert e.value.path == "nodes[1].name" and e.value.source == "fleet.yaml"


def test_persisting_nodes_keep_their_state_and_learned_speed() -> None:
    f, clock, cfg = make()
    st = f.nodes["n1"]
    f.acquire("n1", 10)
    f.report_success("n0", stream=True, completion_tokens=11, ttfb_s=0.1, e2e_s=1.1)
    speed = f.nodes["n0"].tokens_per_s
    for _ in range(5):
        f.report_failure("n2")
    assert f.nodes["n2"].state == "ejected"
    eff = merge_overrides(cfg, [NodeOverride("n1", "file", {"weight": 2.0})])
    changes = apply_fleet(f, eff)
    assert changes == ["changed n1"]
    assert f.nodes["n1"] is st and st.inflight_requests == 1 and st.cfg.weight == 2.0
    assert f.nodes["n0"].tokens_per_s == speed
    assert f.nodes["n2"].state == "ejected"
    assert next(v for v in f.views() if v.name == "n1").weight == 2.0


def test_an_added_node_waits_for_probes_then_slow_start() -> None:
    f, clock, cfg = make()
    _, rows = add_node(merge_overrides(cfg, []), [], {"name": "new", "url": "http://127.0.0.1:9200", "models": ["m"]},
                       key_id="admin:abc", at=clock.time())
    apply_fleet(f, merge_overrides(cfg, rows), {"key_id": "admin:abc"})
    assert f.nodes["new"].state == "loading" and "new" not in routable(f)
    added = [e for e in f.take_events() if e.node == "new"]
    assert added[0].from_state is None and added[0].to_state == "loading"
    assert added[0].evidence["key_id"] == "admin:abc"
    for _ in range(10):   # bounded: good probes until the healthy threshold
        isolate(f, {"nodes": {"new": {"probe": "ok"}}}, outliers=False)
        restore(f)
        if f.nodes["new"].state == "healthy":
            break
    assert f.nodes["new"].state == "healthy" and f.nodes["new"].slow_start_at is not None
    v = next(v for v in f.views() if v.name == "new")
    assert v.healthy and v.weight < 1.0 and v.capacity_tokens < 32768    # slow start: a small share first
    clock.advance(31)
    assert next(v for v in f.views() if v.name == "new").capacity_tokens == 32768


def test_drain_waits_for_in_flight_then_drained_and_the_sweeps_leave_it_alone() -> None:
    f, clock, cfg = make()
    f.acquire("n1", 10)
    rows = set_drained(merge_overrides(cfg, []), [], "n1", True, key_id=None, at=0.0)
    apply_fleet(f, merge_overrides(cfg, rows))
    assert f.nodes["n1"].state == "draining" and "n1" not in routable(f)
    # probes say it is fine and GPU reports are stale: still held by the operator
    isolate(f, {"nodes": {"n1": {"probe": "ok"}}}, outliers=False)
    restore(f)
    assert f.nodes["n1"].state == "draining"
    assert settle(f) == 0
    f.release("n1", 10)
    assert settle(f) == 1 and f.nodes["n1"].state == "drained"
    rows = set_drained(merge_overrides(cfg, rows), rows, "n1", False, key_id=None, at=0.0)
    assert rows == []                                     # nothing differs from the file any more
    apply_fleet(f, merge_overrides(cfg, rows))
    assert f.nodes["n1"].state == "healthy" and f.nodes["n1"].slow_start_at is not None


def test_a_removed_node_finishes_its_requests_then_is_gone() -> None:
    f, clock, cfg = make()
    f.acquire("n2", 10)
    smaller = base(2)
    changes = apply_fleet(f, merge_overrides(smaller, []))
    assert changes == ["removing n2"]
    assert f.nodes["n2"].state == "draining" and "n2" not in routable(f) and "n2" not in f.serving["m"]
    f.release("n2", 10)      # the request in flight ends normally
    assert settle(f) == 1 and "n2" not in f.nodes
    assert {v.name for v in f.views()} == {"n0", "n1"}
    assert [e.to_state for e in f.take_events() if e.node == "n2"] == ["draining", "removed"]


def test_node_operations_refuse_with_client_errors() -> None:
    cfg = base()
    eff = merge_overrides(cfg, [])
    with pytest.raises(InvalidRequest) as bad:
        add_node(eff, [], {"name": "x", "url": "ftp://nope", "models": ["m"]}, key_id=None, at=0.0)
    assert bad.value.param == "url"
    with pytest.raises(InvalidRequest) as dup:
        add_node(eff, [], {"name": "n0", "url": "http://127.0.0.1:1", "models": ["m"]}, key_id=None, at=0.0)
    assert dup.value.code == "duplicate_node"
    with pytest.raises(NotFound):
        set_drained(eff, [], "nope", True, key_id=None, at=0.0)
    with pytest.raises(InvalidRequest) as np_:
        patch_node(eff, [], "n1", {"url": "http://127.0.0.1:2"}, key_id=None, at=0.0)
    assert np_.value.code == "not_patchable"
    with pytest.raises(InvalidRequest):
        patch_node(eff, [], "n1", {"weight": -1}, key_id=None, at=0.0)
    with pytest.raises(Conflict) as nd:
        remove_node(eff, [], "n1", drained_here=False, force=False, key_id=None, at=0.0)
    assert nd.value.code == "node_not_drained" and nd.value.status == 409
    with pytest.raises(Conflict) as last:
        remove_node(eff, [], "n0", drained_here=True, force=True, key_id=None, at=0.0)
    assert last.value.code == "last_node_of_model"
    rows = remove_node(eff, [], "n1", drained_here=False, force=True, key_id=None, at=0.0)
    assert [n.name for n in merge_overrides(cfg, rows).cfg.nodes] == ["n0", "n2"]


def test_re_adding_a_retiring_node_brings_it_back_through_probes() -> None:
    f, clock, cfg = make()
    f.acquire("n2", 10)
    apply_fleet(f, merge_overrides(base(2), []))
    assert f.nodes["n2"].retired
    apply_fleet(f, merge_overrides(cfg, []))
    assert not f.nodes["n2"].retired and f.nodes["n2"].state == "loading"
    assert "n2" in f.serving["m"]


def test_no_overrides_give_back_the_same_config_for_every_section() -> None:
    cfg = base(2, routing={"profile": "token-aware", "scorers": {"outstanding-tokens": 1.0, "kv-cache": 0.5},
                           "seed": 3, "sample": 0},
               retry={"max_attempts": 2, "retry_on_status": [502, 503]},
               health={"nodes": {"n1": {"probe": False, "agent_url": "http://127.0.0.1:9401/gpu"}},
                       "outlier": {"consecutive_failures": 3}},
               observability={"finops": {"gpu_prices": {"h100": 4.1}}},
               admission={"default_class": "batch", "queue": {"min_size": 3}},
               slos=[{"model": "m", "e2e_max_s": 2.0}])
    eff = merge_overrides(cfg, [])
    assert eff.cfg == cfg and eff.version == config_version(cfg)
    # removing a node the health section names drops its entry instead of failing
    rows = [NodeOverride("n1", "file", {}, drained=True, removed=True)]
    assert "n1" not in merge_overrides(cfg, rows).cfg.health.nodes


# -- node keys: a live node names an environment variable; no key is ever stored or shown ------------

KEY_VAR = "INFERLB_TEST_FLEET_ADMIN_NODE_KEY"
SECRET = "sk-node-secret-4f1c9e"


def test_a_literal_key_is_refused_live_and_a_missing_variable_is_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_VAR, raising=False)
    cfg = base()
    eff = merge_overrides(cfg, [])
    spec = {"name": "x", "url": "http://127.0.0.1:9100", "models": ["m"]}
    for bad, code in [({**spec, "api_key": SECRET}, "literal_api_key"),
                      ({**spec, "api_key_env": KEY_VAR}, "api_key_env_missing"),
                      ({**spec, "api_key_env": "not a name"}, "invalid_node")]:
        with pytest.raises(InvalidRequest) as err:
            add_node(eff, [], bad, key_id=None, at=1.0)
        assert err.value.code == code and SECRET not in err.value.message, err.value.message
    with pytest.raises(InvalidRequest) as err:
        patch_node(eff, [], "n1", {"api_key": SECRET}, key_id=None, at=1.0)
    assert err.value.code == "literal_api_key" and "api_key_env" in err.value.message
    with pytest.raises(InvalidRequest) as err:
        patch_node(eff, [], "n1", {"api_key_env": KEY_VAR}, key_id=None, at=1.0)
    assert err.value.code == "api_key_env_missing" and KEY_VAR in err.value.message


def test_a_key_from_the_environment_is_resolved_and_never_stored_or_dumped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, SECRET)
    cfg = base(2)
    cfg = fleet_from_mapping({**cfg.model_dump(), "nodes": [
        {**cfg.nodes[0].model_dump(), "api_key": "file-literal-key-77"}, cfg.nodes[1].model_dump()]})
    eff = merge_overrides(cfg, [])
    _, rows = add_node(eff, [], {"name": "x", "url": "http://127.0.0.1:9100", "models": ["m"], "api_key_env": KEY_VAR},
                       key_id=None, at=1.0)
    rows = patch_node(merge_overrides(cfg, rows), rows, "n0", {"api_key_env": KEY_VAR}, key_id=None, at=2.0)
    eff = merge_overrides(cfg, rows)
    nodes = {n.name: n for n in eff.cfg.nodes}
    assert nodes["x"].credential() == SECRET and nodes["n0"].credential() == SECRET   # env replaced the literal
    assert nodes["n1"].credential() is None
    assert cfg.nodes[0].credential() == "file-literal-key-77"                         # the file keeps literal keys
    stored = repr([(o.spec, o.to_json()) for o in rows])
    dumped = repr(eff.cfg) + eff.cfg.model_dump_json() + repr(eff.cfg.model_dump()) + repr(cfg) + cfg.model_dump_json()
    for text in (stored, dumped):
        assert SECRET not in text and "file-literal-key-77" not in text
    assert KEY_VAR in stored
    # a legacy row holding a literal key is never shown
    legacy = NodeOverride("y", "admin", {"name": "y", "url": "http://127.0.0.1:9101", "models": ["m"],
                                         "api_key": "legacy-key-1"})
    assert "legacy-key-1" not in repr(legacy.to_json())
    with pytest.raises(ConfigError, match="api_key or api_key_env, not both"):
        fleet_from_mapping({**cfg.model_dump(), "nodes": [{**cfg.nodes[1].model_dump(), "api_key": "k",
                                                          "api_key_env": KEY_VAR}]})


def test_a_replica_without_the_variable_applies_the_node_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(KEY_VAR, SECRET)
    f, _clock, cfg = make()
    _, rows = add_node(merge_overrides(cfg, []), [], {"name": "x", "url": "http://127.0.0.1:9100", "models": ["m"],
                                                      "api_key_env": KEY_VAR}, key_id=None, at=1.0)
    monkeypatch.delenv(KEY_VAR)                        # this replica lacks it (another one had it)
    with caplog.at_level("ERROR", logger="inferlb.fleet"):
        apply_fleet(f, merge_overrides(cfg, rows), {"trigger": "overrides"})
    assert "x" in f.nodes and f.nodes["x"].cfg.credential() is None
    events = [e for e in f.take_events() if e.node == "x" and "credential missing" in e.reason]
    assert len(events) == 1 and events[0].evidence["api_key_env"] == KEY_VAR
    assert KEY_VAR in caplog.text and "credential missing" in caplog.text
    apply_fleet(f, merge_overrides(cfg, rows))         # nothing changed: not reported again
    assert not [e for e in f.take_events() if "credential missing" in e.reason]


def test_a_node_url_query_token_is_redacted_in_events_and_the_fleet_view() -> None:
    f, _clock, cfg = make()
    rows = [NodeOverride("tok", "admin", {"name": "tok", "url": "http://10.0.0.9:8000/v1?token=s3cret",
                                          "models": ["m"]})]
    apply_fleet(f, merge_overrides(cfg, rows))
    added = [e for e in f.take_events() if e.node == "tok"]
    assert added and added[0].evidence["url"] == "http://10.0.0.9:8000/v1?token=redacted"
    shown = next(d for d in f.describe() if d["name"] == "tok")
    assert shown["url"] == "http://10.0.0.9:8000/v1?token=redacted"
    assert "s3cret" not in repr(f.describe())


def test_a_node_added_live_takes_a_tls_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pem = certs(tmp_path)
    monkeypatch.setenv("NODE_KEY_PW", "pw-never-stored")
    eff = merge_overrides(base(), [])
    block = {"ca_file": str(pem.ca), "cert_file": str(pem.client_cert), "key_file": str(pem.client_key),
             "key_password_env": "NODE_KEY_PW"}
    spec = {"name": "x", "url": "https://127.0.0.1:9443", "models": ["m"], "tls": block}
    _, rows = add_node(eff, [], spec, key_id=None, at=1.0)
    node = {n.name: n for n in merge_overrides(base(), rows).cfg.nodes}["x"]
    assert node.tls is not None and node.tls.cert_file == str(pem.client_cert)
    shown = repr([o.to_json() for o in rows]) + node.model_dump_json()
    assert "pw-never-stored" not in shown and "PRIVATE KEY" not in shown
    with pytest.raises(InvalidRequest) as err:
        add_node(eff, [], {**spec, "tls": {**block, "cert_file": str(tmp_path / "gone.pem")}}, key_id=None, at=1.0)
    assert err.value.param == "tls.cert_file" and "cannot read" in err.value.message
