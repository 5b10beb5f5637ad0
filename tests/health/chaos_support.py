"""Harness of the health chaos tests: a real gateway (uvicorn on loopback) over simulated nodes with
Envoy's timings scaled by 1/100 (base ejection 30 s → 0.3 s, interval 10 s → 0.1 s, max 300 s →
3 s, slow start 60 s → 0.6 s), so each docs/reliability.md §9.2 scenario runs in seconds while the
rules under test stay the same.

The gateway runs on a :class:`~inferlb.types.ManualClock`: an ejection, a cooldown or a
slow-start window ends only when a test advances that clock (``clock_of(app).advance``), so what
the tests assert does not depend on how fast a loaded machine runs them. Monitor rounds and
timeouts still run on the event loop; waiting here is for *conditions* (a monitor round, a node
state), every wait bounded, and no assertion reads the wall clock."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.simulator.emulator import SimFleet
from inferlb.store.events import recent_events
from inferlb.types import ManualClock
from tests.support import fast_specs, running_gateway, settings_for

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}

# The probe timeout and the first round's are not scaled: no test here needs a probe to time out (a
# stopped node refuses at once), and a probe that timed out on a loaded machine would take a healthy
# node down, which can tip the fleet into panic routing.
SCALED: dict[str, Any] = {
    "interval_s": 0.1,
    "first_round_timeout_s": 10.0,
    "probe": {"timeout_s": 5.0, "unhealthy_threshold": 2, "healthy_threshold": 1},
    "outlier": {"base_ejection_s": 0.3, "max_ejection_s": 3.0, "interval_s": 0.1},
    "slow_start": {"window_s": 0.6},
}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@contextlib.asynccontextmanager
async def chaos_stack(tmp: Path, *, n: int = 3, profile: str = "round-robin", health: dict[str, Any] | None = None,
                      timeouts: dict[str, float] | None = None, capacity_tokens: int = 32768, max_concurrency: int = 64,
                      before_start: Callable[[SimFleet], Any] | None = None,
                      per_node: dict[str, dict[str, Any]] | None = None, gpu_agents: bool = False, **specs: Any
                      ) -> AsyncIterator[tuple[SimFleet, httpx.AsyncClient, Any]]:
    nodes = [dataclasses.replace(s, **(per_node or {}).get(s.name, {})) for s in fast_specs(n, **specs)]
    async with SimFleet(nodes) as sim:
        if before_start is not None:
            await before_start(sim)
        cfg = merge(SCALED, health or {})
        # The simulator's /sim/gpu answers in the node agent's report shape.
        cfg["nodes"] = {name: {"metrics": "none", **({"agent_url": node.url + "/sim/gpu"} if gpu_agents else {})}
                        for name, node in sim.nodes.items()}
        fleet = fleet_from_mapping({
            "models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8}, {"name": "emb"}],
            "nodes": [{"name": name, "url": node.url, "models": ["m"], "kind": "sim",
                       "capacity_tokens": capacity_tokens, "max_concurrency": max_concurrency}
                      for name, node in sim.nodes.items()],
            "routing": {"profile": profile, "seed": 1},
            "timeouts": {"connect_s": 0.5, "first_token_s": 2.0, "idle_s": 2.0, "total_s": 10.0, **(timeouts or {})},
            "health": cfg,
        })
        async with running_gateway(settings_for(tmp, fleet), clock=ManualClock()) as (base, app), \
                httpx.AsyncClient(base_url=base, timeout=10, trust_env=False) as client:
            yield sim, client, app


def fleet_of(app: Any) -> Fleet:
    f: Fleet = app.state.gateway.rt.fleet
    return f


def clock_of(app: Any) -> ManualClock:
    """The gateway's injected clock."""
    clock = fleet_of(app).clock
    assert isinstance(clock, ManualClock)
    return clock


async def rounds(app: Any, n: int = 2, timeout: float = 10.0) -> None:
    """Wait (bounded) until the health monitor has run ``n`` more rounds."""
    mon = app.state.monitor
    seen = mon.rounds
    await until(lambda: mon.rounds >= seen + n, timeout, f"{n} monitor rounds")


async def until(pred: Callable[[], bool], timeout: float, what: str) -> float:
    """Wait for ``pred`` (checked every 10 ms); returns the seconds it took; AssertionError on timeout."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)
    return time.monotonic() - t0


async def node_events(app: Any, node: str | None = None) -> list[dict[str, Any]]:
    """The node_events rows (oldest first) once the monitor recorded what happened so far."""
    await rounds(app, 2)
    await app.state.events.flush_once(force=True)
    rows = await asyncio.to_thread(recent_events, app.state.store.engine, node=node, limit=10_000)
    return list(reversed(rows))


async def query(app: Any, sql: str, **params: Any) -> list[dict[str, Any]]:
    """Rows of the audit database (after a forced flush of the audit writer)."""
    await app.state.store.writer.flush_once(force=True)

    def run() -> list[dict[str, Any]]:
        with app.state.store.engine.connect() as conn:
            return [dict(r) for r in conn.execute(text(sql), params).mappings().all()]

    return await asyncio.to_thread(run)


async def audit(client: httpx.AsyncClient, app: Any, rid: str) -> dict[str, Any]:
    await app.state.store.writer.flush_once(force=True)
    r = await client.get(f"/audit/requests/{rid}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def closed_loop(client: httpx.AsyncClient, *, workers: int, requests: int,
                      body: dict[str, Any] | None = None) -> list[tuple[int, str]]:
    """``workers`` clients sending back to back until ``requests`` were sent:
    ``(status, request id)`` per request. A count, not a duration, so a slow machine sends as much."""
    out: list[tuple[int, str]] = []
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while sent < requests:
            sent += 1
            r = await client.post("/v1/chat/completions", json=body or CHAT)
            out.append((r.status_code, r.headers.get("x-request-id", "")))

    await asyncio.gather(*(worker() for _ in range(workers)))
    return out
