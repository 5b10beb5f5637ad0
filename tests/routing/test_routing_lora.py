"""LoRA-adapter affinity: the lora-available filter, the lora-affinity scorer (pure), the profile."""

from __future__ import annotations

import pytest

from inferlb.errors import ConfigError
from inferlb.routing.lora import LoraAffinity, LoraAffinityParams, LoraAvailable, adapter_failure, lora_state
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeView, RouteRequest


def node(name: str, *, running: tuple[str, ...] = (), waiting: tuple[str, ...] = (), max_lora: int | None = 2,
         queue: int | None = 0, kv: float | None = 0.1, inflight: int = 0, failed: tuple[str, ...] = ()) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=10_000, max_concurrency=8,
                    inflight_requests=inflight, waiting=queue, kv_usage=kv, lora_running=frozenset(running),
                    lora_waiting=frozenset(waiting), max_lora=max_lora, lora_failed=frozenset(failed))


REQ = RouteRequest("m", 100, 50, adapter="sql")


def test_running_beats_waiting_beats_a_free_slot_beats_full() -> None:
    s = LoraAffinity()
    nodes = [node("run", running=("sql",)), node("wait", waiting=("sql",)), node("free", running=("x",)),
             node("full", running=("x", "y")), node("blind", max_lora=None)]
    assert [lora_state("sql", n) for n in nodes] == ["running", "waiting", "free_slot", "full", "unknown"]
    assert s.score_all(REQ, nodes) == [1.0, 0.8, 0.5, 0.0, 0.5]
    assert s.score_all(REQ, nodes) == [s.score(REQ, n) for n in nodes]


def test_a_request_without_an_adapter_is_scored_alike_everywhere() -> None:
    nodes = [node("run", running=("sql",)), node("full", running=("x", "y"))]
    assert LoraAffinity().score_all(RouteRequest("m", 100, 50), nodes) == [1.0, 1.0]


@pytest.mark.parametrize("busy", [dict(queue=4), dict(kv=0.95), dict(inflight=8)])
def test_a_saturated_node_with_the_adapter_counts_as_a_free_slot(busy: dict[str, float]) -> None:
    """Hot adapters spread: the load scorers then choose between it and a node that can load it."""
    assert LoraAffinity().score(REQ, node("hot", running=("sql",), **busy)) == 0.5   # type: ignore[arg-type]
    assert LoraAffinity(LoraAffinityParams(saturated_waiting=10)).score(REQ, node("hot", running=("sql",),
                                                                                    queue=4)) == 1.0


def test_the_filter_drops_only_the_nodes_where_that_adapter_failed() -> None:
    nodes = [node("bad", failed=("sql",)), node("ok", failed=("other",))]
    kept, out = LoraAvailable().apply(REQ, nodes)
    assert [n.name for n in kept] == ["ok"]
    assert [(e.node, e.by) for e in out] == [("bad", "lora-available")] and "'sql'" in out[0].reason
    kept, out = LoraAvailable().apply(RouteRequest("m", 1, 1), nodes)     # no adapter: nothing to drop
    assert kept is nodes and out == []
    kept, out = LoraAvailable().apply(RouteRequest("m", 1, 1, adapter="other"), nodes)
    assert [n.name for n in kept] == ["bad"]


def test_the_profile_prefers_the_loaded_node_and_puts_the_scores_in_the_audit_decision() -> None:
    r = build_router("lora-affinity", seed=1)
    nodes = [node("cold", running=("a", "b")), node("loaded", running=("sql",), queue=1), node("free")]
    d = r.decide(REQ, nodes)
    assert d.pick == "loaded"
    doc = d.to_json()
    assert doc["scores"]["loaded"]["lora-affinity"] == 1.0 and doc["scores"]["cold"]["lora-affinity"] == 0.0
    # saturated: the free node takes it (loading the adapter there) rather than queueing
    d = r.decide(REQ, [node("loaded", running=("sql",), queue=6, kv=0.5), node("free")])
    assert d.pick == "free"
    # failed there: eliminated, with its reason
    d = r.decide(REQ, [node("loaded", running=("sql",), failed=("sql",)), node("free")])
    assert d.pick == "free" and d.to_json()["eliminated_counts"] == {"lora-available": 1}


def test_params_are_validated_at_load() -> None:
    with pytest.raises(ConfigError) as ei:
        build_router("lora-affinity", params={"lora-affinity": {"runing": 1.0}})
    assert ei.value.path == "routing.params.lora-affinity"
    with pytest.raises(ConfigError):
        build_router("lora-affinity", params={"lora-affinity": {"waiting": 2.0}})


@pytest.mark.parametrize(("status", "message", "failed"), [
    (404, "The model `sql` does not exist.", True),          # vLLM: unknown adapter (or its resolver failed)
    (400, "Failed to load LoRA adapter sql: file not found", True),
    (400, "max_tokens must be at least 1", False),
    (500, "The model `sql` does not exist.", False),
    (404, None, False),
])
def test_adapter_failure_reads_vllms_words(status: int, message: str | None, failed: bool) -> None:
    assert adapter_failure(status, message, "sql") is failed
