"""Overload on the simulator over real HTTP: the queue, shedding by class, no cascade onto nodes;
retry amplification over a total outage (docs/reliability.md B3, B6, C-08, C-09, L-05/L-06 in small)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferlb.config.admission import AdmissionSettings
from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec, NodeSpec
from inferlb.types import Clock, ManualClock
from tests.support import running_gateway, settings_for

MSG = [{"role": "user", "content": "hello"}]


@contextlib.asynccontextmanager
async def stack(tmp: Path, specs: list[NodeSpec], *, conc: int, admission: dict[str, Any] | None = None,
                clock: Clock | None = None) -> AsyncIterator[tuple[SimFleet, httpx.AsyncClient, Any]]:
    async with SimFleet(specs) as sim:
        fleet = fleet_from_mapping({
            "models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8}],
            "nodes": [{"name": n, "url": node.url, "models": ["m"], "max_concurrency": conc}
                      for n, node in sim.nodes.items()],
            "routing": {"profile": "least-connections", "seed": 1},
            "timeouts": {"connect_s": 1.0, "first_token_s": 5.0, "idle_s": 5.0, "total_s": 20.0},
            "admission": admission or {},
        })
        settings = settings_for(tmp, fleet, admission=AdmissionSettings(auth=False, admin_key=None, redis_url=None))
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with running_gateway(settings, clock=clock) as (base, app), \
                httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
            yield sim, client, app


async def _post(client: httpx.AsyncClient, prio: str, max_tokens: int = 10) -> httpx.Response:
    return await client.post("/v1/chat/completions", headers={"x-inferlb-priority": prio},
                             json={"model": "m", "messages": MSG, "max_tokens": max_tokens})


async def test_burst_queues_critical_and_sheds_batch(tmp_path: Path) -> None:
    specs = [NodeSpec(name=f"n{i}", models=["m"], base_ttft_s=0.05, tpot_s=0.01, max_concurrency=2) for i in range(2)]
    # 4 slots, a queue of 8 (no service time is known yet in a first burst): room for every
    # critical request, not for the batch flood
    async with stack(tmp_path, specs, conc=2, admission={"queue": {"min_size": 8}}) as (sim, client, app):
        classes = ["critical" if i % 6 == 0 else "batch" for i in range(36)]      # 6 critical, 30 batch
        answers = await asyncio.gather(*(_post(client, c) for c in classes))
        by_class: dict[str, list[int]] = {"critical": [], "batch": []}
        for c, r in zip(classes, answers, strict=True):
            by_class[c].append(r.status_code)
        assert by_class["critical"] == [200] * 6                                  # critical keeps its service
        shed = [r for c, r in zip(classes, answers, strict=True) if r.status_code != 200]
        assert shed and all(c == "batch" for c, r in zip(classes, answers, strict=True) if r.status_code != 200)
        for r in shed:                                                            # B6: 503 + Retry-After
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] in ("overloaded", "queue_timeout")
        # Nothing cascades onto the nodes: never above their capacity, never a node-side 429.
        assert all(n.stats.max_live <= 2 and n.stats.rejected == 0 for n in sim.nodes.values())
        await app.state.store.writer.flush_once(force=True)
        rows = (await client.get("/audit/requests", params={"limit": 100})).json()["data"]
        queued = [row for row in rows if row["queue_wait_ms"]]
        assert queued and all(row["status"] in ("ok", "rejected_overload", "rejected_queue_timeout") for row in queued)
        assert {row["status"] for row in rows} <= {"ok", "rejected_overload", "rejected_queue_timeout"}
        snap = app.state.admission.snapshot()["pools"]["m"]
        assert snap["admitted"] == 0 and snap["queued"] == 0 and snap["limit"] == 4


@pytest.mark.parametrize("status", [503, 500])   # both retried by default: the budget bounds them alike
async def test_total_outage_retry_amplification_stays_under_1_1(tmp_path: Path, status: int) -> None:  # C-08, B3
    specs = [NodeSpec(name=f"n{i}", models=["m"], base_ttft_s=0.001, tpot_s=0.0001, max_concurrency=64,
                      faults=FaultSpec(status=status)) for i in range(3)]
    # The budget is a 10 s sliding window; on a clock that stands still the whole run is one window,
    # so the ratio asserted below is the budget's own rule, however long a loaded machine takes.
    async with stack(tmp_path, specs, conc=64, clock=ManualClock()) as (sim, client, app):
        await sim.stop_node("n2")                         # one refuses connections, two answer ``status``
        n = 400
        sem = asyncio.Semaphore(16)

        async def one() -> httpx.Response:
            async with sem:
                return await _post(client, "standard", 4)

        answers = await asyncio.gather(*(one() for _ in range(n)))
        assert all(r.status_code in (502, 503) and "error" in r.json() for r in answers)
        fleet = app.state.gateway.rt.fleet
        attempts = sum(st.requests_total for st in fleet.nodes.values())   # the gateway's own count
        assert attempts >= n
        assert attempts / n <= 1.1, attempts / n
        hits = {rid: k for node in sim.nodes.values() for rid, k in node.stats.attempts.items()}
        assert max(hits.values()) <= 1                                      # never the same node twice
        await app.state.store.writer.flush_once(force=True)
        rows = (await client.get("/audit/requests", params={"limit": 1000})).json()["data"]
        assert len(rows) == n                                               # every request audited
        assert max(len(row["workflow_path"]) for row in rows) > 0
        per_request = [row["attempt_count"] for row in rows]
        assert max(per_request) <= 3 and sum(per_request) == attempts      # C-09: ≤ 3 attempts each
        denied = app.state.admission.snapshot()["counters"].get("retry_denied_budget", 0)
        assert denied > 0                                                   # the budget did the work


async def test_client_leaving_while_queued_frees_its_place(tmp_path: Path) -> None:
    specs = [NodeSpec(name="n0", models=["m"], base_ttft_s=0.01, tpot_s=0.03, max_concurrency=1)]
    async with stack(tmp_path, specs, conc=1, admission={"queue": {"min_size": 4}}) as (sim, client, app):
        first = asyncio.create_task(_post(client, "standard", max_tokens=20))      # holds the only slot ~0.6 s
        await sim.nodes["n0"].wait_until(lambda s: s.live == 1, timeout=5)
        try:
            await client.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 5},
                              timeout=0.2)                                          # queued, then the client leaves
        except httpx.ReadTimeout:
            pass
        else:
            raise AssertionError("the second request should have waited in the queue")
        assert (await first).status_code == 200
        for _ in range(200):                                                         # bounded: ≤ 4 s
            await app.state.store.writer.flush_once(force=True)
            rows = (await client.get("/audit/requests", params={"limit": 10})).json()["data"]
            if len(rows) == 2:
                break
            await asyncio.sleep(0.02)
        statuses = sorted(r["status"] for r in rows)
        assert statuses == ["client_closed", "ok"]
        snap = app.state.admission.snapshot()["pools"]["m"]
        assert snap["queued"] == 0 and snap["admitted"] == 0
        # the departed request never reached the node, even after the slot freed
        assert sim.nodes["n0"].stats.requests_total == 1
