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
* Weights change only through the :class:`~inferlb.versions.VersionTable` (one atomic swap
  per change). Rollback and abort restore the weights from before the rollout; completion gives
  the new version the two versions' whole weight. That override lasts until the fleet file says
  otherwise: on start-up the newest completed rollout of a model is re-applied only while the
  file still has the weights it started from.
* **Several replicas, one decider.** Rounds run only while ``leader()`` is true (one replica:
  always; app.py injects the predicate, an election plugs in there). Every replica follows the
  ``rollouts`` table: a start, a step, an end or an abort written by any replica bumps the shared
  revision (rollout/store.py), and each replica's live-config poll then calls
  :meth:`sync` (live/manager.py), which applies the rows' weights here. A state written over a
  rollout another replica ended meanwhile is refused by the database (stale) and re-read, so an
  abort on one replica and the leader's promotion on another never leave two truths. The leader's
  guard sees the requests the leader served (its own window): with a load balancer spreading
  clients evenly in front of the replicas that is a sample of the same traffic. The leader's
  writes after a round carry ``fence`` (the election's token check, in the same transaction):
  a replica that lost the lead meanwhile writes nothing, drops its round and follows the table.
* **Reloads** (live/manager.py): :meth:`check_config` refuses (409 ``rollout_running``) a fleet
  config that drops a model or version a running rollout moves traffic between, before anything
  changed; :meth:`follow_config` is the manager's part of the atomic swap (version table, the
  ``rollouts:`` section, ``rollout.bpmn``, the SLOs); a running rollout's weights survive it.
* The rounds run on the one timer-driven BPMN runner (:class:`~inferlb.workflow.timer.ProcessTimer`,
  :attr:`RolloutManager.timer`): every ``rollouts.interval_s`` (the first one interval after
  :meth:`start`), gated on ``leader()`` (a follower's round only flushes), and only while a
  rollout runs or writes wait. Time comes from the injected clock; nothing here sleeps.
* Layout: this module holds the state, starting and aborting, the round driver, the reloads and
  the timer; :mod:`.persist` the database side (writes, resume, :meth:`sync`), :mod:`.rounds`
  one round on SpiffWorkflow and the process's operations, :mod:`.errors` the client errors; each
  name is imported from the module that defines it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from sqlalchemy.engine import Connection, Engine

from inferlb.background import describe_error
from inferlb.config.rollout import RolloutConfig, RolloutCriteria, RolloutSpec
from inferlb.errors import Conflict, InvalidRequest, StoreError
from inferlb.rollout.errors import RolloutBusy, RolloutNotFound, RolloutUnavailable
from inferlb.rollout.persist import RolloutPersistence
from inferlb.rollout.rounds import RolloutRounds
from inferlb.rollout.state import Rollout, new_rollout_id
from inferlb.rollout.store import RolloutConflict, insert_rollout
from inferlb.rollout.window import VersionWindow
from inferlb.types import Clock
from inferlb.versions.table import VersionTable
from inferlb.workflow.definition import ProcessDefinition
from inferlb.workflow.timer import ProcessTimer

if TYPE_CHECKING:   # settings imports rollout.config: a runtime import here would be a cycle
    from inferlb.config.settings import FleetConfig

__all__ = ["RolloutManager"]

log = logging.getLogger("inferlb.rollout")

_KEEP_FINISHED = 100          # finished rollouts kept in memory (the database keeps all)


def _always() -> bool:
    return True


class RolloutManager(RolloutRounds, RolloutPersistence):
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
        self.failed_rounds = 0
        self.last_error: str | None = None
        self.events_dropped = 0
        self._events: dict[str, list[dict[str, Any]]] = {}
        self._changed: dict[str, dict[str, Any]] = {}
        self._ignored: set[str] = set()        # rows this replica's config cannot follow (warned once)
        self._reread: set[str] = set()         # stale rollouts whose rows could not be read yet
        self.follows = 0                       # rollout changes applied from the database
        self._lock = asyncio.Lock()
        self.timer: ProcessTimer[list[dict[str, Any]]] = ProcessTimer(
            "inferlb-rollouts", what="rollout", process=lambda: self.process, interval_s=lambda: self.interval_s,
            run_round=self._decide, logger=log, leader=lambda: self.leader(), standby=self._standby, due=self._due,
            on_error=self._turn_failed)

    @property
    def rounds(self) -> int:
        return self.timer.rounds

    # ------------------------------------------------------------------ reading

    def running_for(self, model: str) -> Rollout | None:
        for r in self.rollouts.values():
            if r.model == model and r.running:
                return r
        return None

    def get(self, rollout_id: str) -> Rollout | None:
        return self.rollouts.get(rollout_id)

    def pending_event(self, rollout_id: str) -> dict[str, Any] | None:
        """The rollout's latest event not yet written to the database (None: all written)."""
        evs = self._events.get(rollout_id)
        return dict(evs[-1]) if evs else None

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

    # ------------------------------------------------------------------ rounds

    async def run_once(self) -> list[dict[str, Any]]:
        """One round for every running rollout; returns each instance's final data (with ``path``:
        the element ids it visited). Not the leader: only this replica's pending writes are
        flushed, and nothing is decided (returns [])."""
        return await self.timer.run_once() or []

    async def _standby(self) -> list[dict[str, Any]]:
        async with self._lock:
            await self._flush()
            return []

    async def _decide(self, n: int) -> list[dict[str, Any]]:
        async with self._lock:
            out = []
            for r in [r for r in self.rollouts.values() if r.running]:
                try:
                    out.append(await self._round(r))
                except Exception as exc:  # one rollout's broken round must not stop the others
                    self.failed_rounds += 1
                    self.last_error = f"{r.id}: {type(exc).__name__}: {exc}"[:500]
                    log.error("rollout round failed: %s", self.last_error)
            await self._flush(fenced=True)
            return out

    def _due(self) -> bool:
        """The timer's rounds run only while there is something to decide or to write."""
        return any(r.running for r in self.rollouts.values()) or bool(self._events) or bool(self._changed)

    def _turn_failed(self, exc: Exception) -> None:
        # The timer must outlive one bad turn (a database away); one rollout's failure is counted above.
        # The timer logs it (one line, at most one a minute while failing: background.py).
        self.last_error = describe_error(exc)

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
        """The manager's part of a reload's swap (no ``await``: live/manager.py calls it inside its
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
        self.timer.start()

    async def close(self) -> None:
        await self.timer.stop()
        with contextlib.suppress(Exception):
            await self.flush()

    def describe(self) -> list[dict[str, Any]]:
        """Every rollout this gateway knows, newest first (JSON)."""
        return [r.to_json() for r in sorted(self.rollouts.values(), key=lambda r: -r.started_at)]
