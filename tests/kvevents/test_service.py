"""The gateway's KV-event service (inferlb/kvevents/service.py): what routing reads, gaps and
replays, fallbacks with their reasons and metrics, reloads."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from inferlb.config.settings import fleet_from_mapping
from inferlb.kvevents.metrics import KVEventsCollector
from inferlb.kvevents.service import KVEventsService
from inferlb.routing.kvindex import sim_token_ids
from inferlb.simulator.prefix_cache import BLOCK_TOKENS
from inferlb.types import ManualClock
from tests.kvevents.vllm_format import Batch, Cleared, Stored, encode

TEXT = "the shared system prompt of this test " * 10        # 380 characters: 5 full blocks


def _cfg(**over: Any) -> Any:
    raw: dict[str, Any] = {
        "models": [{"name": "m", "kv_events": {"tokenizer": "emulator"}}, {"name": "plain"}],
        "nodes": [{"name": "a", "url": "http://127.0.0.1:9001", "models": ["m", "plain"],
                   "kv_events": {"endpoint": "tcp://127.0.0.1:5557"}},
                  {"name": "b", "url": "http://127.0.0.1:9002", "models": ["m"],
                   "kv_events": {"endpoint": "tcp://127.0.0.1:5558", "replay_endpoint": "tcp://127.0.0.1:5559"}}],
    }
    raw.update(over)
    return fleet_from_mapping(raw)


def _msg(seq: int, batch: Batch) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), encode(batch)]


def _stored(text: str, ts: float, hashes: list[int] | None = None) -> Batch:
    ids = sim_token_ids(text)
    n = len(ids) // BLOCK_TOKENS
    return Batch(ts=ts, events=[Stored(hashes or list(range(1000, 1000 + n)), None, ids[:n * BLOCK_TOKENS],
                                       BLOCK_TOKENS, None, "GPU", None)])


def test_routing_reads_the_blocks_each_node_published() -> None:
    clock = ManualClock()
    s = KVEventsService(_cfg(), clock=clock)
    now = clock.time()
    assert s.on_message("a", _msg(0, _stored(TEXT, now))) is None
    hits, blocks, why = s.route_inputs("m", TEXT + " and a question", ["a", "b"])
    assert why is None and blocks == 6 and dict(hits or ()) == {"a": 5, "b": 0}   # the question adds one
    assert s.route_inputs("plain", TEXT, ["a"]) == (None, 0, None)      # the feature is off for this model
    assert s.decisions == {("m", "used"): 1}


def test_a_gap_without_replay_clears_the_node_marks_it_stale_and_routing_falls_back() -> None:
    clock = ManualClock()
    s = KVEventsService(_cfg(), clock=clock)
    s.on_message("a", _msg(0, _stored(TEXT, clock.time())))
    gap = s.on_message("a", _msg(2, Batch(ts=clock.time(), events=[Cleared()])))
    assert gap is not None and (gap.first, gap.seq) == (1, 2)
    assert s.close_gap(gap, []) is False
    hits, _, why = s.route_inputs("m", TEXT, ["a", "b"])
    assert hits is None and why == "a: gap"
    clock.advance(31.0)
    assert s.route_inputs("m", TEXT, ["a", "b"])[2] is None            # recovered after recover_s (30 s)
    reg = CollectorRegistry()
    reg.register(KVEventsCollector(s))
    text = generate_latest(reg).decode()
    assert 'inferlb_kv_index_fallbacks_total{model="m",reason="gap"} 1.0' in text
    assert 'inferlb_kv_event_gaps_total{node="a",outcome="lost"} 1.0' in text
    assert 'inferlb_kv_index_decisions_total{model="m",outcome="used"} 1.0' in text


def test_a_replay_fills_the_gap() -> None:
    clock = ManualClock()
    s = KVEventsService(_cfg(), clock=clock)
    now = clock.time()
    first = _stored(TEXT, now)
    gap = s.on_message("b", _msg(1, Batch(ts=now, events=[])))        # the first heard is 1: 0 was missed
    assert gap is not None and gap.first == 0
    assert s.close_gap(gap, [(0, encode(first))]) is True
    assert dict(s.route_inputs("m", TEXT, ["a", "b"])[0] or ()) == {"a": 0, "b": 5}
    assert s.gaps == {("b", "replayed"): 1} and s.on_message("b", _msg(1, first)) is None   # a duplicate
    assert s.index.nodes["b"].stored == 5


def test_lag_and_silence_fall_back_and_say_so() -> None:
    clock = ManualClock()
    s = KVEventsService(_cfg(), clock=clock)
    s.on_message("a", _msg(0, _stored(TEXT, clock.time() - 10.0)))     # stamped 10 s ago
    assert s.route_inputs("m", TEXT, ["a"])[2] == "a: lagging"
    s.on_message("a", _msg(1, Batch(ts=clock.time(), events=[])))
    s.sent("a", 5)
    clock.advance(3.0)
    assert s.route_inputs("m", TEXT, ["a"])[2] == "a: silent"
    assert s.fallbacks == {("m", "lagging"): 1, ("m", "silent"): 1}


def test_what_cannot_use_the_index_falls_back_with_its_reason() -> None:
    clock = ManualClock()
    cfg = _cfg(models=[{"name": "m", "kv_events": {"tokenizer": "model"}, "tokenizer": "/no/such/tokenizer.json"},
                       {"name": "plain"}])
    s = KVEventsService(cfg, clock=clock)
    assert s.route_inputs("m", TEXT, ["a"])[2] == "no tokenizer" and s.tokenizer_problem("m")
    s = KVEventsService(_cfg(), clock=clock)
    assert s.route_inputs("m", "short", ["a"])[2] == "no full block"
    assert s.route_inputs("m", None, ["a"])[2] == "no prompt text"
    assert s.route_inputs("m", TEXT, ["a", "c"])[2] == "c: no events"
    assert s.on_message("a", [b"", b"\0" * 8, b"\xc1"]) is None and s.errors == {"a": 1}
    assert s.on_message("a", [b"one frame"]) is None and s.errors == {"a": 2}


def test_a_reload_forgets_a_node_that_left_and_voids_a_moved_endpoint() -> None:
    clock = ManualClock()
    s = KVEventsService(_cfg(), clock=clock)
    s.on_message("a", _msg(0, _stored(TEXT, clock.time())))
    s.on_message("b", _msg(0, _stored(TEXT, clock.time())))
    nodes = [{"name": "a", "url": "http://127.0.0.1:9001", "models": ["m"],
              "kv_events": {"endpoint": "tcp://127.0.0.1:6000"}}]
    start, stop = s.configure(_cfg(nodes=nodes))
    assert start == ["a"] and sorted(stop) == ["a", "b"]
    assert "b" not in s.index.nodes and s.index.blocks("a") == 0
    assert s.route_inputs("m", TEXT, ["a"])[2] == "a: disconnected"
    snap = s.snapshot()
    assert snap["nodes"]["a"]["endpoint"] == "tcp://127.0.0.1:6000" and snap["nodes"]["a"]["stale"] == "disconnected"


async def test_the_dashboard_panel_says_when_the_feature_is_off() -> None:
    from types import SimpleNamespace

    from inferlb.api.dashboard import KV_EVENTS_OFF, kv_events

    assert await kv_events(None) == KV_EVENTS_OFF
    s = KVEventsService(_cfg(), clock=ManualClock())
    panel = await kv_events(SimpleNamespace(service=s))  # type: ignore[arg-type]
    assert panel["enabled"] is True and set(panel["nodes"]) == {"a", "b"} and panel["nodes"]["b"]["replay"] is True
