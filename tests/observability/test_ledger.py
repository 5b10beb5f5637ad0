"""The cost ledger: the fair-share rule, buckets, the books balancing, prices, and the ledger
recomputed independently from the audit records of real traffic, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from sqlalchemy.engine import Engine

from inferlb.config.observability import FinOpsConfig
from inferlb.config.settings import fleet_from_mapping
from inferlb.cost import node_prices
from inferlb.node_types import NodeEvent
from inferlb.simulator.emulator import SimFleet
from inferlb.store.db import make_engine
from inferlb.store.events import insert_events, recent_events
from inferlb.store.ledger import Occupancy, attribute, build_ledger, cost_report
from tests.observability import seed
from tests.support import fast_specs, fleet_for, free_port, running_gateway, settings_for

S = 1_000_000   # µs per second
H = 3600.0      # a price of 3600/h is 1 per GPU-second: costs read as seconds


def _occ(rid: str, node: str, start_s: float, end_s: float, attempt: int = 1) -> Occupancy:
    return Occupancy(rid, attempt, node, round(start_s * S), round(end_s * S))


def brute_force(occs: Iterable[Occupancy], prices: dict[str, float], since_us: int, until_us: int,
                born: dict[str, int] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """The rule, written the slow obvious way: for every elementary interval, who is in flight?
    A node is idle only from ``born`` (its first appearance), clipped to the window."""
    per_request: dict[str, float] = defaultdict(float)
    idle: dict[str, float] = {}
    by_node: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for o in occs:
        lo, hi = max(o.start_us, since_us), min(o.end_us, until_us)
        if hi > lo:
            by_node[o.node].append((o.request_id, lo, hi))
    for node in set(prices) | set(by_node):
        rate = prices.get(node, 0.0) / 3600 / S
        items = by_node.get(node, [])
        start = min(until_us, max(since_us, (born or {}).get(node, since_us)))
        points = sorted({start, until_us, *(p for _, lo, hi in items for p in (lo, hi))})
        idle[node] = 0.0
        for a, b in itertools.pairwise(points):
            active = [rid for rid, lo, hi in items if lo <= a and hi >= b]
            for rid in active:
                per_request[rid] += (b - a) / len(active) * rate
            if not active:
                idle[node] += (b - a) * rate
    return dict(per_request), idle


def test_equal_share_among_overlapping_attempts() -> None:
    # price 1/s; A alone 0-5, A+B 5-10, B alone 10-15, idle 15-20 and all of node y
    led = attribute([_occ("A", "x", 0, 10), _occ("B", "x", 5, 15)], {"x": H, "y": H}, since_us=0, until_us=20 * S)
    assert led.request_costs() == pytest.approx({"A": 7.5, "B": 7.5})
    idle = {line.node: (line.idle_s, line.cost, line.provisioned_s) for line in led.idle}
    assert idle == {"x": pytest.approx((5.0, 5.0, 20.0)), "y": pytest.approx((20.0, 20.0, 20.0))}


def test_a_node_is_provisioned_only_from_its_first_appearance() -> None:
    # x appeared at 8 s (busy 10-12), y after the window, z before it: 20 s window, 10 s buckets
    occs = [_occ("A", "x", 10, 12)]
    first = {"x": 8 * S, "y": 30 * S, "z": -100 * S}
    led = attribute(occs, {"x": H, "y": H, "z": H}, since_us=0, until_us=20 * S, first_us=first)
    idle = {line.node: (line.provisioned_s, line.idle_s) for line in led.idle}
    assert idle == {"x": pytest.approx((12.0, 10.0)), "y": (0.0, 0.0), "z": pytest.approx((20.0, 20.0))}
    assert led.request_costs() == pytest.approx({"A": 2.0})
    bucketed = attribute(occs, {"x": H, "y": H}, since_us=0, until_us=20 * S, bucket_us=10 * S, first_us=first)
    lines = [(line.node, line.bucket_us, line.provisioned_s, line.idle_s) for line in bucketed.idle]
    assert lines == [("x", 0, 2.0, 2.0), ("x", 10 * S, 10.0, 8.0)]   # y: no bucket of the window had it
    # an attempt is proof of life even when the appearance given is later
    late = attribute(occs, {"x": H}, since_us=0, until_us=20 * S, first_us={"x": 15 * S})
    assert [(line.provisioned_s, line.idle_s) for line in late.idle] == [pytest.approx((10.0, 8.0))]


def test_window_clips_and_buckets_split() -> None:
    occs = [_occ("A", "x", -5, 25), _occ("B", "x", 8, 12)]
    led = attribute(occs, {"x": H}, since_us=0, until_us=20 * S, bucket_us=10 * S)
    by = {(c.request_id, c.bucket_us): c.gpu_s for c in led.charges}
    # A alone 0-8 and 12-20; shares 8-12 with B (2 s each, split across the 10 s boundary)
    assert by == pytest.approx({("A", 0): 9.0, ("A", 10 * S): 9.0, ("B", 0): 1.0, ("B", 10 * S): 1.0})
    assert [(line.bucket_us, line.idle_s) for line in led.idle] == [(0, 0.0), (10 * S, 0.0)]


def test_matches_the_brute_force_rule_and_balances() -> None:
    rng = random.Random(42)
    prices = {"a": 4.1, "b": 2.5, "c": 0.0}
    occs = []
    for i in range(300):
        start = rng.uniform(0, 600)
        occs.append(_occ(f"r{i // 2}", rng.choice("abc"), start, start + rng.expovariate(1 / 8), attempt=i % 2 + 1))
    since, until = 60 * S, 540 * S
    led = attribute(occs, prices, since_us=since, until_us=until, bucket_us=37 * S)
    want, want_idle = brute_force(occs, prices, since, until)
    got = led.request_costs()
    assert set(got) == {rid for rid, cost in want.items() if cost or rid in got}
    for rid, cost in want.items():
        assert got.get(rid, 0.0) == pytest.approx(cost, rel=1e-9, abs=1e-12)
    for node in prices:
        assert sum(line.cost for line in led.idle if line.node == node) == pytest.approx(want_idle[node], abs=1e-9)
        busy = sum(c.gpu_s for c in led.charges if c.node == node)
        idle = sum(line.idle_s for line in led.idle if line.node == node)
        assert busy + idle == pytest.approx((until - since) / S)   # the books balance per node
    # young nodes: the same sweep from each node's first appearance (b appeared mid-window)
    born = {n: min(o.start_us for o in occs if o.node == n) for n in "ac"} | {"b": 300 * S}
    born["b"] = min(born["b"], min(o.start_us for o in occs if o.node == "b"))
    led = attribute(occs, prices, since_us=since, until_us=until, bucket_us=37 * S, first_us=born)
    want, want_idle = brute_force(occs, prices, since, until, born)
    for node in prices:
        assert sum(line.cost for line in led.idle if line.node == node) == pytest.approx(want_idle[node], abs=1e-9)
        busy = sum(c.gpu_s for c in led.charges if c.node == node)
        idle = sum(line.idle_s for line in led.idle if line.node == node)
        assert busy + idle == pytest.approx((until - max(since, born[node])) / S)


def test_prices_from_node_or_gpu_type() -> None:
    cfg = fleet_from_mapping({
        "models": [{"name": "m"}],
        "nodes": [{"name": "a", "url": "http://a", "models": ["m"], "price_per_hour": 3.0, "labels": {"gpu": "h100"}},
                  {"name": "b", "url": "http://b", "models": ["m"], "labels": {"gpu": "h100"}},
                  {"name": "c", "url": "http://c", "models": ["m"]}],
        "observability": {"finops": {"gpu_prices": {"h100": 4.5}}},
    })
    assert node_prices(cfg.nodes, cfg.observability.finops) == {"a": 3.0, "b": 4.5, "c": 0.0}
    assert node_prices(cfg.nodes, FinOpsConfig()) == {"a": 3.0, "b": 0.0, "c": 0.0}


def test_cost_report_groups_buckets_and_idle(engine: Engine) -> None:
    recs = seed.seed(engine, n=240)
    prices = node_prices(seed.fleet().nodes)
    rep = cost_report(engine, prices=prices, since=seed.START, until=seed.END, group_by="tenant")
    s = rep["summary"]
    first = {n: min(a.started_at for r in recs for a in r.attempts if a.node == n) for n in prices}
    assert s["first_seen"] == pytest.approx(first) and s["unseen_nodes"] == []
    # each of the 3 nodes from its first attempt (within the first minutes) to the end of the 2 hours
    assert s["provisioned_cost"] == pytest.approx(sum(p * (seed.END - first[n]) / 3600 for n, p in prices.items()))
    assert s["attributed_cost"] + s["idle_cost"] == pytest.approx(s["provisioned_cost"])
    usage = {r["tenant"]: r for r in rep["data"] if r["kind"] == "usage"}
    assert set(usage) == set(seed.TENANTS)
    assert sum(r["requests"] for r in usage.values()) == len(recs) == s["requests"]
    acme = usage["acme"]
    assert acme["cost_per_request"] == pytest.approx(acme["cost"] / acme["requests"], rel=1e-6)
    assert acme["cost_per_1k_tokens"] == pytest.approx(
        acme["cost"] / (acme["prompt_tokens"] + acme["completion_tokens"]) * 1000, rel=1e-6)
    [idle] = [r for r in rep["data"] if r["kind"] == "idle"]
    assert idle["tenant"] == "(idle)" and idle["cost"] == pytest.approx(s["idle_cost"], abs=1e-6)

    by_node = cost_report(engine, prices=prices, since=seed.START, until=seed.END, group_by="node,model",
                          bucket="30m")
    buckets = sorted({r["bucket"] for r in by_node["data"]})
    assert buckets == [seed.START + i * 1800 for i in range(4)]
    idle_rows = [r for r in by_node["data"] if r["kind"] == "idle"]
    assert len(idle_rows) == 4 * 3 and {r["model"] for r in idle_rows} == {"(idle)"}
    total = sum(r["cost"] for r in by_node["data"])
    assert total == pytest.approx(by_node["summary"]["provisioned_cost"], rel=1e-6)
    # the same ledger whatever the grouping
    assert by_node["summary"]["attributed_cost"] == pytest.approx(s["attributed_cost"])


def _audit_records(base: str) -> list[dict[str, Any]]:
    with httpx.Client(base_url=base, timeout=10) as http:
        page = http.get("/audit/requests", params={"limit": 1000}).json()["data"]
        return [http.get(f"/audit/requests/{r['request_id']}").json() for r in page]


async def test_ledger_is_reproducible_from_the_audit_records(db_url: str, tmp_path: Path) -> None:
    async with SimFleet(fast_specs(2, tpot_s=0.002)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        urls["dead"] = f"http://127.0.0.1:{free_port()}"   # connection refused: attempts fail and are retried
        fleet = fleet_for(urls, profile="round-robin")
        async with running_gateway(settings_for(tmp_path, fleet, database_url=db_url)) as (base, app):
            client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)

            async def plain(i: int) -> None:
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=8 + i, extra_headers={"x-inferlb-tenant": f"t{i % 3}"})

            async def streamed(i: int, abort: bool) -> None:
                stream = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "s"}], max_tokens=30, stream=True,
                    extra_headers={"x-inferlb-tenant": f"t{i % 3}"})
                async for _ in stream:
                    if abort:
                        break
                await stream.close()

            await asyncio.gather(*(plain(i) for i in range(12)), *(streamed(i, i % 3 == 0) for i in range(9)))
            records: list[dict[str, Any]] = []
            for _ in range(500):   # the aborted streams' records land once the server sees the disconnect
                await app.state.store.writer.wait_caught_up(5)
                records = await asyncio.to_thread(_audit_records, base)
                if len(records) == 21:
                    break
                await asyncio.sleep(0.01)
            assert len(records) == 21
            attempts = [a for r in records for a in r["attempts"]]
            assert any(a["node"] == "dead" for a in attempts), "no attempt was retried"
            since = min(r["received_at"] for r in records) - 1
            until = max(a["ended_at"] or r["last_byte_at"] for r in records for a in r["attempts"]) + 1
            async with httpx.AsyncClient(base_url=base) as http:
                report = (await http.get("/reports/cost", params={"since": since, "until": until,
                                                                   "group_by": "tenant,node"})).json()
    prices = node_prices(fleet.nodes)
    occs = [Occupancy(r["request_id"], a["number"], a["node"], round(a["started_at"] * S),
                      round(max(a["started_at"], a["ended_at"] or r["last_byte_at"]) * S))
            for r in records for a in r["attempts"]]
    since_us, until_us = round(since * S), round(until * S)
    eng = make_engine(db_url)
    try:
        events = recent_events(eng, limit=10_000)
        got = build_ledger(eng, prices=prices, since=since, until=until).ledger.request_costs()
    finally:
        eng.dispose()
    # each node from its first attempt or node event, as the ledger can know them
    born = {n: min([o.start_us for o in occs if o.node == n]
                   + [round(e["at"] * S) for e in events if e["node"] == n and e["at"] < until]) for n in prices}
    want, want_idle = brute_force(occs, prices, since_us, until_us, born)
    assert set(got) == set(want) and len(want) == 21
    for rid, cost in want.items():
        assert got[rid] == pytest.approx(cost, rel=1e-9), rid
    summary = report["summary"]
    assert summary["attributed_cost"] == pytest.approx(sum(want.values()), rel=1e-6)
    assert summary["idle_cost"] == pytest.approx(sum(want_idle.values()), rel=1e-6)
    by_tenant: dict[str, float] = defaultdict(float)
    for r in records:
        by_tenant[r["tenant"]] += want[r["request_id"]]
    report_by_tenant: dict[str, float] = defaultdict(float)
    for row in report["data"]:
        if row["kind"] == "usage":
            report_by_tenant[row["tenant"]] += row["cost"]
    assert report_by_tenant == pytest.approx(dict(by_tenant), rel=1e-5)


def test_a_young_deployment_is_not_charged_for_days_it_did_not_have(engine: Engine) -> None:
    """A week's report over two hours of history: each node from its first attempt or node event,
    a configured node never seen from the deployment's first record (and listed)."""
    recs = seed.seed(engine, n=240)
    added = seed.START + 3600.0   # an operator adds gpu-d an hour in: its loading event is its birth
    with engine.begin() as conn:
        insert_events(conn, [NodeEvent("gpu-d", None, "loading", "added", added, {})])
    prices = {**node_prices(seed.fleet().nodes), "gpu-d": 3600.0, "gpu-e": 3600.0}
    week = seed.END - 7 * 86_400
    rep = cost_report(engine, prices=prices, since=week, until=seed.END, group_by="node")
    s = rep["summary"]
    deployed = min(r.received_at for r in recs)
    first = {n: min(a.started_at for r in recs for a in r.attempts if a.node == n) for n in seed.NODES}
    assert s["first_seen"] == pytest.approx({**first, "gpu-d": added}) and s["unseen_nodes"] == ["gpu-e"]
    born = {**first, "gpu-d": added, "gpu-e": deployed}
    assert s["provisioned_seconds"] == pytest.approx(sum(seed.END - t for t in born.values()))
    idle = {r["node"]: r["gpu_seconds"] for r in rep["data"] if r["kind"] == "idle"}
    assert idle["gpu-d"] == pytest.approx(3600.0) and idle["gpu-e"] == pytest.approx(seed.END - deployed)
    assert s["attributed_cost"] + s["idle_cost"] == pytest.approx(s["provisioned_cost"])
    # the old rule would have charged the whole week: 7 days of 5 nodes
    assert s["provisioned_seconds"] < 5 * 2 * 3600 + 1
