"""The capacity report on seeded audit rows (SQLite and PostgreSQL): remove advice on an idle
pool, add advice on the hours whose SLO broke, cost per million tokens per GPU type; the HTTP
endpoint answers bad input with the OpenAI envelope."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.engine import Engine

from inferlb.autoscale.report import capacity_report
from inferlb.config.settings import FleetConfig, fleet_from_mapping
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
    rows = {(r["model"], r["gpu"]): r for r in rep["data"]}   # type: ignore[index]
    m = rows[("m", "l4")]
    # tokens: sum of per_minute × 200; 4 nodes × capacity × 4 h
    assert m["nodes"] == 4 and m["slo_attainment"] == 1.0
    cap = m["capacity_tokens_s"]
    assert m["capacity_source"] == "prior" and cap == 100.0   # per-node peak ~42 tokens/s < prior 100
    util = m["tokens"] / (4 * cap * 4 * 3600)
    assert abs(m["token_utilisation"] - util) < 1e-6 and util < 0.3
    removes = [a for a in rep["advice"] if a["kind"] == "remove"]   # type: ignore[union-attr]
    # the busiest hour's tokens/s / (100 × 0.7 target) = the nodes needed; the rest can go
    hourly: dict[int, int] = {}
    for r in light:
        h = int((r.received_at - T0) // 3600)
        hourly[h] = hourly.get(h, 0) + 200
    need = math.ceil(max(hourly.values()) / 3600 / (100 * 0.7))
    assert need == 2
    assert [(a["model"], a["gpu"], a["count"]) for a in removes] == [("m", "l4", 4 - need)]
    assert removes[0]["text"].startswith(f"remove 2 × l4 (m): utilisation {util * 100:.0f} % over 4 h, SLO held")
    adds = [a for a in rep["advice"] if a["kind"] == "add"]   # type: ignore[union-attr]
    assert [(a["model"], a["gpu"], a["from"], a["until"]) for a in adds] == \
        [("big", "h100", T0 + 2 * 3600, T0 + 4 * 3600)]
    assert adds[0]["slo_attainment"] == 0.0 and "SLO 0 % in that window" in adds[0]["text"]
    assert "2026-01-01 02:00–04:00 UTC" in adds[0]["text"]
    # vertical: price / (capacity × 3600) per million tokens
    assert abs(m["cost_per_mtok_at_capacity"] - 0.8 / (100 * 3600) * 1e6) < 1e-6
    big_row = rows[("big", "h100")]
    # big's SLO broke at loads it had served before: the rule reads that as saturation and learns
    # the highest rate that held below the lowest breaking one (not the 400 prior)
    assert big_row["capacity_source"] == "learned" and big_row["capacity_tokens_s"] < 400
    assert abs(big_row["cost_per_mtok_at_capacity"] - 4.0 / (big_row["capacity_tokens_s"] * 3600) * 1e6) < 1e-5
    # observed: provisioned cost (4 × 0.8 × 4 h) over the tokens served within the SLO
    assert abs(m["cost_per_mtok_observed"] - 4 * 0.8 * 4 / m["tokens"] * 1e6) < 1e-3
    assert {v["model"] for v in rep["vertical"]} == {"m", "big"}   # type: ignore[union-attr]


def test_a_window_without_traffic_says_so(engine: Engine) -> None:
    rep = capacity_report(engine, fleet(), since=T0, until=T0 + 3600)
    assert all(r["tokens"] == 0 and r["slo_attainment"] is None for r in rep["data"])   # type: ignore[union-attr]
    assert [a["text"] for a in rep["advice"]] == ["remove 3 × l4 (m): no traffic over 1 h"]   # type: ignore[union-attr]
