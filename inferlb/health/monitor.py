"""The health monitor: runs ``node_health.bpmn`` on SpiffWorkflow every ``health.interval_s``.

Contract:

* :meth:`HealthMonitor.run_once` is one round: it starts a fresh process instance (a long-lived
  looping instance would grow by a few task objects per turn), performs its external tasks —
  ``health/probe`` through the :class:`~inferlb.health.probe.Prober` (every source of every
  node concurrently, aiohttp), waits (``clock/wait``, timers) capped at one interval — and lets the
  engine run the in-engine operations (``tasks/health.py``). It returns the instance's final data.
  Editing the process changes what a round does.
* The rounds run on the one timer-driven BPMN runner (:class:`~inferlb.workflow.timer.ProcessTimer`,
  :attr:`HealthMonitor.timer`): a round starts every ``interval_s``. :meth:`start` runs the first
  round before returning (bounded by ``first_round_timeout_s``; Envoy warms a cluster with its
  first health-check round before it takes traffic), then starts the timer. A failing round is
  logged and counted (``failed_rounds``, ``last_error``); the timer goes on.
* :meth:`close` stops the timer, closes the prober and hands the state changes still queued (those
  of the request path since the last round) to the event sink.
* Nothing here blocks the event loop: samples are parsed in worker threads, events are written
  by the :class:`~inferlb.store.events.EventWriter` off the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from inferlb.config.settings import FleetConfig
from inferlb.errors import ConfigError
from inferlb.fleet.state import Fleet
from inferlb.health.probe import Prober
from inferlb.health.scope import HealthScope
from inferlb.node_types import NodeEvent
from inferlb.types import Clock
from inferlb.workflow.base import ExternalCall
from inferlb.workflow.definition import ProcessDefinition
from inferlb.workflow.timer import Performer, ProcessTimer, waits

__all__ = ["HealthMonitor", "check_health_config"]

log = logging.getLogger("inferlb.health")


def check_health_config(cfg: FleetConfig) -> None:
    """ConfigError when ``health.nodes`` names a node the fleet does not have."""
    known = {n.name for n in cfg.nodes}
    for name in cfg.health.nodes:
        if name not in known:
            raise ConfigError(f"unknown node {name!r}", path=f"health.nodes.{name}")


class HealthMonitor:
    """See the module docstring. ``process`` and ``interval_s`` may be swapped between rounds (a
    reload, live/manager.py): the next round runs the new ones."""

    def __init__(self, *, fleet: Fleet, process: ProcessDefinition, clock: Clock, prober: Prober,
                 record: Callable[[list[NodeEvent]], None]) -> None:
        self.fleet = fleet
        self.process = process
        self.clock = clock
        self.prober = prober
        self.record = record
        self.interval_s = fleet.health.interval_s
        self.last_round: dict[str, Any] = {}
        self.timer: ProcessTimer[dict[str, Any]] = ProcessTimer(
            "inferlb-health-monitor", what="node-health", process=lambda: self.process,
            interval_s=lambda: self.interval_s, run_round=self._round, logger=log)
        self._performers: dict[str, Performer] = {"health/probe": self._probe, **waits(self._wait)}

    @property
    def rounds(self) -> int:
        return self.timer.rounds

    @property
    def failed_rounds(self) -> int:
        return self.timer.failed_rounds

    @property
    def last_error(self) -> str | None:
        return self.timer.last_error

    async def run_once(self) -> dict[str, Any]:
        data = await self.timer.run_once()
        assert data is not None   # no leader predicate: a round is never on standby
        return data

    async def _round(self, n: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        scope = HealthScope(fleet=self.fleet, clock=self.clock, record=self.record, round=n)
        inst = await self.timer.run_instance({"round": n, "nodes": sorted(self.fleet.nodes)}, scope, self._performers)
        data = inst.data
        self.last_round = {"round": n, "at": round(self.clock.time(), 6),
                           "took_ms": round((time.perf_counter() - t0) * 1000.0, 3), "path": list(inst.path),
                           "samples": (data.get("probe") or {}).get("count"),
                           "events": (data.get("recorded") or {}).get("count")}
        return data

    async def _probe(self, call: ExternalCall) -> dict[str, Any]:
        samples = await self.prober.collect()
        return {"samples": [s.to_json() for s in samples], "count": len(samples)}

    async def _wait(self, call: ExternalCall) -> dict[str, Any]:
        seconds = max(0.0, min(float(call.params.get("seconds", 0.0)), self.interval_s))
        await asyncio.sleep(seconds)
        return {"seconds": seconds}

    async def start(self, first_round_timeout_s: float | None = None) -> None:
        timeout = self.fleet.health.first_round_timeout_s if first_round_timeout_s is None else first_round_timeout_s
        if timeout > 0:
            try:
                await asyncio.wait_for(self.timer.run_logged(), timeout)
            except TimeoutError:
                log.warning("the first node-health round took over %.1fs; starting without it", timeout)
        self.timer.start(first_s=self.interval_s if self.rounds else 0.0)

    async def close(self) -> None:
        await self.timer.stop()
        await self.prober.close()
        leftover = self.fleet.take_events()
        if leftover:
            self.record(leftover)

    def status(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "process": self.process.path.name, "engine": self.process.mode,
                "rounds": self.rounds, "failed_rounds": self.failed_rounds, "last_error": self.last_error,
                "last_round": self.last_round}
