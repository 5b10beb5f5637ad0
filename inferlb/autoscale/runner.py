"""The autoscaler's loop: runs ``processes/autoscale.bpmn`` on SpiffWorkflow every ``interval_s``.

Contract (the health monitor's, health/monitor.py, for a slower loop):

* :meth:`AutoscaleRunner.run_once` is one round. When the injected ``leader`` predicate says
  this replica is not the leader it does nothing and returns None (one replica scales; the
  others stand by). Otherwise it starts a fresh process instance and performs its external
  tasks: ``autoscale/observe`` (the injected observer: history and capacity; then the actuator's
  replicas in place), ``autoscale/forecast`` (the forecaster, in a worker thread: a statistical
  fit is CPU work that must not hold the event loop), ``autoscale/actuate`` (the actuator; an
  exception becomes a failed result for every change, so nothing goes unrecorded). The engine runs
  ``autoscale/plan`` and ``autoscale/record`` (``tasks/autoscale.py``). Time comes from the
  injected clock; editing the process changes what a round does.
* The rows ``record`` hands over are written after the instance ends, in a worker thread; a
  failed write keeps them (bounded, oldest dropped and counted) and the next round writes them
  first. The next round also re-plans from the replicas actually in place, so an actuation that
  failed half-way is retried, not forgotten.
* :meth:`start` starts the rounds on the one timer-driven BPMN runner
  (:class:`~inferlb.workflow.timer.ProcessTimer`, :attr:`AutoscaleRunner.timer`: the first at
  once, then one every interval, gated on ``leader``); a failing round is logged and counted and
  the timer goes on. :meth:`close` stops it, writes what is pending and closes the actuator.
* :attr:`points` keeps forecast / actual / capacity (tokens/s) and the replicas in place per GPU
  type, per model per round (bounded), for the dashboard panel and the Prometheus gauges.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from inferlb.autoscale.actuator import Actuator, PoolResult
from inferlb.autoscale.observe import Observation
from inferlb.autoscale.policy import Autoscaler
from inferlb.autoscale.record import fallback_kind
from inferlb.autoscale.scope import AutoscaleScope
from inferlb.types import Clock
from inferlb.workflow.definition import ProcessDefinition
from inferlb.workflow.timer import Performer, ProcessTimer

__all__ = ["AutoscaleRunner"]

log = logging.getLogger("inferlb.autoscale")

_MAX_PENDING = 10_000
_MAX_POINTS = 2_000


def _always() -> bool:
    return True


class AutoscaleRunner:
    def __init__(self, *, process: ProcessDefinition, scaler: Autoscaler, actuator: Actuator,
                 observe: Callable[[float], Awaitable[Observation]], clock: Clock,
                 write: Callable[[list[dict[str, Any]]], object] | None = None,
                 leader: Callable[[], bool] = _always) -> None:
        self.process = process
        self.scaler = scaler
        self.actuator = actuator
        self.observe = observe
        self.clock = clock
        self.write = write
        self.leader = leader
        self.interval_s = scaler.cfg.interval_s
        self.actuation_failures = 0
        self.last_round: dict[str, Any] = {}
        self.pending: list[dict[str, Any]] = []
        self.dropped = 0
        self.points: collections.deque[dict[str, Any]] = collections.deque(maxlen=_MAX_POINTS)
        self.replicas: dict[tuple[str, str], dict[str, int]] = {}
        self.fallbacks: dict[str, str] = {}     # model -> the kind of its current forecaster fallback
        self.timer: ProcessTimer[dict[str, Any] | None] = ProcessTimer(
            "inferlb-autoscaler", what="autoscale", process=lambda: self.process, interval_s=lambda: self.interval_s,
            run_round=self._round, logger=log, first_s=0.0, leader=lambda: self.leader(), standby=self._standby)

    @property
    def rounds(self) -> int:
        return self.timer.rounds

    @property
    def standby_rounds(self) -> int:
        return self.timer.standby_rounds

    @property
    def failed_rounds(self) -> int:
        return self.timer.failed_rounds

    @property
    def last_error(self) -> str | None:
        return self.timer.last_error

    def _hand_off(self, rows: list[dict[str, Any]]) -> None:
        self.pending.extend(rows)
        over = len(self.pending) - _MAX_PENDING
        if over > 0:
            del self.pending[:over]
            self.dropped += over

    async def _flush(self) -> None:
        if not self.pending or self.write is None:
            return
        batch = list(self.pending)
        try:
            await asyncio.to_thread(self.write, batch)
        except Exception as exc:   # the database is away: keep them for the next round
            log.warning("scaling events not written (%d kept for the next round): %s", len(batch), exc)
            return
        del self.pending[:len(batch)]

    async def run_once(self) -> dict[str, Any] | None:
        return await self.timer.run_once()

    async def _standby(self) -> None:
        self.last_round = {"standby": True, "at": round(self.clock.time(), 6)}

    async def _round(self, n: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        scope = AutoscaleScope(scaler=self.scaler, clock=self.clock, actuator_name=self.actuator.name,
                               record=self._hand_off, round=n, previous_fallbacks=dict(self.fallbacks))
        performers: dict[str, Performer] = {"autoscale/observe": lambda call: self._observe(scope),
                                            "autoscale/forecast": lambda call: self._forecast(scope),
                                            "autoscale/actuate": lambda call: self._actuate(scope)}
        inst = await self.timer.run_instance({"round": n, "at": round(self.clock.time(), 6)}, scope, performers)
        await self._flush()
        self._remember(scope)
        self.fallbacks = {m: fallback_kind(f.fallback) for m, f in scope.forecasts.items() if f.fallback}
        data = inst.data
        self.last_round = {"round": n, "at": round(self.clock.time(), 6),
                           "took_ms": round((time.perf_counter() - t0) * 1000.0, 3), "path": list(inst.path),
                           "changes": (data.get("plan") or {}).get("changes"),
                           "recorded": (data.get("recorded") or {}).get("count")}
        return data

    async def _observe(self, scope: AutoscaleScope) -> dict[str, Any]:
        history, capacity = await self.observe(self.clock.time())
        scope.history, scope.capacity = history, capacity
        self.scaler.observe(history)
        scope.current = await self.actuator.current()
        return {"models": sorted(history.tokens), "step_s": history.step_s, "end": history.end,
                "points": max((len(v) for v in history.tokens.values()), default=0),
                "replicas": sum(scope.current.values()), "capacity": [c.to_json() for c in capacity.values()]}

    async def _forecast(self, scope: AutoscaleScope) -> dict[str, Any]:
        scope.forecasts = await asyncio.to_thread(self.scaler.forecast)
        return {"models": {m: {"method": f.method, "fallback": f.fallback,
                               "next": f.values[0] if f.values else None, "peak": f.peak()}
                           for m, f in scope.forecasts.items()},
                "fallbacks": sum(f.fallback is not None for f in scope.forecasts.values())}

    async def _actuate(self, scope: AutoscaleScope) -> dict[str, Any]:
        plan = scope.plan
        if plan is None:
            return {"ok": True, "failed": 0, "results": []}
        try:
            scope.results = await self.actuator.apply(plan)
        except Exception as exc:   # never half-applied without a record: record() fails what is unanswered
            scope.actuation_error = f"{type(exc).__name__}: {exc}"[:500]
            log.error("actuator %s failed: %s", self.actuator.name, scope.actuation_error)
        failed = [r for r in scope.results if not r.ok]
        unanswered = len(plan.changes) - len(scope.results)
        self.actuation_failures += len(failed) + max(0, unanswered if scope.actuation_error else 0)
        return {"ok": not failed and scope.actuation_error is None, "failed": len(failed),
                "error": scope.actuation_error, "results": [r.to_json() for r in scope.results]}

    def _remember(self, scope: AutoscaleScope) -> None:
        plan, hist = scope.plan, scope.history
        if plan is None or hist is None:
            return
        after: dict[tuple[str, str], int] = dict(scope.current)
        for r in scope.results:
            if isinstance(r, PoolResult) and r.after is not None:
                after[(r.model, r.gpu)] = r.after
        at = round(self.clock.time(), 6)
        for model in self.scaler.models:
            f = scope.forecasts.get(model)
            cap = 0.0
            for d in plan.pools:
                if d.model == model and d.capacity_tokens_s:
                    cap += d.capacity_tokens_s * after.get(d.key, d.current)
            self.points.append({"at": at, "model": model, "actual": round(hist.last(model), 3),
                                "forecast": round(f.values[0], 3) if f and f.values else None,
                                "method": f.method if f else None, "capacity": round(cap, 3),
                                "replicas": {d.gpu: after.get(d.key, d.current) for d in plan.pools
                                             if d.model == model}})
        self.replicas = {d.key: {"current": after.get(d.key, d.current), "desired": d.desired} for d in plan.pools}

    async def start(self) -> None:
        self.timer.start()

    async def close(self) -> None:
        await self.timer.stop()
        await self._flush()
        await self.actuator.close()

    def status(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "process": self.process.path.name, "engine": self.process.mode,
                "actuator": self.actuator.name, "forecaster": self.scaler.forecaster.name,
                "leader": self.leader(), "rounds": self.rounds, "standby_rounds": self.standby_rounds,
                "failed_rounds": self.failed_rounds, "actuation_failures": self.actuation_failures,
                "last_error": self.last_error, "last_round": self.last_round,
                "pending_events": len(self.pending), "dropped_events": self.dropped,
                "replicas": [{"model": k[0], "gpu": k[1], **v} for k, v in sorted(self.replicas.items())]}
