"""Node failures are expected events: retries before the first byte, never after, cooldowns,
ejection, deadlines, client disconnects (docs/reliability.md C-01..C-23 subset). Real HTTP everywhere:
simulated nodes and the gateway on loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec
from tests.support import audit_of, fast_specs, fleet_for, running_gateway, settings_for

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}


@contextlib.asynccontextmanager
async def stack(tmp: Path, *, profile: str = "round-robin", n: int = 3, **specs: Any
                ) -> AsyncIterator[tuple[SimFleet, httpx.AsyncClient, Any]]:
    async with SimFleet(fast_specs(n, **specs)) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        fleet = fleet_for(urls, profile=profile, seed=1)
        async with running_gateway(settings_for(tmp, fleet)) as (base, app), \
                httpx.AsyncClient(base_url=base, timeout=10) as client:
            yield sim, client, app



def sse_events(text: str) -> list[str]:
    return [e[len("data: "):] for e in text.split("\n\n") if e.startswith("data: ")]


async def test_refused_node_is_retried_elsewhere(tmp_path: Path) -> None:  # C-01
    async with stack(tmp_path) as (sim, client, app):
        await sim.stop_node("n0")
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200
        rec = await audit_of(client, app, r.headers["x-request-id"])
        nodes = [a["node"] for a in rec["attempts"]]
        assert nodes[0] == "n0" and len(nodes) == 2 and nodes[1] != "n0"
        assert [a["outcome"] for a in rec["attempts"]] == ["retryable", "ok"]
        assert rec["node"] == nodes[1] and rec["status"] == "ok"
        # one routing decision per attempt, through the database
        assert [(d["attempt"], d["pick"]) for d in rec["decisions"]] == [(1, nodes[0]), (2, nodes[1])]
        assert rec["deadline_at"] == pytest.approx(rec["received_at"] + 10.0)


async def test_all_nodes_down_is_503_no_healthy_upstream_with_retry_after(tmp_path: Path) -> None:
    async with stack(tmp_path) as (sim, client, app):
        for name in list(sim.nodes):
            await sim.stop_node(name)
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "no_healthy_upstream"
        rec = await audit_of(client, app, r.headers["x-request-id"])
        assert rec["status"] == "no_healthy_upstream" and rec["http_status"] == 503
        assert {a["error_class"] for a in rec["attempts"]} == {"connect_error"}


async def test_all_nodes_503_makes_exactly_three_attempts(tmp_path: Path) -> None:  # C-09, B3 per request
    async with stack(tmp_path, faults=FaultSpec(status=503)) as (sim, client, app):
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "upstream_error"
        hits = sum(node.stats.requests_total for node in sim.nodes.values())
        assert hits == 3
        assert all(node.stats.requests_total == 1 for node in sim.nodes.values())  # never the same node twice


async def test_500_is_retried_elsewhere_and_501_is_not(tmp_path: Path) -> None:
    for sub in ("500", "501"):
        (tmp_path / sub).mkdir()
    async with stack(tmp_path / "500", faults=FaultSpec(status=500)) as (sim, client, app):
        await sim.nodes["n2"].set_faults(FaultSpec())
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200   # the 500s came before the first byte; n2 served
        rec = await audit_of(client, app, r.headers["x-request-id"])
        assert [a["http_status"] for a in rec["attempts"]][:-1] and rec["node"] == "n2"
        assert all(a["http_status"] == 500 and a["outcome"] == "retryable" for a in rec["attempts"][:-1])
    async with stack(tmp_path / "501", faults=FaultSpec(status=501)) as (sim, client, app):
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 502
        assert sum(node.stats.requests_total for node in sim.nodes.values()) == 1


async def test_429_cools_the_node_down_and_all_429_answers_fast(tmp_path: Path) -> None:  # C-06
    async with stack(tmp_path) as (sim, client, app):
        await sim.nodes["n0"].set_faults(FaultSpec(status=429, retry_after_s=7))
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200
        fleet = (await client.get("/admin/fleet")).json()
        n0 = next(n for n in fleet["nodes"] if n["name"] == "n0")
        assert not n0["healthy"] and "429" in n0["reason"]
        before = sim.nodes["n0"].stats.requests_total
        for _ in range(4):
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert sim.nodes["n0"].stats.requests_total == before   # skipped while cooling down

        for name in ("n1", "n2"):
            await sim.nodes[name].set_faults(FaultSpec(status=429, retry_after_s=3))
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "3"
        assert r.json()["error"]["type"] == "rate_limit_error"
        r = await client.post("/v1/chat/completions", json=CHAT)   # all cooling: no node is even tried
        assert r.status_code == 503 and "retry-after" in r.headers


async def test_hang_before_headers_times_out_and_retries(tmp_path: Path) -> None:  # C-03
    async with stack(tmp_path) as (sim, client, app):
        await sim.nodes["n0"].set_faults(FaultSpec(hang_before_headers=True))
        t0 = time.monotonic()
        r = await client.post("/v1/chat/completions", json=CHAT)
        took = time.monotonic() - t0
        assert r.status_code == 200
        assert 2.0 <= took < 4.0   # first_token_s = 2 s in the test fleet, then n1 answers
        rec = await audit_of(client, app, r.headers["x-request-id"])
        assert rec["attempts"][0]["error_class"] == "timeout_first_token"
        await sim.nodes["n0"].wait_until(lambda s: s.live == 0, timeout=2)   # the hung connection is closed


async def test_deadline_bounds_the_whole_request(tmp_path: Path) -> None:  # C-23, B2
    async with stack(tmp_path, faults=FaultSpec(hang_before_headers=True)) as (sim, client, app):
        t0 = time.monotonic()
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"x-inferlb-deadline-ms": "400"})
        took = time.monotonic() - t0
        assert r.status_code == 504
        assert took < 0.4 + 1.0


async def test_midstream_drop_ends_with_error_event_and_no_retry(tmp_path: Path) -> None:  # C-02, B4
    async with stack(tmp_path, faults=FaultSpec(drop_after_tokens=3)) as (sim, client, app):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status_code == 200
        events = sse_events(r.text)
        assert "[DONE]" not in events
        assert '"error"' in events[-1]
        assert sum("tok" in e for e in events) == 3
        assert sum(node.stats.requests_total for node in sim.nodes.values()) == 1
        rec = await audit_of(client, app, r.headers["x-request-id"])
        assert rec["status"] == "upstream_error_midstream"
        assert len(rec["attempts"]) == 1
        # the node was cut before its usage chunk: the tokens the client got are counted
        assert rec["error_class"] == "midstream_connect_error" and rec["completion_tokens"] == 3


async def test_malformed_sse_is_a_cut(tmp_path: Path) -> None:  # C-07
    async with stack(tmp_path, faults=FaultSpec(malformed_sse_at=2)) as (sim, client, app):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        events = sse_events(r.text)
        assert "[DONE]" not in events and '"error"' in events[-1]
        assert (await client.get("/healthz")).status_code == 200


async def test_consecutive_failures_eject_the_node(tmp_path: Path) -> None:  # C-05 (count rule)
    async with stack(tmp_path) as (sim, client, app):
        await sim.nodes["n0"].set_faults(FaultSpec(status=503))
        for _ in range(15):   # round robin sends every third first attempt to n0
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        fleet = (await client.get("/admin/fleet")).json()
        n0 = next(n for n in fleet["nodes"] if n["name"] == "n0")
        assert n0["ejections"] == 1 and not n0["healthy"] and "ejected" in n0["reason"]
        before = sim.nodes["n0"].stats.requests_total
        for _ in range(6):
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert sim.nodes["n0"].stats.requests_total == before


async def test_client_disconnect_mid_stream_frees_the_node(tmp_path: Path) -> None:  # C-12, B5
    async with stack(tmp_path, tpot_s=0.05) as (sim, client, app):
        body = {**CHAT, "max_tokens": 200, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            rid = r.headers["x-request-id"]
            async for _ in r.aiter_bytes():
                break
        node = next(n for n in sim.nodes.values() if n.stats.requests_total)
        await node.wait_until(lambda s: s.live == 0, timeout=2)
        for _ in range(100):
            await app.state.store.writer.flush_once(force=True)
            got = await client.get(f"/audit/requests/{rid}")
            if got.status_code == 200:
                break
            await asyncio.sleep(0.02)
        assert got.json()["status"] == "client_closed"
        assert got.json()["completion_tokens"] is None or got.json()["completion_tokens"] < 200


async def test_client_disconnect_non_stream_cancels_upstream(tmp_path: Path) -> None:  # C-14
    async with stack(tmp_path, tpot_s=0.05) as (sim, client, app):
        body = {**CHAT, "max_tokens": 200}
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/chat/completions", json=body, timeout=0.3)
        node = next(n for n in sim.nodes.values() if n.stats.requests_total)
        await node.wait_until(lambda s: s.live == 0, timeout=2)
        assert node.stats.disconnects >= 1
