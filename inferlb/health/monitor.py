"""The health monitor: runs ``node_health.bpmn`` on SpiffWorkflow every ``health.interval_s``.

Contract:

* :meth:`HealthMonitor.run_once` is one round: it starts a fresh process instance (a long-lived
  looping instance would grow by a few task objects per turn), performs its external tasks —
  ``health/probe`` through the :class:`~inferlb.health.probe.Prober` (every source of every
  node concurrently, aiohttp), waits (``clock/wait``, timers) capped at one interval — and lets the
  engine run the in-engine operations (``tasks/health.py``). It returns the instance's final data.
  Editing the process changes what a round does.
* :meth:`start` runs the first round before returning (bounded by ``first_round_timeout_s``;
  Envoy warms a cluster with its first health-check round before it takes traffic), then loops
  in a task. A failing round is logged and counted (``last_error``); the loop goes on.
* :meth:`close` stops the loop, closes the prober and hands the state changes still queued (those
  of the request path since the last round) to the event sink.
* Nothing here blocks the event loop: samples are parsed in worker threads, events are written
  by the :class:`~inferlb.store.events.EventWriter` off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from inferlb.config.settings import FleetConfig
from inferlb.errors import ConfigError, WorkflowRuntimeError
from inferlb.fleet.state import Fleet
from inferlb.health.probe import Prober
from inferlb.health.scope import HealthScope
from inferlb.node_types import NodeEvent
from inferlb.types import Clock
from inferlb.workflow.definition import ProcessDefinition
from inferlb.workflow.spiff import TIMER_OPERATION

__all__ = ["HealthMonitor", "check_health_config"]

log = logging.getLogger("inferlb.health")


def check_health_config(cfg: FleetConfig) -> None:
    """ConfigError when ``health.nodes`` names a node the fleet does not have."""
    known = {n.name for n in cfg.nodes}
    for name in cfg.health.nodes:
        if name not in known:
            raise ConfigError(f"unknown node {name!r}", path=f"health.nodes.{name}")


class HealthMonitor:
    def __init__(self, *, fleet: Fleet, process: ProcessDefinition, clock: Clock, prober: Prober,
                 record: Callable[[list[NodeEvent]], None]) -> None:
        self.fleet = fleet
        self.process = process
        self.clock = clock
        self.prober = prober
        self.record = record
        self.interval_s = fleet.health.interval_s
        self.rounds = 0
        self.failed_rounds = 0
        self.last_error: str | None = None
        self.last_round: dict[str, Any] = {}
        self._task: asyncio.Task[None] | None = None

    async def run_once(self) -> dict[str, Any]:
        self.rounds += 1
        t0 = time.perf_counter()
        scope = HealthScope(fleet=self.fleet, clock=self.clock, record=self.record, round=self.rounds)
        inst = self.process.executor.start({"round": self.rounds, "nodes": sorted(self.fleet.nodes)}, scope)
        call = inst.advance()
        while call is not None:
            if call.operation == "health/probe":
                samples = await self.prober.collect()
                inst.complete({"samples": [s.to_json() for s in samples], "count": len(samples)})
            elif call.operation in ("clock/wait", TIMER_OPERATION):
                seconds = max(0.0, min(float(call.params.get("seconds", 0.0)), self.interval_s))
                await asyncio.sleep(seconds)
                inst.complete({"seconds": seconds})
            else:
                raise WorkflowRuntimeError(call.task_id, f"no performer for external operation {call.operation!r}")
            call = inst.advance()
        data = inst.data
        self.last_round = {"round": self.rounds, "at": round(self.clock.time(), 6),
                           "took_ms": round((time.perf_counter() - t0) * 1000.0, 3), "path": list(inst.path),
                           "samples": (data.get("probe") or {}).get("count"),
                           "events": (data.get("recorded") or {}).get("count")}
        return data

    async def _round_logged(self) -> None:
        try:
            await self.run_once()
            self.last_error = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the loop must outlive a bad round (a process edit, a bug)
            self.failed_rounds += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:500]
            log.error("node-health round %d failed: %s", self.rounds, self.last_error)

    async def start(self, first_round_timeout_s: float | None = None) -> None:
        timeout = self.fleet.health.first_round_timeout_s if first_round_timeout_s is None else first_round_timeout_s
        if timeout > 0:
            try:
                await asyncio.wait_for(self._round_logged(), timeout)
            except TimeoutError:
                log.warning("the first node-health round took over %.1fs; starting without it", timeout)
        self._task = asyncio.create_task(self._loop(), name="inferlb-health-monitor")

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + (self.interval_s if self.rounds else 0.0)
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = loop.time() + self.interval_s   # rounds start every interval, not after one
            await self._round_logged()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.prober.close()
        leftover = self.fleet.take_events()
        if leftover:
            self.record(leftover)

    def status(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "process": self.process.path.name, "engine": self.process.mode,
                "rounds": self.rounds, "failed_rounds": self.failed_rounds, "last_error": self.last_error,
                "last_round": self.last_round}
