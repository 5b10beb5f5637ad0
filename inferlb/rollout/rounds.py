"""One rollout round on SpiffWorkflow, and the operations ``rollout.bpmn`` calls.

Contract: :meth:`RolloutRounds._round` starts a fresh instance of the rollout process for one
rollout on the manager's timer-driven BPMN runner (:meth:`ProcessTimer.run_instance
<inferlb.workflow.timer.ProcessTimer.run_instance>`; ``observe → decide → promote | hold |
rollback → record``; the operations are ``tasks/rollout.py`` over a :class:`RolloutScope`, no
I/O) and returns the instance's final data with ``path``; a timer or ``clock/wait`` completes at
once (the next round is the wait), any other external operation is a
:class:`~inferlb.errors.WorkflowRuntimeError`. The operations only
change the in-memory rollout, the version table (through ``_apply``) and the queues the
persistence part writes after the round (:mod:`.persist`). Mixed into
:class:`~.manager.RolloutManager`, which holds the state and defines ``_apply`` and ``_finish``.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from pydantic import ValidationError

from inferlb.config.rollout import RolloutCriteria
from inferlb.rollout.guard import Counts, guard
from inferlb.rollout.state import Rollout
from inferlb.rollout.stats import LogMoments
from inferlb.rollout.window import VersionWindow
from inferlb.types import Clock
from inferlb.workflow.base import ExternalCall
from inferlb.workflow.definition import ProcessDefinition
from inferlb.workflow.timer import Performer, ProcessTimer, waits

if TYPE_CHECKING:   # manager.py mixes this class in: a runtime import would be a cycle
    from inferlb.rollout.manager import RolloutManager

__all__ = ["RolloutRounds", "RolloutScope"]


class RolloutScope:
    """What the rollout process's operations act on: the manager and one rollout."""

    def __init__(self, manager: RolloutManager, rollout: Rollout) -> None:
        self.manager = manager
        self.rollout = rollout

    def observe(self) -> dict[str, Any]:
        return self.manager.observe(self.rollout)

    def decide(self, observation: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        return self.manager.decide(self.rollout, observation, params)

    def promote(self) -> dict[str, Any]:
        return self.manager.promote(self.rollout)

    def rollback(self, reason: str) -> dict[str, Any]:
        return self.manager.rollback(self.rollout, reason)

    def record(self, data: Mapping[str, Any]) -> dict[str, Any]:
        return self.manager.record(self.rollout, data)


async def _no_wait(call: ExternalCall) -> dict[str, Any]:
    return {"seconds": 0.0}   # a round never waits: the next round is the wait


_PERFORMERS: dict[str, Performer] = waits(_no_wait)


def _counts(raw: Any) -> Counts:
    d = raw if isinstance(raw, Mapping) else {}
    raw_lat = d.get("latency")
    lat: Mapping[Any, Any] = raw_lat if isinstance(raw_lat, Mapping) else {}
    latency = {str(k): LogMoments(int(v.get("n") or 0), float(v.get("log_sum") or 0.0), float(v.get("log_sq") or 0.0))
               for k, v in lat.items() if isinstance(v, Mapping)}
    return Counts(int(d.get("attempts") or 0), int(d.get("failed") or 0), int(d.get("ok") or 0),
                  int(d.get("slo_missed") or 0), latency)


class RolloutRounds:
    """The round and the process's operations of :class:`~.manager.RolloutManager` (a mixin)."""

    process: ProcessDefinition | None
    timer: ProcessTimer[list[dict[str, Any]]]
    window: VersionWindow
    clock: Clock
    decisions: collections.Counter[tuple[str, str]]
    _changed: dict[str, dict[str, Any]]

    if TYPE_CHECKING:   # defined by RolloutManager (manager.py) and RolloutPersistence (persist.py)
        def _apply(self, r: Rollout) -> None: ...
        def _finish(self, r: Rollout, state: str, reason: str) -> None: ...
        def _event(self, r: Rollout, action: str, before: float, after: float, reason: str,
                   evidence: Mapping[str, Any]) -> dict[str, Any]: ...
        def _queue(self, r: Rollout, event: dict[str, Any]) -> None: ...

    async def _round(self, r: Rollout) -> dict[str, Any]:
        if self.process is None:
            raise RuntimeError("no rollout process loaded")
        r.rounds += 1
        # The only RolloutRounds is a RolloutManager (manager.py); the scope's type stays the manager's.
        scope = RolloutScope(cast("RolloutManager", self), r)
        inst = await self.timer.run_instance({"rollout": r.data()}, scope, _PERFORMERS)
        return {**inst.data, "path": list(inst.path)}

    # ------------------------------------------------------------------ the process's operations

    def observe(self, r: Rollout) -> dict[str, Any]:
        """``rollout/observe``: both versions' counts over the step's window."""
        c = r.criteria
        since = r.step_started_mono
        canary = self.window.counts(r.model, r.to_version, since=since, window_s=c.window_s)
        base = self.window.counts(r.model, r.from_version, since=since, window_s=c.window_s)
        ttft, e2e = self.window.slo_of(r.model)
        return {"canary": canary.to_json(), "baseline": base.to_json(), "percent": r.percent,
                "step_age_s": round(self.clock.monotonic() - since, 3), "window_s": c.window_s,
                "slo": {"ttft_max_s": ttft, "e2e_max_s": e2e}}

    def decide(self, r: Rollout, observation: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        """``rollout/decide``: the guard's verdict; ``params`` may override criteria (a process edit)."""
        criteria = r.criteria
        if params:
            try:
                criteria = RolloutCriteria.model_validate({**criteria.model_dump(), **dict(params)})
            except ValidationError as exc:
                raise ValueError(f"decide parameters: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
        slo = observation.get("slo") or {}
        has_slo = bool(slo.get("ttft_max_s") or slo.get("e2e_max_s"))
        v = guard(_counts(observation.get("canary")), _counts(observation.get("baseline")), criteria, slo=has_slo,
                  step_age_s=float(observation.get("step_age_s") or 0.0))
        r.last = v.to_json()
        return {**v.to_json(), "percent": r.percent, "next_percent": r.next_percent()}

    def promote(self, r: Rollout) -> dict[str, Any]:
        """``rollout/promote``: the next step, or completion after the last."""
        if not r.running:
            return {"percent": r.percent, "state": r.state, "completed": r.state == "completed"}
        nxt = r.next_percent()
        if nxt is None or nxt >= 100.0:
            r.step = len(r.steps) - 1
            r.percent = 100.0
            self._finish(r, "completed", f"{r.to_version} serves all of {r.model}'s traffic")
        else:
            r.step += 1
            r.percent = nxt
            r.step_started_mono = self.clock.monotonic()
            r.step_started_at = round(self.clock.time(), 6)
            self._apply(r)
            self._changed[r.id] = r.progress()
        return {"percent": r.percent, "state": r.state, "completed": r.state == "completed"}

    def rollback(self, r: Rollout, reason: str) -> dict[str, Any]:
        """``rollout/rollback``: the weights from before the rollout come back."""
        if r.running:
            self._finish(r, "rolled_back", reason or "rolled back")
        return {"percent": r.percent, "state": r.state}

    def record(self, r: Rollout, data: Mapping[str, Any]) -> dict[str, Any]:
        """``rollout/record``: queue this round's event (written after the round)."""
        decision = data.get("decision") or {}
        action = str(decision.get("action") or "hold")
        if action == "promote" and r.state == "completed":
            action = "complete"
        pct = decision.get("percent")
        before = float(pct) if isinstance(pct, int | float) else r.percent
        after = r.percent
        evidence = {"observation": data.get("observation"), "checks": decision.get("checks")}
        self._queue(r, self._event(r, action, before, after, str(decision.get("reason") or ""), evidence))
        self.decisions[(r.model, action)] += 1
        return {"count": 1, "action": action}
