"""docs/reliability.md §9.2 C-01, C-03, C-05, C-06, C-10, C-11 through the health machinery: a real
gateway on loopback over simulated nodes, Envoy's timings scaled by 1/100 (chaos_support.SCALED).
tests/integration/test_failures.py covers the request path of C-01/C-03/C-05/C-06; these add what
isolation promises: when a node is taken out, that it stays out, how it comes back, the events.

The gateway's clock is a ManualClock (chaos_support): every "how long" here (an ejection, a
Retry-After, a slow-start window) is an advance of that clock, so the assertions hold on a loaded
machine; the timing of the timers themselves is unit-tested with injected clocks
(tests/fleet/test_fleet.py, tests/engine/test_upstream.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec
from tests.health.chaos_support import (
    CHAT,
    audit,
    chaos_stack,
    clock_of,
    closed_loop,
    fleet_of,
    node_events,
    query,
    rounds,
    until,
)


async def _ok(client: httpx.AsyncClient, n: int) -> None:
    """``n`` sequential requests, every one answered 200."""
    for _ in range(n):
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200, r.text


async def _until_state(client: httpx.AsyncClient, app: Any, node: str, state: str, max_requests: int = 40,
                       must_succeed: bool = True) -> int:
    """Send requests (each must succeed, with ``must_succeed``) until ``node`` is in ``state``;
    returns how many were sent."""
    fleet = fleet_of(app)
    sent = 0
    while fleet.nodes[node].state != state:
        assert sent < max_requests, f"{node} still {fleet.nodes[node].state} after {sent} requests"
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200 or not must_succeed, r.text
        sent += 1
    return sent


async def test_c01_node_killed_before_first_byte(tmp_path: Path) -> None:
    async with chaos_stack(tmp_path, per_node={"n0": {"base_ttft_s": 0.5}}) as (sim, client, app):
        waiting = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT)) for _ in range(6)]
        await sim.nodes["n0"].wait_until(lambda s: s.live >= 2, timeout=10)
        await sim.stop_node("n0")                     # killed: open connections cut, the port refuses
        first = await asyncio.gather(*waiting)
        assert [r.status_code for r in first] == [200] * 6
        assert all(r.json()["choices"][0]["message"]["content"] for r in first)   # full content
        recs = [await audit(client, app, r.headers["x-request-id"]) for r in first]
        hit = [rec for rec in recs if rec["attempts"][0]["node"] == "n0"]
        assert len(hit) == 2
        for rec in hit:                               # retried elsewhere, attempts = 2, final node recorded
            assert [a["outcome"] for a in rec["attempts"]] == ["retryable", "ok"]
            assert rec["node"] == rec["attempts"][1]["node"] != "n0" and rec["status"] == "ok"
        assert max(len(rec["attempts"]) for rec in recs) <= 2
        more = [await client.post("/v1/chat/completions", json=CHAT) for _ in range(12)]
        assert [r.status_code for r in more] == [200] * 12
        assert fleet_of(app).nodes["n0"].state in ("ejected", "down")
        rows = await query(app, "SELECT count(*) AS n FROM request_attempts WHERE node = 'n0'")
        assert rows[0]["n"] <= 5                       # out after at most 5 failed attempts
        out = next(e for e in await node_events(app, "n0") if e["from"] == "healthy")
        assert out["to"] in ("ejected", "down")
        if out["to"] == "ejected":
            assert out["evidence"]["consecutive_failures"] == 5
        else:
            assert out["evidence"]["consecutive_probe_failures"] == 2


async def test_c03_hang_before_headers_ejects_the_node(tmp_path: Path) -> None:
    ttft = 0.3
    # per_output_token_s 0: the non-streamed wait for the first byte is exactly first_token_s
    async with chaos_stack(tmp_path, timeouts={"first_token_s": ttft, "per_output_token_s": 0}) as (sim, client, app):
        await sim.nodes["n0"].set_faults(FaultSpec(hang_before_headers=True))
        fleet = fleet_of(app)
        await _until_state(client, app, "n0", "ejected", max_requests=30)   # each hung attempt retried elsewhere
        ev = fleet.nodes["n0"].evidence
        assert fleet.nodes["n0"].state == "ejected" and ev["consecutive_failures"] == 5
        rows = await query(app, "SELECT error_class FROM request_attempts WHERE node = 'n0'")
        assert len(rows) == 5 and {r["error_class"] for r in rows} == {"timeout_first_token"}
        before = sim.nodes["n0"].stats.requests_total
        await _ok(client, 6)                           # while ejected: no request waits on the hung node
        await rounds(app, 2)
        assert sim.nodes["n0"].stats.requests_total == before and fleet.nodes["n0"].state == "ejected"
        await sim.nodes["n0"].wait_until(lambda s: s.live == 0, timeout=10)   # hung connections closed


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_c05_5xx_node_is_ejected_after_five_and_stays_out(tmp_path: Path, status: int) -> None:
    async with chaos_stack(tmp_path) as (sim, client, app):
        await sim.nodes["n0"].set_faults(FaultSpec(status=status))
        fleet = fleet_of(app)
        # a 500 is not retried (the node may have done the work); 502 and 503 are
        await _until_state(client, app, "n0", "ejected", max_requests=30, must_succeed=status != 500)
        assert sim.nodes["n0"].stats.requests_total == 5          # exactly five failures, then out
        await _ok(client, 20)                                     # stays out until its ejection time is over
        await rounds(app, 2)
        assert fleet.nodes["n0"].state == "ejected" and sim.nodes["n0"].stats.requests_total == 5
        await _advance(app, fleet.nodes["n0"].ejected_until - clock_of(app).monotonic())
        await until(lambda: fleet.nodes["n0"].state == "half_open", 10.0, "n0 half-open")
        await _until_state(client, app, "n0", "ejected", max_requests=6,   # the trial fails: out again
                           must_succeed=status != 500)
        assert sim.nodes["n0"].stats.requests_total == 6


async def _advance(app: Any, seconds: float) -> None:
    """Move the gateway's clock, then let two monitor rounds run: the health samples taken before
    the jump are stale after it (a node with only stale samples counts as full), the ones after
    are fresh, so the next request sees the fleet as it is."""
    clock_of(app).advance(seconds)
    await rounds(app, 2)


async def _eject_and_wait_out(client: httpx.AsyncClient, app: Any, node: str = "n0") -> float:
    """Send until ``node`` is ejected, advance the clock over the ejection; returns its length."""
    fleet, clock = fleet_of(app), clock_of(app)
    await _until_state(client, app, node, "ejected")
    length = fleet.nodes[node].ejected_until - clock.monotonic()
    await _advance(app, length)
    await until(lambda: fleet.nodes[node].state == "half_open", 10.0, f"{node} half-open")
    return round(length, 6)


async def test_c05_ejection_time_grows_and_is_capped(tmp_path: Path) -> None:
    health = {"outlier": {"base_ejection_s": 0.3, "max_ejection_s": 0.9}}
    async with chaos_stack(tmp_path, health=health) as (sim, client, app):
        await sim.nodes["n0"].set_faults(FaultSpec(status=503))
        lengths = [await _eject_and_wait_out(client, app) for _ in range(5)]   # 503 retried: clients see 200
        assert lengths == [0.3, 0.6, 0.9, 0.9, 0.9]
        evs = [e for e in await node_events(app, "n0") if e["to"] == "ejected"]
        assert [e["evidence"]["ejection_s"] for e in evs] == [0.3, 0.6, 0.9, 0.9, 0.9]
        assert [e["evidence"].get("rule") for e in evs][:2] == ["consecutive_failures", "half_open"]
        trans = [(e["from"], e["to"]) for e in await node_events(app, "n0")][:4]
        assert trans == [("healthy", "ejected"), ("ejected", "half_open"), ("half_open", "ejected"),
                         ("ejected", "half_open")]


async def test_c06_429_skips_the_node_for_retry_after_and_records_it(tmp_path: Path) -> None:
    async with chaos_stack(tmp_path) as (sim, client, app):
        await sim.nodes["n0"].set_faults(FaultSpec(status=429, retry_after_s=1))
        fleet = fleet_of(app)
        rids = []
        while fleet.nodes["n0"].state != "cooldown" and len(rids) < 6:
            r = await client.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200
            rids.append(r.headers["x-request-id"])
        rec = await audit(client, app, rids[-1])
        assert (rec["attempts"][0]["node"], rec["attempts"][0]["http_status"]) == ("n0", 429)
        assert rec["attempts"][1]["node"] != "n0"                  # no retry against the same node
        await sim.nodes["n0"].set_faults(FaultSpec())
        hits = sim.nodes["n0"].stats.requests_total
        await _advance(app, 0.99)                                  # just short of Retry-After: 1
        await _ok(client, 9)
        assert sim.nodes["n0"].stats.requests_total == hits and fleet.nodes["n0"].state == "cooldown"
        await _advance(app, 0.02)                                  # Retry-After elapsed: back in rotation
        await until(lambda: fleet.nodes["n0"].state == "healthy", 10.0, "n0 back after Retry-After")
        await _ok(client, 6)
        assert sim.nodes["n0"].stats.requests_total > hits
        evs = await node_events(app, "n0")
        assert [(e["from"], e["to"]) for e in evs] == [("healthy", "cooldown"), ("cooldown", "healthy")]
        assert evs[0]["evidence"]["retry_after_s"] == 1
        assert evs[1]["at"] == pytest.approx(evs[0]["evidence"]["until"], abs=0.002)   # stamped at the expiry


async def test_c10_loading_node_gets_nothing_then_ramps_up(tmp_path: Path) -> None:
    async def loading(sim: SimFleet) -> None:
        await sim.nodes["n0"].set_faults(FaultSpec(loading=True))

    # Slow start scales a node's weight by its share of the window (at least 10 %); the weighted
    # profile with a fixed seed draws nodes by weight, so n0's share of sequential requests
    # follows its ramp: about 0.1/2.1, 0.25/2.25, 0.5/2.5, 0.75/2.75, then 1/3.
    health = {"slow_start": {"window_s": 1.0}}
    async with chaos_stack(tmp_path, profile="weighted", health=health, before_start=loading) as (sim, client, app):
        fleet, clock = fleet_of(app), clock_of(app)
        assert fleet.nodes["n0"].state == "loading"                # the first round ran before ready
        res = await closed_loop(client, workers=6, requests=60)
        assert {s for s, _ in res} == {200}
        assert sim.nodes["n0"].stats.requests_total == 0           # no traffic while it loads
        await sim.nodes["n0"].set_faults(FaultSpec())
        await until(lambda: fleet.nodes["n0"].state == "healthy", 10.0, "n0 back")
        started = fleet.nodes["n0"].slow_start_at
        assert started is not None
        share = []
        for at in (0.0, 0.25, 0.5, 0.75, 1.0):
            await _advance(app, started + at - clock.monotonic())
            before = sim.nodes["n0"].stats.requests_total
            n = 120
            await _ok(client, n)
            share.append((sim.nodes["n0"].stats.requests_total - before) / n)
        print("C-10 n0 share per step of the window", [round(x, 3) for x in share])
        assert share[0] < 0.12 and 0.22 <= share[-1] <= 0.45       # ramps instead of jumping to 1/3
        assert share[0] < share[2] < share[-1] + 0.05


@pytest.mark.parametrize("status", [503, 500])   # both retried elsewhere by default (retry.retry_on_status)
async def test_c11_flapping_node_ejection_grows_and_clients_do_not_fail(tmp_path: Path, status: int) -> None:
    # Envoy's 10 s interval and 30 s base ejection scaled by 1/50; a node that comes back from each
    # ejection and fails again before a whole healthy interval has passed (the clock does not move
    # while it is healthy), so nothing sheds a step of the multiplier.
    health = {"outlier": {"interval_s": 0.2, "base_ejection_s": 0.6, "max_ejection_s": 6.0}}
    async with chaos_stack(tmp_path, health=health) as (sim, client, app):
        fleet = fleet_of(app)
        # A node starts flapping in a fleet that was already serving: traffic first (the admission
        # retry budget, 10 % of the last 10 s of requests, starts from that history).
        warm = await closed_loop(client, workers=6, requests=120)
        assert {s for s, _ in warm} == {200}
        statuses: list[int] = []
        for _ in range(4):
            await sim.nodes["n0"].set_faults(FaultSpec(status=status))
            statuses += [s for s, _ in await closed_loop(client, workers=3, requests=3)]
            while fleet.nodes["n0"].state != "ejected" and len(statuses) < 400:
                statuses.append((await client.post("/v1/chat/completions", json=CHAT)).status_code)
            assert fleet.nodes["n0"].state == "ejected"
            await sim.nodes["n0"].set_faults(FaultSpec())
            await _advance(app, fleet.nodes["n0"].ejected_until - clock_of(app).monotonic())
            await until(lambda: fleet.nodes["n0"].state == "half_open", 10.0, "n0 half-open")
            while fleet.nodes["n0"].state != "healthy" and len(statuses) < 400:   # the trial succeeds
                statuses.append((await client.post("/v1/chat/completions", json=CHAT)).status_code)
            statuses += [s for s, _ in await closed_loop(client, workers=3, requests=30)]
        failed = sum(1 for s in statuses if s != 200)
        evs = [e for e in await node_events(app, "n0") if e["to"] == "ejected"]
        got = [(e["evidence"]["ejections_in_a_row"], e["evidence"]["ejection_s"]) for e in evs]
        print(f"C-11 ({status}) (in a row, ejection s)", got, "requests", len(statuses), "client failures", failed,
              dict(app.state.admission.counters))
        assert failed / len(statuses) <= 0.01                       # B1's share of failed client requests
        assert got == [(1, 0.6), (2, 1.2), (3, 1.8), (4, 2.4)]      # base × ejections in a row


async def test_gpu_faults_take_a_node_out_before_a_request_fails(tmp_path: Path) -> None:
    """Hardware: a new Xid ejects, thermal throttling drains, both before any user request fails."""
    async with chaos_stack(tmp_path, gpu_agents=True) as (sim, client, app):
        fleet = fleet_of(app)
        warm = await closed_loop(client, workers=3, requests=30)
        assert {s for s, _ in warm} == {200} and sim.nodes["n0"].stats.requests_total > 0
        await sim.nodes["n0"].set_faults(FaultSpec(gpu_xid_errors=1))
        await sim.nodes["n1"].set_faults(FaultSpec(gpu_throttle=True))
        await until(lambda: fleet.nodes["n0"].state == "ejected" and fleet.nodes["n1"].state == "draining",
                    10.0, "n0 ejected, n1 drained")
        hits = (sim.nodes["n0"].stats.requests_total, sim.nodes["n1"].stats.requests_total)
        res = await closed_loop(client, workers=3, requests=30)
        assert {s for s, _ in res} == {200}
        assert (sim.nodes["n0"].stats.requests_total, sim.nodes["n1"].stats.requests_total) == hits
        rows = await query(app, "SELECT count(*) AS n FROM request_attempts WHERE outcome != 'ok'")
        assert rows[0]["n"] == 0                                  # no user request failed on either node
        await sim.nodes["n1"].set_faults(FaultSpec())
        await until(lambda: fleet.nodes["n1"].state == "healthy", 10.0, "n1 back after throttling")
        evs = {e["node"]: e for e in await node_events(app) if e["from"] == "healthy"}
        assert evs["n0"]["to"] == "ejected" and "Xid 79 (GPU has fallen off the bus)" in evs["n0"]["reason"]
        assert evs["n1"]["to"] == "draining" and "hw_thermal_slowdown" in evs["n1"]["reason"]
