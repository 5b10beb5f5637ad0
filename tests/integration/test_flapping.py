"""A node flapping faster than the outlier detector notices costs clients almost nothing: each of
its failures before the first byte (500, the default ``retry_on_status``) is retried on another
node, and a retry that answers is refunded to the pool's retry budget, so the budget is not spent
for the whole pool. Real HTTP: emulated nodes, the gateway on a loopback port, closed-loop
clients; bounded by a count of requests, not by time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
REQUESTS = 600
WORKERS = 6


@pytest.mark.parametrize("period", [2, 4])   # client requests between n0's flips (below 5 in a row: no ejection)
async def test_a_fast_flapping_node_fails_at_most_one_percent_of_clients(tmp_path: Path, period: int) -> None:
    async with SimFleet(fast_specs(3)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        async with running_gateway(settings_for(tmp_path, fleet_for(urls, profile="round-robin", seed=1))) \
                as (base, app), httpx.AsyncClient(base_url=base, timeout=10) as client:
            statuses: list[int] = []
            sent = 0
            down = False

            async def worker() -> None:
                nonlocal sent, down
                while sent < REQUESTS:
                    sent += 1
                    if sent % period == 0:
                        down = not down
                        await sim.nodes["n0"].set_faults(FaultSpec(status=500) if down else FaultSpec())
                    statuses.append((await client.post("/v1/chat/completions", json=CHAT)).status_code)

            await asyncio.gather(*(worker() for _ in range(WORKERS)))
            failed = sum(1 for s in statuses if s != 200)
            adm = app.state.admission
            refunded = adm.budget.snapshot("m", adm.clock.monotonic())["refunded"]
            print(f"flapping every {period} requests: {failed} of {len(statuses)} client requests failed "
                  f"({100 * failed / len(statuses):.2f} %), retries refunded {refunded:g}, "
                  f"n0 failures {app.state.gateway.rt.fleet.nodes['n0'].failures_total}", dict(adm.counters))
            assert len(statuses) == REQUESTS
            assert app.state.gateway.rt.fleet.nodes["n0"].failures_total > 0   # it did flap under the load
            assert refunded > 0
            assert failed / len(statuses) <= 0.01
