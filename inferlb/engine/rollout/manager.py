"""The rollout manager: starts, runs and stops canary rollouts; runs ``rollout.bpmn`` on a timer.

Contract:

* :meth:`RolloutManager.start_rollout` checks the request (model with versions, both versions
  known and different, steps, criteria: 400 naming the field; a running rollout on the model:
  409), writes the ``rollouts`` row first (its partial unique index makes the 409 true across
  replicas; a database failure is a 503), and only then sets the first step's weights: nothing
  is applied unless everything succeeded.
* :meth:`run_once` is one round: for every running rollout it starts a fresh instance of the
  rollout process on SpiffWorkflow (``observe → decide → promote | hold | rollback → record``;
  the operations are ``tasks/rollout.py`` over this object, no I/O), then writes the rounds'
  state changes and events to the database off the event loop. A failing round is logged and
  counted; the loop goes on. :meth:`start` resumes running rollouts from the database and runs a
  round every ``rollouts.interval_s``.
* Weights change only through the :class:`~inferlb.engine.versions.VersionTable` (one atomic swap
  per change). Rollback and abort restore the weights from before the rollout; completion gives
  the new version the two versions' whole weight. That override lasts until the fleet file says
  otherwise: on start-up the newest completed rollout of a model is re-applied only while the
  file still has the weights it started from.
* **Several replicas, one decider.** Rounds run only while ``leader()`` is true (one replica:
  always; app.py injects the predicate, an election plugs in there). Every replica follows the
  ``rollouts`` table: a start, a step, an end or an abort written by any replica bumps the shared
  revision (engine/store/rollouts.py), and each replica's live-config poll then calls
  :meth:`sync` (engine/live.py), which applies the rows' weights here. A state written over a
  rollout another replica ended meanwhile is refused by the database (stale) and re-read, so an
  abort on one replica and the leader's promotion on another never leave two truths. The leader's
  guard sees the requests the leader served (its own window): with a load balancer spreading
  clients evenly in front of the replicas that is a sample of the same traffic. The leader's
  writes after a round carry ``fence`` (the election's token check, in the same transaction):
  a replica that lost the lead meanwhile writes nothing, drops its round and follows the table.
* **Reloads** (engine/live.py): :meth:`check_config` refuses (409 ``rollout_running``) a fleet
  config that drops a model or version a running rollout moves traffic between, before anything
  changed; :meth:`follow_config` is the manager's part of the atomic swap (version table, the
  ``rollouts:`` section, ``rollout.bpmn``, the SLOs); a running rollout's weights survive it.
* Time comes from the injected clock; nothing here sleeps except the timer loop itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from sqlalchemy.engine import Connection, Engine

from ..cluster.election import FencedOut
from ..errors import ClientError, Conflict, InvalidRequest, StoreError, WorkflowRuntimeError
from ..store.rollouts import (
    RolloutConflict,
    following,
    insert_rollout,
    list_rollouts,
    running_rollouts,
    save_progress,
)
from ..types import Clock
from ..versions.table import VersionTable
from ..workflow import TIMER_OPERATION, ProcessDefinition
from .config import RolloutConfig, RolloutCriteria, RolloutSpec
from .guard import Counts, guard
from .state import Rollout, new_rollout_id
from .window import VersionWindow

if TYPE_CHECKING:   # settings imports rollout.config: a runtime import here would be a cycle
    from ..settings import FleetConfig

__all__ = ["RolloutBusy", "RolloutManager", "RolloutNotFound", "RolloutScope", "RolloutUnavailable"]

log = logging.getLogger("inferlb.rollout")

_KEEP_FINISHED = 100          # finished rollouts kept in memory (the database keeps all)
_MAX_PENDING_EVENTS = 10_000  # events waiting for the database, per manager


def _always() -> bool:
    return True


class RolloutBusy(ClientError):
    """409: the model already has a running rollout, or the rollout is not running."""

    status = 409

    def __init__(self, message: str, *, code: str = "rollout_conflict") -> None:
        super().__init__(message, code=code)


class RolloutNotFound(ClientError):
    """404: no rollout has this id."""

    status = 404

    def __init__(self, rollout_id: str) -> None:
        super().__init__(f"No rollout with id {rollout_id!r}", param="id", code="rollout_not_found")


class RolloutUnavailable(ClientError):
    """503: the rollout could not be written to the database; nothing was applied."""

    status = 503
    type = "server_error"

    def __init__(self, detail: str) -> None:
        super().__init__(f"The rollout store is unavailable: {detail[:200]}", code="store_unavailable")


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


def _counts(raw: Any) -> Counts:
    d = raw if isinstance(raw, Mapping) else {}
    return Counts(int(d.get("attempts") or 0), int(d.get("failed") or 0), int(d.get("ok") or 0),
                  int(d.get("slo_missed") or 0))


class RolloutManager:
    """See the module docstring."""

    def __init__(self, *, versions: VersionTable, window: VersionWindow, process: ProcessDefinition | None,
                 clock: Clock, cfg: RolloutConfig | None = None, engine: Engine | None = None,
                 leader: Callable[[], bool] = _always, fence: Callable[[Connection], None] | None = None) -> None:
        self.versions = versions
        self.leader = leader
        self.fence = fence
        self.window = window
        self.process = process
        self.clock = clock
        self.cfg = cfg or RolloutConfig()
        self.engine = engine
        self.interval_s = self.cfg.interval_s
        self.rollouts: dict[str, Rollout] = {}
        self.decisions: collections.Counter[tuple[str, str]] = collections.Counter()   # (model, action)
        self.rounds = 0
        self.failed_rounds = 0
        self.last_error: str | None = None
        self.events_dropped = 0
        self._events: dict[str, list[dict[str, Any]]] = {}
        self._changed: dict[str, dict[str, Any]] = {}
        self._ignored: set[str] = set()        # rows this replica's config cannot follow (warned once)
        self._reread: set[str] = set()         # stale rollouts whose rows could not be read yet
        self.follows = 0                       # rollout changes applied from the database
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ reading

    def running_for(self, model: str) -> Rollout | None:
        for r in self.rollouts.values():
            if r.model == model and r.running:
                return r
        return None

    def get(self, rollout_id: str) -> Rollout | None:
        return self.rollouts.get(rollout_id)

    def status(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "process": self.process.path.name if self.process else None,
                "leader": self.leader(), "follows": self.follows, "rounds": self.rounds,
                "failed_rounds": self.failed_rounds, "last_error": self.last_error,
                "pending_events": sum(len(v) for v in self._events.values()), "events_dropped": self.events_dropped}

    # ------------------------------------------------------------------ starting and stopping

    def plan(self, spec: RolloutSpec) -> Rollout:
        """The rollout ``spec`` asks for, checked (400 / 409); applies nothing."""
        mv = self.versions.get(spec.model)
        if mv is None:
            raise InvalidRequest(f"model {spec.model!r} has no versions (list them under the model's 'versions:' "
                                 "in the fleet file)", param="model", code="model_not_versioned")
        for field, name in (("from_version", spec.from_version), ("to_version", spec.to_version)):
            if mv.get(name) is None:
                raise InvalidRequest(f"model {spec.model!r} has no version {name!r} (versions: "
                                     f"{', '.join(mv.names)})", param=field, code="version_not_found")
        if spec.from_version == spec.to_version:
            raise InvalidRequest("from_version and to_version must differ", param="to_version")
        busy = self.running_for(spec.model)
        if busy is not None:
            raise RolloutBusy(f"model {spec.model!r} already has a running rollout ({busy.id}); abort it first")
        try:
            criteria = RolloutCriteria.model_validate({**self.cfg.criteria.model_dump(), **(spec.criteria or {})})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            msg = "unknown criterion" if first["type"] == "extra_forbidden" else first["msg"]
            raise InvalidRequest(f"criteria{'.' + where if where else ''}: {msg}",
                                 param=f"criteria.{where}" if where else "criteria") from None
        weights = {v.name: v.weight for v in mv.versions}
        if weights.get(spec.from_version, 0.0) + weights.get(spec.to_version, 0.0) <= 0:
            # Neither version takes traffic now: the rollout's percentages are of the whole model.
            weights[spec.from_version] = 100.0
        steps = tuple(spec.steps or self.cfg.steps)
        now, mono = self.clock.time(), self.clock.monotonic()
        r = Rollout(id=new_rollout_id(), model=spec.model, from_version=spec.from_version,
                    to_version=spec.to_version, steps=steps, criteria=criteria, base_weights=weights,
                    started_at=round(now, 6), step_started_at=round(now, 6), step_started_mono=mono,
                    percent=steps[0])
        return r

    async def start_rollout(self, spec: RolloutSpec) -> Rollout:
        """Check, persist, then apply the first step (see the module docstring)."""
        async with self._lock:
            r = self.plan(spec)
            start = self._event(r, "start", 0.0, r.percent, f"rollout of {r.model} from {r.from_version} to "
                                f"{r.to_version} started at {r.percent:g}%",
                                {"steps": list(r.steps), "criteria": r.criteria.model_dump(),
                                 "base_weights": r.base_weights})
            if self.engine is not None:
                try:
                    await asyncio.to_thread(insert_rollout, self.engine, r.row(), [start])
                except RolloutConflict:
                    raise RolloutBusy(f"model {r.model!r} already has a running rollout (started by another "
                                      "gateway replica)") from None
                except StoreError as exc:
                    raise RolloutUnavailable(str(exc)) from exc
            self._admit(r)
            self._apply(r)
            self.decisions[(r.model, "start")] += 1
            log.info("rollout %s: %s %s -> %s at %g%%", r.id, r.model, r.from_version, r.to_version, r.percent)
            return r

    def _admit(self, r: Rollout) -> None:
        self.rollouts[r.id] = r
        finished = [k for k, v in self.rollouts.items() if not v.running]
        for k in finished[:max(0, len(finished) - _KEEP_FINISHED)]:
            del self.rollouts[k]
        c = r.criteria
        if c.ttft_max_s is not None or c.e2e_max_s is not None:
            base = self.window.slo_of(r.model)
            self.window.set_slo(r.model, (c.ttft_max_s if c.ttft_max_s is not None else base[0],
                                          c.e2e_max_s if c.e2e_max_s is not None else base[1]))

    def _apply(self, r: Rollout) -> None:
        if r.state == "completed":
            weights = r.weights_at(100.0)
        elif r.state in ("rolled_back", "aborted"):
            weights = {k: v for k, v in r.base_weights.items() if k in (r.from_version, r.to_version)}
        else:
            weights = r.weights_at(r.percent)
        self.versions.set_weights(r.model, weights)

    def _finish(self, r: Rollout, state: str, reason: str) -> None:
        r.state = state
        r.reason = reason
        r.ended_at = round(self.clock.time(), 6)
        if state != "completed":
            r.percent = 0.0
        self._apply(r)
        self.window.set_slo(r.model, None)
        self._changed[r.id] = r.progress()

    async def abort(self, rollout_id: str, reason: str = "aborted by an operator") -> Rollout:
        """Stop a running rollout: the weights from before it come back (404 / 409 otherwise)."""
        async with self._lock:
            r = self.rollouts.get(rollout_id)
            if r is None:
                raise RolloutNotFound(rollout_id)
            if not r.running:
                raise RolloutBusy(f"rollout {rollout_id} is not running (it is {r.state})", code="rollout_not_running")
            before = r.percent
            self._finish(r, "aborted", reason)
            self._queue(r, self._event(r, "abort", before, 0.0, reason, {}))
            if rollout_id in await self._flush():
                # Another replica ended it first (the leader's last step or rollback): its row wins.
                raise RolloutBusy(f"rollout {rollout_id} is not running (it is {r.state})", code="rollout_not_running")
            self.decisions[(r.model, "abort")] += 1
            return r

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

    # ------------------------------------------------------------------ events and persistence

    def _event(self, r: Rollout, action: str, before: float, after: float, reason: str,
               evidence: Mapping[str, Any]) -> dict[str, Any]:
        return {"at": round(self.clock.time(), 6), "action": action, "from_percent": before, "to_percent": after,
                "reason": reason, "evidence": dict(evidence)}

    def _queue(self, r: Rollout, event: dict[str, Any]) -> None:
        evs = self._events.setdefault(r.id, [])
        if sum(len(v) for v in self._events.values()) >= _MAX_PENDING_EVENTS:
            evs.pop(0) if evs else None
            self.events_dropped += 1
        evs.append(event)

    async def flush(self) -> None:
        """Write the queued state changes and events; on a database failure they stay queued."""
        await self._flush()

    async def _flush(self, *, fenced: bool = False) -> set[str]:
        """:meth:`flush`; returns the stale ids (ended by another replica: re-read, nothing written).
        ``fenced``: a round's writes, with the election's token check; fenced out, every queued
        change is dropped as stale (another replica leads now)."""
        if self.engine is None:
            self._events.clear()
            self._changed.clear()
            return set()
        if not self._events and not self._changed:
            return set()
        changes, events = dict(self._changed), {k: list(v) for k, v in self._events.items()}
        try:
            stale = await asyncio.to_thread(save_progress, self.engine, changes, events,
                                            self.fence if fenced else None)
        except FencedOut as exc:
            log.warning("rollouts: this replica no longer leads; its round is dropped: %s", exc)
            stale = set(changes) | set(events)
            changes, events = {}, {}
        except StoreError as exc:
            log.error("rollouts: could not write %d event(s): %s", sum(map(len, events.values())), exc)
            return set()
        for k in stale:
            self._changed.pop(k, None)
            self._events.pop(k, None)
            events.pop(k, None)
        for k in changes:
            if k in stale:
                continue
            if self._changed.get(k) == changes[k]:
                del self._changed[k]
        for k, evs in events.items():
            left = self._events.get(k, [])
            del left[:len(evs)]
            if not left:
                self._events.pop(k, None)
        if stale:
            log.warning("rollouts: %s changed on another replica meanwhile; following the database",
                        ", ".join(sorted(stale)))
            try:
                rows = await asyncio.to_thread(following, self.engine, sorted(stale))
            except StoreError as exc:
                self._reread |= stale       # the next sync reads them
                log.error("rollouts: cannot re-read %s: %s", ", ".join(sorted(stale)), exc)
            else:
                self._follow([row for row in rows if row["id"] in stale])
        return stale

    # ------------------------------------------------------------------ rounds

    def _round(self, r: Rollout) -> dict[str, Any]:
        if self.process is None:
            raise RuntimeError("no rollout process loaded")
        r.rounds += 1
        inst = self.process.executor.start({"rollout": r.data()}, RolloutScope(self, r))
        call = inst.advance()
        while call is not None:
            if call.operation in ("clock/wait", TIMER_OPERATION):
                inst.complete({"seconds": 0.0})   # a round never waits: the next round is the wait
            else:
                raise WorkflowRuntimeError(call.task_id, f"no performer for external operation {call.operation!r}")
            call = inst.advance()
        return {**inst.data, "path": list(inst.path)}

    async def run_once(self) -> list[dict[str, Any]]:
        """One round for every running rollout; returns each instance's final data (with ``path``:
        the element ids it visited). Not the leader: only this replica's pending writes are
        flushed, and nothing is decided (returns [])."""
        async with self._lock:
            if not self.leader():
                await self._flush()
                return []
            self.rounds += 1
            out = []
            for r in [r for r in self.rollouts.values() if r.running]:
                try:
                    out.append(self._round(r))
                except Exception as exc:  # one rollout's broken round must not stop the others
                    self.failed_rounds += 1
                    self.last_error = f"{r.id}: {type(exc).__name__}: {exc}"[:500]
                    log.error("rollout round failed: %s", self.last_error)
            await self._flush(fenced=True)
            return out

    async def resume(self) -> None:
        """Running rollouts from the database continue (their step's window starts again now);
        a model's newest completed rollout is re-applied while the fleet file still has the
        weights it started from."""
        if self.engine is None:
            return
        try:
            rows = await asyncio.to_thread(running_rollouts, self.engine)
            latest = {m: await asyncio.to_thread(list_rollouts, self.engine, model=m, limit=1)
                      for m in self.versions.models()}
        except StoreError as exc:
            log.error("rollouts: cannot resume from the database: %s", exc)
            return
        mono = self.clock.monotonic()
        for row in rows:
            if row["id"] in self.rollouts:    # already followed (the live config's first poll)
                continue
            r = self._from_row(row, mono)
            if r is None:
                continue
            self._admit(r)
            self._apply(r)
            log.info("rollout %s resumed: %s at %g%%", r.id, r.model, r.percent)
        for model, last in latest.items():
            if not last or last[0]["state"] != "completed" or self.running_for(model) is not None:
                continue
            r = self._from_row(last[0], mono)
            if r is not None and all(self.versions.file_weights(model).get(k) == w
                                     for k, w in r.base_weights.items()):
                self._apply(r)
                self.rollouts[r.id] = r

    def _from_row(self, row: Mapping[str, Any], mono: float) -> Rollout | None:
        mv = self.versions.get(row["model"])
        if mv is None or mv.get(row["from_version"]) is None or mv.get(row["to_version"]) is None:
            log.warning("rollout %s: model or versions no longer configured; left as is", row["id"])
            return None
        try:
            criteria = RolloutCriteria.model_validate(row["criteria"])
        except ValidationError:
            criteria = self.cfg.criteria
        return Rollout(id=row["id"], model=row["model"], from_version=row["from_version"],
                       to_version=row["to_version"], steps=tuple(float(s) for s in row["steps"]), criteria=criteria,
                       base_weights={k: float(v) for k, v in row["base_weights"].items()},
                       started_at=row["started_at"], step_started_at=row["step_started_at"] or row["started_at"],
                       step_started_mono=mono, state=row["state"], step=int(row["step"]),
                       percent=float(row["percent"]), reason=row["reason"], ended_at=row["ended_at"])

    # ------------------------------------------------------------------ following other replicas

    async def sync(self) -> bool:
        """Follow the ``rollouts`` table: rollouts started elsewhere, steps and ends decided by the
        leader, aborts sent to another replica; their weights applied here. True when something
        changed. Called by the live config's poll when the shared revision moved (engine/live.py);
        StoreError when the database is away (the poll retries)."""
        if self.engine is None:
            return False
        async with self._lock:
            known = sorted({r.id for r in self.rollouts.values() if r.running} | self._reread)
            rows = await asyncio.to_thread(following, self.engine, known)
            return self._follow(rows)

    def _follow(self, rows: Sequence[Mapping[str, Any]]) -> bool:
        mono = self.clock.monotonic()
        changed = False
        for row in rows:
            rid = row["id"]
            self._reread.discard(rid)
            if rid in self._changed:      # this replica's own change, not written yet: it is ahead
                continue
            r = self.rollouts.get(rid)
            if r is None:
                if row["state"] != "running" or rid in self._ignored:
                    continue
                r = self._from_row(row, mono)
                if r is None:
                    self._ignored.add(rid)
                    continue
                self._admit(r)
                self._apply(r)
                log.info("rollout %s followed: %s %s -> %s at %g%%", r.id, r.model, r.from_version, r.to_version,
                         r.percent)
            else:
                state, step, percent = str(row["state"]), int(row["step"]), float(row["percent"])
                if (r.state, r.step, r.percent) == (state, step, percent):
                    continue
                if step != r.step:
                    r.step_started_mono = mono      # the new step's window starts now, here
                r.state, r.step, r.percent = state, step, percent
                r.reason, r.ended_at = row["reason"], row["ended_at"]
                r.step_started_at = row["step_started_at"] or r.step_started_at
                self._apply(r)
                if not r.running:
                    self.window.set_slo(r.model, None)
                log.info("rollout %s followed: %s at %g%%", r.id, r.state, r.percent)
            self.follows += 1
            changed = True
        return changed

    # ------------------------------------------------------------------ reloads

    def check_config(self, cfg: FleetConfig, *, source: str = "fleet") -> None:
        """409 ``rollout_running`` when ``cfg`` drops the model or a version of a running rollout
        (nothing is changed by this check)."""
        for r in self.rollouts.values():
            if not r.running:
                continue
            idx = next((i for i, m in enumerate(cfg.models) if m.name == r.model), None)
            names = {v.name for v in cfg.models[idx].versions} if idx is not None else set()
            missing = [v for v in (r.from_version, r.to_version) if v not in names]
            if missing:
                where = f"models[{idx}].versions" if idx is not None else "models"
                gone = f"version {missing[0]!r} of model {r.model!r}" if idx is not None else f"model {r.model!r}"
                raise Conflict(f"{source}: {where}: {gone} is in running rollout {r.id} ({r.from_version} -> "
                               f"{r.to_version} at {r.percent:g}%): abort it first (inferlb rollout abort {r.id}) "
                               f"or keep the version, then reload", param=where, code="rollout_running")

    def follow_config(self, cfg: FleetConfig, process: ProcessDefinition | None = None) -> None:
        """The manager's part of a reload's swap (no ``await``: engine/live.py calls it inside its
        atomic swap, after :meth:`check_config`). The version table takes the new models and
        nodes; a running rollout's weights stay; a model without a running rollout whose file
        weights changed goes back to the file's (a finished rollout's weights last until the file
        says otherwise); the ``rollouts:`` section, ``rollout.bpmn`` and the SLOs are the new ones."""
        before = {m: self.versions.file_weights(m) for m in self.versions.models()}
        self.versions.swap_config(cfg)
        for model in self.versions.models():
            mv = self.versions.get(model)
            if mv is not None and mv.overridden and self.running_for(model) is None \
                    and self.versions.file_weights(model) != before.get(model):
                self.versions.clear_weights(model)
        self.cfg = cfg.rollouts
        self.interval_s = cfg.rollouts.interval_s
        if process is not None:
            self.process = process
        self.window.set_default_slos(cfg.slos)

    async def start(self) -> None:
        await self.resume()
        self._task = asyncio.create_task(self._loop(), name="inferlb-rollouts")

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.interval_s
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = loop.time() + self.interval_s
            if any(r.running for r in self.rollouts.values()) or self._events or self._changed:
                try:
                    await self.run_once()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:   # the timer must outlive one bad turn (a database away)
                    self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                    log.error("rollouts: %s", self.last_error)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self.flush()

    def describe(self) -> list[dict[str, Any]]:
        """Every rollout this gateway knows, newest first (JSON)."""
        return [r.to_json() for r in sorted(self.rollouts.values(), key=lambda r: -r.started_at)]
