"""The I/O-free routing core: filters, scorers, pickers, profiles, registry."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from inferlb.errors import ConfigError, PluginError
from inferlb.routing.plugins import HasCapacity, OutstandingTokens, PowerOfTwo, WeightedRandom
from inferlb.routing.profiles import build_router
from inferlb.routing.registry import make_plugin
from inferlb.routing.types import NodeView, RouteRequest


def node(name: str, **kw: object) -> NodeView:
    base: dict[str, object] = {"models": frozenset({"m"}), "capacity_tokens": 1000, "max_concurrency": 4}
    base.update(kw)
    return NodeView(name=name, **base)  # type: ignore[arg-type]


REQ = RouteRequest(model="m", prompt_tokens=100, output_tokens=100)


def test_token_aware_prefers_the_node_with_token_room() -> None:
    r = build_router("token-aware", seed=1)
    d = r.decide(REQ, [node("busy", inflight_tokens=700, inflight_requests=1), node("idle")])
    assert d.ranked == ["idle", "busy"]
    assert d.scores["idle"]["outstanding-tokens"] == pytest.approx(0.8)
    assert d.scores["busy"]["outstanding-tokens"] == pytest.approx(0.1)


def test_token_aware_is_not_fooled_by_request_counts() -> None:
    # least-connections would pick "long" (1 request) over "short" (3 requests); tokens say otherwise
    nodes = [node("long", inflight_requests=1, inflight_tokens=900), node("short", inflight_requests=3,
                                                                          inflight_tokens=150)]
    big = RouteRequest(model="m", prompt_tokens=50, output_tokens=50)
    assert build_router("token-aware", seed=1).decide(big, nodes).pick == "short"
    assert build_router("least-connections", seed=1).decide(big, nodes).pick == "long"


def test_eliminations_carry_reasons_and_excluded_nodes() -> None:
    r = build_router("token-aware", seed=1)
    nodes = [node("sick", healthy=False, unhealthy_reason="ejected"), node("other", models=frozenset({"x"})),
             node("full", inflight_requests=4), node("tried"), node("ok")]
    d = r.decide(RouteRequest("m", 10, 10, exclude=frozenset({"tried"})), nodes)
    why = {e.node: (e.by, e.reason) for e in d.eliminated}
    assert why["sick"] == ("healthy", "ejected")
    assert why["other"][0] == "serves-model"
    assert why["full"][0] == "has-capacity"
    assert why["tried"][0] == "retry"
    assert d.ranked == ["ok"]
    assert d.to_json()["pick"] == "ok"


def test_no_candidate_gives_empty_ranking() -> None:
    d = build_router("token-aware", seed=1).decide(REQ, [node("a", healthy=False)])
    assert d.pick is None and d.ranked == []


def test_idle_node_takes_an_oversized_request() -> None:
    kept, out = HasCapacity().apply(RouteRequest("m", 5000, 5000), [node("a")])
    assert [n.name for n in kept] == ["a"] and not out


def test_round_robin_rotates() -> None:
    r = build_router("round-robin", seed=1)
    picks = [r.decide(REQ, [node("a"), node("b"), node("c")]).pick for _ in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]


def test_weighted_random_follows_scores() -> None:
    rng = random.Random(3)
    picker = WeightedRandom()
    counts = Counter(picker.rank([(node("a"), 0.75), (node("b"), 0.25)], rng)[0] for _ in range(4000))
    assert 0.70 < counts["a"] / 4000 < 0.80


def test_power_of_two_returns_every_candidate_once() -> None:
    ranked = PowerOfTwo().rank([(node(n), s) for n, s in [("a", 0.1), ("b", 0.9), ("c", 0.5), ("d", 0.3)]],
                               random.Random(1))
    assert sorted(ranked) == ["a", "b", "c", "d"]


def test_scores_stay_in_unit_interval() -> None:
    s = OutstandingTokens()
    assert s.score(RouteRequest("m", 5000, 5000), node("a", inflight_tokens=900)) == 0.0


def test_plugin_params_reject_unknown_keys() -> None:
    with pytest.raises(ConfigError, match="has-capacity"):
        make_plugin("has-capacity", {"bogus": 1})
    assert make_plugin("has-capacity", {"token_headroom": 1.5}).p.token_headroom == 1.5


def test_unknown_profile_and_plugin_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown routing profile"):
        build_router("nope")
    with pytest.raises(ConfigError, match="unknown routing plugin"):
        build_router("token-aware", scorers={"nope": 1.0})


def test_user_plugin_by_module_path() -> None:
    r = build_router("custom", filters=["healthy"], scorers={"inferlb.routing.plugins:LeastRequests": 1.0},
                     picker="max-score", seed=1)
    assert r.decide(REQ, [node("a", inflight_requests=2), node("b")]).pick == "b"


def test_a_plugin_that_does_not_load_is_a_plugin_error_at_routing() -> None:
    with pytest.raises(PluginError) as info:
        build_router("token-aware", scorers={"unknown": 1.0})
    assert info.value.path == "routing" and info.value.point == "routing plugin" and "rtt" in info.value.known
    with pytest.raises(PluginError, match=r"routing: cannot load routing plugin 'no_such_mod:X': ModuleNotFound"):
        build_router("custom", filters=["healthy"], scorers={"no_such_mod:X": 1.0}, picker="max-score")
    with pytest.raises(PluginError, match=r"'inferlb.routing.plugins' has no attribute 'Nope'"):
        build_router("custom", filters=["healthy"], scorers={"inferlb.routing.plugins:Nope": 1.0}, picker="max-score")


def test_views_and_requests_build_as_their_dataclass_says() -> None:
    """NodeView and RouteRequest fill their slots as types._quick_init writes it (plain stores
    into a same-layout twin, then their own class back): the same signature, defaults, equality,
    hash, frozenness, replace and pickling as a dataclass."""
    import dataclasses
    import inspect
    import pickle

    for cls in (NodeView, RouteRequest):
        params = list(inspect.signature(cls).parameters.values())
        fields = dataclasses.fields(cls)
        assert [p.name for p in params] == [f.name for f in fields]
        assert [p.default for p in params] == [inspect.Parameter.empty if f.default is dataclasses.MISSING
                                               else f.default for f in fields]
    v = NodeView("a", frozenset({"m"}), 100, 4, inflight_tokens=7, labels=(("gpu", "h100"),))
    assert (v.weight, v.inflight_requests, v.inflight_tokens, v.healthy) == (1.0, 0, 7, True)
    assert v == NodeView(name="a", models=frozenset({"m"}), capacity_tokens=100, max_concurrency=4, inflight_tokens=7,
                         labels=(("gpu", "h100"),)) and hash(v) == hash(pickle.loads(pickle.dumps(v)))
    assert dataclasses.replace(v, healthy=False).healthy is False and v.healthy is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.name = "b"   # type: ignore[misc]
    r = RouteRequest("m", 3, 4, stream=True)
    assert (r.tokens, r.priority, r.exclude, r.stream, r.only) == (7, None, frozenset(), True, None)
    with pytest.raises(TypeError):
        NodeView("a", frozenset())   # type: ignore[call-arg]   # required fields stay required


def test_build_makes_what_the_class_call_makes() -> None:
    """``NodeView.build`` / ``RouteRequest.build`` (types._quick_init: filled as a private twin
    class, then given the class back) take the class's parameters and give an instance of the
    class itself, equal field by field, frozen, with the memo slot empty; a subclass's instance
    (another layout) is filled through the descriptors and keeps its own class."""
    import dataclasses
    import inspect
    from typing import Any

    for cls in (NodeView, RouteRequest):
        assert list(inspect.signature(cls.build).parameters) == [f.name for f in dataclasses.fields(cls)]
    kw: dict[str, Any] = {"inflight_requests": 3, "inflight_tokens": 70, "waiting": 2, "kv_usage": 0.25,
                          "healthy": False, "unhealthy_reason": "x", "tokens_per_s": 31.5, "ttft_s": 0.2, "rtt_ms": 1.5,
          "lora_running": frozenset({"a"}), "lora_waiting": frozenset({"b"}), "max_lora": 2}
    v = NodeView.build("n1", frozenset({"m"}), 100, 4, **kw)
    w = NodeView("n1", frozenset({"m"}), 100, 4, **kw)
    assert type(v) is NodeView and type(w) is NodeView and v._terms is None and w._terms is None
    names = [f.name for f in dataclasses.fields(NodeView)]
    assert [getattr(v, n) for n in names] == [getattr(w, n) for n in names] and v == w and hash(v) == hash(w)
    assert NodeView.build("n1", frozenset({"m"}), 100, 4) == NodeView("n1", frozenset({"m"}), 100, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.inflight_tokens = 1   # type: ignore[misc]
    with pytest.raises(TypeError):
        NodeView.build("a", frozenset())   # type: ignore[call-arg]   # required fields stay required
    r = RouteRequest.build("m", 3, 4, stream=True, prefix=(1, 2), kv_blocks=2)
    assert type(r) is RouteRequest and r == RouteRequest("m", 3, 4, stream=True, prefix=(1, 2), kv_blocks=2)

    class Tagged(NodeView):   # a subclass has a __dict__: not the twin's layout
        pass

    t = Tagged("n1", frozenset({"m"}), 100, 4, **kw)
    assert type(t) is Tagged and t._terms is None
    assert [getattr(t, n) for n in names] == [getattr(w, n) for n in names]
