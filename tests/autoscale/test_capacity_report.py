"""The capacity report on seeded audit rows (SQLite and PostgreSQL): remove advice on an idle
pool, add advice on the hours whose SLO broke, cost per million tokens per GPU type; the HTTP
endpoint answers bad input with the OpenAI envelope."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.engine import Engine

from inferlb.autoscale.report import capacity_report
from inferlb.config.settings import FleetConfig, fleet_from_mapping
from inferlb.store.records import AttemptRecord, RequestRecord
from tests.autoscale.conftest import T0, seasonal_records, seed


def fleet() -> FleetConfig:
    nodes: list[dict[str, Any]] = [
        {"name": f"l4-{i}", "url": f"http://127.0.0.1:{9000 + i}", "models": ["m"], "labels": {"gpu": "l4"},
         "price_per_hour": 0.8} for i in range(4)]
    nodes.append({"name": "h100-0", "url": "http://127.0.0.1:9100", "models": ["big"], "labels": {"gpu": "h100"},
                  "price_per_hour": 4.0})
    return fleet_from_mapping({
        "models": [{"name": "m"}, {"name": "big"}],
        "nodes": nodes,
        "slos": [{"model": "*", "e2e_max_s": 5.0}],
        "autoscale": {"pools": [{"model": "m", "gpu": "l4", "tokens_per_s": 100.0},
                                {"model": "big", "gpu": "h100", "tokens_per_s": 400.0}]},
    })


def test_idle_pool_gets_remove_advice_and_broken_hours_get_add(engine: Engine) -> None:
    l4 = {f"l4-{i}": "l4" for i in range(4)}
    light = seasonal_records(240, l4, model="m")                               # 4 h, light: SLO held
    seed(engine, light)
    big = seasonal_records(240, {"h100-0": "h100"}, model="big", slow_from=120)  # SLO broken in hours 3-4
    for r in big:
        r.request_id = "big-" + r.request_id
    seed(engine, big)
    rep = capacity_report(engine, fleet(), since=T0, until=T0 + 4 * 3600, bucket="1h")
    rows = {(r["model"], r["gpu"]): r for r in rep["data"]}
    m = rows[("m", "l4")]
    # tokens: sum of per_minute × 200; 4 nodes × capacity × 4 h
    assert m["nodes"] == 4 and m["slo_attainment"] == 1.0
    cap = m["capacity_tokens_s"]
    assert m["capacity_source"] == "prior" and cap == 100.0   # per-node peak ~42 tokens/s < prior 100
    # each node from its first attempt (round robin: within the first minute) to the end
    node_s = sum(T0 + 4 * 3600 - min(r.received_at for r in light if r.node == n) for n in l4)
    util = m["tokens"] / (cap * node_s)
    assert abs(m["token_utilisation"] - util) < 1e-6 and util < 0.3
    removes = [a for a in rep["advice"] if a["kind"] == "remove"]
    # the busiest hour's tokens/s / (100 × 0.7 target) = the nodes needed; the rest can go
    hourly: dict[int, int] = {}
    for r in light:
        h = int((r.received_at - T0) // 3600)
        hourly[h] = hourly.get(h, 0) + 200
    need = math.ceil(max(hourly.values()) / 3600 / (100 * 0.7))
    assert need == 2
    assert [(a["model"], a["gpu"], a["count"]) for a in removes] == [("m", "l4", 4 - need)]
    assert removes[0]["text"].startswith(f"remove 2 × l4 (m): utilisation {util * 100:.0f} % over 4 h, SLO held")
    adds = [a for a in rep["advice"] if a["kind"] == "add"]
    assert [(a["model"], a["gpu"], a["from"], a["until"]) for a in adds] == \
        [("big", "h100", T0 + 2 * 3600, T0 + 4 * 3600)]
    assert adds[0]["slo_attainment"] == 0.0 and "SLO 0 % in that window" in adds[0]["text"]
    assert "2026-01-01 02:00–04:00 UTC" in adds[0]["text"]
    # vertical: price / (capacity × 3600) per million tokens
    assert abs(m["cost_per_mtok_at_capacity"] - 0.8 / (100 * 3600) * 1e6) < 1e-6
    big_row = rows[("big", "h100")]
    # big's SLO broke at loads it had served before, and nothing queued: an under-loaded node's
    # misses are not saturation, so the 400 prior is kept (issue 22, item 7)
    assert big_row["capacity_source"] == "prior" and big_row["capacity_tokens_s"] == 400
    assert abs(big_row["cost_per_mtok_at_capacity"] - 4.0 / (big_row["capacity_tokens_s"] * 3600) * 1e6) < 1e-5
    # observed: provisioned cost (0.8 per node-hour) over the tokens served within the SLO
    assert abs(m["cost_per_mtok_observed"] - 0.8 * node_s / 3600 / m["tokens"] * 1e6) < 1e-3
    assert {v["model"] for v in rep["vertical"]} == {"m", "big"}


def test_nothing_observed_is_too_little_data_not_advice(engine: Engine) -> None:
    rep = capacity_report(engine, fleet(), since=T0, until=T0 + 3600)
    assert all(r["tokens"] == 0 and r["slo_attainment"] is None for r in rep["data"])
    assert [(a["kind"], a["text"]) for a in rep["advice"]] == [
        ("insufficient", "big on h100: too little data to advise (nothing observed; 1 h needed)"),
        ("insufficient", "m on l4: too little data to advise (nothing observed; 1 h needed)")]
    assert rep["summary"]["window_s"] == 0


def test_the_window_is_the_one_observed_not_seven_days(engine: Engine) -> None:
    """Four hours of history and the default look-back (7 days): utilisation and words are over 4 h;
    a pool that got no traffic in those 4 h is idle over 4 h."""
    end = T0 + 4 * 3600
    seed(engine, seasonal_records(240, {"h100-0": "h100"}, model="big"))
    rep = capacity_report(engine, fleet(), now=end)
    s = rep["summary"]
    assert s["since"] == end - 7 * 86_400 and s["observed_since"] == T0 and s["window_s"] == 4 * 3600
    big = next(r for r in rep["data"] if r["model"] == "big")
    assert big["token_utilisation"] == round(big["tokens"] / (400.0 * 4 * 3600), 6)
    # the l4 nodes never served: counted from the deployment's first record, not 7 days back
    assert [a["text"] for a in rep["advice"]] == ["remove 3 × l4 (m): no traffic over 4 h"]
    m = next(r for r in rep["data"] if r["model"] == "m")
    assert m["provisioned_cost"] == round(4 * 0.8 * 4, 6)


def _steady(node: str, minute0: int, minutes: int, per_min: int, e2e_s: float) -> list[RequestRecord]:
    """``per_min`` ok requests a minute on ``node`` (100 prompt + 100 completion tokens), each ``e2e_s``."""
    out = []
    for i in range(minute0, minute0 + minutes):
        for j in range(per_min):
            t = round(T0 + i * 60 + j * 60 / per_min, 6)
            out.append(RequestRecord(
                request_id=f"{node}-{i:04d}-{j:03d}", received_at=t, endpoint="chat", model_requested="m",
                model_served="m", node=node, status="ok", http_status=200, admitted_at=t, routed_at=t,
                first_byte_at=round(t + 0.01, 6), last_byte_at=round(t + e2e_s, 6), prompt_tokens=100,
                completion_tokens=100, engine="compiled",
                attempts=[AttemptRecord(number=1, node=node, model="m", started_at=t, ended_at=round(t + e2e_s, 6),
                                        outcome="ok", http_status=200)]))
    return out


def two_types() -> FleetConfig:
    return fleet_from_mapping({
        "models": [{"name": "m"}],
        "nodes": [{"name": "l4-0", "url": "http://127.0.0.1:9000", "models": ["m"], "labels": {"gpu": "l4"},
                   "price_per_hour": 0.8},
                  {"name": "l4-1", "url": "http://127.0.0.1:9001", "models": ["m"], "labels": {"gpu": "l4"},
                   "price_per_hour": 0.8},
                  {"name": "h100-0", "url": "http://127.0.0.1:9100", "models": ["m"], "labels": {"gpu": "h100"},
                   "price_per_hour": 4.0}],
        "slos": [{"model": "*", "e2e_max_s": 5.0}],
    })


def test_vertical_advice_compares_speed_at_comparable_load_not_traffic(engine: Engine) -> None:
    # l4: 12 requests a minute per node (40 tokens/s), 20 ms per output token. h100: 30 minutes at
    # the same 40 tokens/s, 5 ms per token, then 30 minutes at 400 tokens/s, 15 ms per token.
    recs = _steady("l4-0", 0, 60, 12, 2.0) + _steady("l4-1", 0, 60, 12, 2.0)
    recs += _steady("h100-0", 0, 30, 12, 0.5) + _steady("h100-0", 30, 30, 120, 1.5)
    seed(engine, recs)
    rep = capacity_report(engine, two_types(), since=T0, until=T0 + 3600, bucket="1h")
    [v] = rep["vertical"]
    assert v["basis"] == "speed" and v["load_tokens_s"] == [40.0, 40.0]
    assert v["ms_per_token"] == {"l4": 20.0, "h100": 5.0}   # the h100's busy half is not comparable load
    # price × ms per token: l4 0.8 × 20 / 3.6, h100 4.0 × 5 / 3.6 per million tokens
    assert v["cost_per_mtok"] == {"l4": round(0.8 * 20 / 3.6, 6), "h100": round(4.0 * 5 / 3.6, 6)}
    assert v["gpu"] == "l4" and v["text"].endswith("prefer l4")
    assert "at comparable load (40–40 tokens/s per node) l4 takes 20 ms per token vs 5 ms on h100" in v["text"]
    rows = {r["gpu"]: r for r in rep["data"]}
    assert rows["l4"]["cost_per_mtok_at_speed"] == v["cost_per_mtok"]["l4"]
    # by the traffic each happened to get (capacity = the highest rate held), h100 would look cheaper
    assert rows["h100"]["cost_per_mtok_at_capacity"] < rows["l4"]["cost_per_mtok_at_capacity"]


def test_vertical_advice_without_comparable_load_says_so(engine: Engine) -> None:
    seed(engine, _steady("l4-0", 0, 60, 12, 2.0) + _steady("h100-0", 0, 60, 120, 1.5))
    rep = capacity_report(engine, two_types(), since=T0, until=T0 + 3600)
    [v] = rep["vertical"]
    assert v["basis"] == "insufficient" and v["gpu"] is None and v["ms_per_token"] is None
    assert v["text"] == ("m: too little data to compare h100, l4 at comparable load (no load in common "
                         "(tokens/s per node: h100 400–400, l4 40–40)): no preference")
    seed(engine, _steady("h100-0", 60, 5, 12, 0.5))   # 5 node-minutes at 40 tokens/s: fewer than 10
    rep = capacity_report(engine, two_types(), since=T0, until=T0 + 3900)
    [v] = rep["vertical"]
    assert v["basis"] == "insufficient" and "5 node-minute(s) of h100 at 40–40 tokens/s per node, 10 needed" \
        in v["text"]



def test_slo_breaks_while_requests_queue_lower_the_capacity(engine: Engine) -> None:
    """The audit trail's saturation signal: the same breaks as above, but the breaking requests
    waited ≥ 100 ms in the admission queue (the node was full): the capacity is learned below the
    400 prior, from the audit trail's ``queue_wait_ms`` (autoscale/capacity_query.py)."""
    big = seasonal_records(240, {"h100-0": "h100"}, model="big", slow_from=120)
    for r in big:
        if r.last_byte_at is not None and r.last_byte_at - r.received_at > 5:
            r.queue_wait_ms = 500.0
    seed(engine, big)
    rep = capacity_report(engine, fleet(), since=T0, until=T0 + 4 * 3600, bucket="1h")
    row = next(r for r in rep["data"] if r["model"] == "big")
    assert row["capacity_source"] == "learned" and row["capacity_tokens_s"] < 400
