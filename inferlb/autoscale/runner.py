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
* :meth:`start` loops in a task (rounds start every interval); a failing round is logged and
  counted and the loop goes on. :meth:`close` stops it and closes the actuator.
* :attr:`points` keeps forecast / actual / capacity (tokens/s) and the replicas in place per GPU
  type, per model per round (bounded), for the dashboard panel and the Prometheus gauges.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from inferlb.autoscale.actuator import Actuator, PoolResult
from inferlb.autoscale.observe import Observation
from inferlb.autoscale.policy import Autoscaler
from inferlb.autoscale.record import fallback_kind
from inferlb.autoscale.scope import AutoscaleScope
from inferlb.errors import WorkflowRuntimeError
from inferlb.types import Clock
from inferlb.workflow.definition import ProcessDefinition

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
        self.rounds = 0
        self.failed_rounds = 0
        self.standby_rounds = 0
        self.actuation_failures = 0
        self.last_error: str | None = None
        self.last_round: dict[str, Any] = {}
        self.pending: list[dict[str, Any]] = []
        self.dropped = 0
        self.points: collections.deque[dict[str, Any]] = collections.deque(maxlen=_MAX_POINTS)
        self.replicas: dict[tuple[str, str], dict[str, int]] = {}
        self.fallbacks: dict[str, str] = {}     # model -> the kind of its current forecaster fallback
        self._task: asyncio.Task[None] | None = None

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
        if not self.leader():
            self.standby_rounds += 1
            self.last_round = {"standby": True, "at": round(self.clock.time(), 6)}
            return None
        self.rounds += 1
        t0 = time.perf_counter()
        scope = AutoscaleScope(scaler=self.scaler, clock=self.clock, actuator_name=self.actuator.name,
                               record=self._hand_off, round=self.rounds, previous_fallbacks=dict(self.fallbacks))
        inst = self.process.executor.start({"round": self.rounds, "at": round(self.clock.time(), 6)}, scope)
        call = inst.advance()
        while call is not None:
            if call.operation == "autoscale/observe":
                history, capacity = await self.observe(self.clock.time())
                scope.history, scope.capacity = history, capacity
                self.scaler.observe(history)
                scope.current = await self.actuator.current()
                inst.complete({"models": sorted(history.tokens), "step_s": history.step_s, "end": history.end,
                               "points": max((len(v) for v in history.tokens.values()), default=0),
                               "replicas": sum(scope.current.values()),
                               "capacity": [c.to_json() for c in capacity.values()]})
            elif call.operation == "autoscale/forecast":
                scope.forecasts = await asyncio.to_thread(self.scaler.forecast)
                inst.complete({"models": {m: {"method": f.method, "fallback": f.fallback,
                                              "next": f.values[0] if f.values else None, "peak": f.peak()}
                                          for m, f in scope.forecasts.items()},
                               "fallbacks": sum(f.fallback is not None for f in scope.forecasts.values())})
            elif call.operation == "autoscale/actuate":
                inst.complete(await self._actuate(scope))
            else:
                raise WorkflowRuntimeError(call.task_id, f"no performer for external operation {call.operation!r}")
            call = inst.advance()
        await self._flush()
        self._remember(scope)
        self.fallbacks = {m: fallback_kind(f.fallback) for m, f in scope.forecasts.items() if f.fallback}
        data = inst.data
        self.last_round = {"round": self.rounds, "at": round(self.clock.time(), 6),
                           "took_ms": round((time.perf_counter() - t0) * 1000.0, 3), "path": list(inst.path),
                           "changes": (data.get("plan") or {}).get("changes"),
                           "recorded": (data.get("recorded") or {}).get("count")}
        return data

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

    async def _round_logged(self) -> None:
        try:
            await self.run_once()
            self.last_error = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the loop must outlive a bad round (a process edit, a database away)
            self.failed_rounds += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:500]
            log.error("autoscale round %d failed: %s", self.rounds, self.last_error)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="inferlb-autoscaler")

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = loop.time() + self.interval_s
            await self._round_logged()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
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
