"""The running configuration, changed while the gateway serves: reloads and node overrides.

:class:`LiveConfig` owns what a change swaps: the base fleet (the file), the node overrides
(database, :mod:`inferlb.store.overrides`), and through :meth:`_swap` every live part that
reads the config. Contracts:

* **Validate everything first, then swap.** :meth:`reload` re-reads the fleet file and the
  processes directory with the start-up checks (``check``: ``app.check_startup_files``: the fleet
  schema, the routing plugins, both processes parsed with every condition, script and parameter
  checked against the data the process holds, workflow/datacheck.py), merges the overrides
  (live/fleet_admin.py) and refuses what a running gateway cannot take (``admission`` and
  ``observability`` need a restart: 409 ``restart_required``). Any error raises before anything
  changed: ConfigError / ProcessValidationError name the file, the key path or element id, and
  the problem.
* **The swap is atomic**: :meth:`_swap` runs without an ``await`` in it, so no request sees half
  of it. New requests start on the new :class:`~inferlb.engine.scope.Snapshot` (process, config,
  router); requests already running keep theirs to the end. The live fleet is reconciled in place
  (:func:`~inferlb.live.fleet_admin.apply_fleet`): nodes that persist keep their health state,
  in-flight counts and learned speeds.
* **Every replica converges.** Node changes are written to the database first (one transaction,
  with the revision the change was validated against, :func:`save_override`), then applied
  here; every other replica looks every ``poll_s`` (:meth:`poll_once`): its revision watch
  (store/revision_watch.py: the SQLite file's stat, PostgreSQL ``NOTIFY``, and a re-read
  every ``reread_s`` whatever they say) tells whether the database may have moved, and only then
  is the revision read (:meth:`sync_once`, one primary-key read) and the rows applied when it
  moved. A database that is away fails a node change with 503 (nothing applied) and leaves the
  poll to retry; reloads need no database.
* **Model versions and rollouts are part of it.** A reload that changes a model's ``versions``
  swaps the version table in the same atomic swap (:meth:`RolloutManager.follow_config
  <inferlb.rollout.manager.RolloutManager.follow_config>`: a running rollout's weights
  survive a reload that keeps its versions), and one that drops a version a running rollout
  uses is refused first (409 ``rollout_running``); the config version is the hash of the whole
  effective config, ``versions`` and ``rollouts`` included. The shared revision also moves with
  every rollout state change (rollout/store.py): when it moved, the poll re-reads the
  node overrides only if their rows changed, and always has the rollout manager follow the
  ``rollouts`` table (:meth:`RolloutManager.sync <inferlb.rollout.manager.RolloutManager.sync>`),
  so a rollout started, stepped or aborted on any replica sets the same weights on every one.
* Changes are serialised by one lock; each is counted and the last one described (:meth:`status`).
* **Discovered nodes** (discovery: pods of a Kubernetes EndpointSlice watch) are per replica,
  never written to the database: each source hands its rows to :meth:`set_discovered`, and every
  merge here includes them (source ``discovery``), so reloads and operators' changes keep them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Engine

from inferlb.background import Periodic, describe_error
from inferlb.config.settings import FleetConfig, Settings
from inferlb.engine.gateway import Gateway
from inferlb.engine.scope import Snapshot
from inferlb.errors import ConfigError, Conflict, InvalidRequest, StoreError, Unavailable
from inferlb.health.monitor import HealthMonitor
from inferlb.health.probe import targets_for
from inferlb.learned.policy_gate import gate_routing_change, requirement_for, routing_changed, verdict_event
from inferlb.live.fleet_admin import Effective, apply_fleet, merge_overrides, settle
from inferlb.live.startup import Checked
from inferlb.node_types import NodeEvent
from inferlb.observability.hub import Observability
from inferlb.rollout.manager import RolloutManager
from inferlb.routing.lifecycle import LifecycleParams
from inferlb.routing.profiles import Router
from inferlb.store import StoreHandle
from inferlb.store.overrides import NodeOverride, StaleOverrides, load_overrides, read_revision, save_override
from inferlb.store.revision_watch import PollWatch, RevisionWatch
from inferlb.types import Clock
from inferlb.workflow.definition import ProcessDefinition

__all__ = ["RESTART_ONLY", "LiveConfig"]

log = logging.getLogger("inferlb.live")

# Sections of the fleet file a running gateway cannot take: the admission queue and pools, the
# metrics registry and tracer, and the discovery sources are built once at start-up (app.py).
RESTART_ONLY = ("admission", "observability", "discovery")

# How a node operation changes the overrides: (effective config, current rows) -> new rows, or a ClientError.
NodeChange = Callable[[Effective, Sequence[NodeOverride]], list[NodeOverride]]


class LiveConfig:
    def __init__(self, *, settings: Settings, checked: Checked, gateway: Gateway, check: Callable[[Settings], Checked],
                 clock: Clock, engine: Engine | None = None, monitor: HealthMonitor | None = None,
                 obs: Observability | None = None, store: StoreHandle | None = None,
                 record: Callable[[list[NodeEvent]], None] | None = None,
                 on_swap: Callable[[Snapshot], None] | None = None, poll_s: float = 1.0,
                 rollouts: RolloutManager | None = None, watch: RevisionWatch | None = None) -> None:
        self.settings = settings
        self.base: FleetConfig = checked.fleet
        self.gateway = gateway
        self.check = check
        self.clock = clock
        self.engine = engine
        self.monitor = monitor
        self.obs = obs
        self.store = store
        self.record = record
        self.on_swap = on_swap
        self.poll_s = poll_s
        self.rollouts = rollouts
        self.watch = watch if watch is not None else PollWatch(clock=clock)
        self.overrides: list[NodeOverride] = []
        self.discovered: dict[str, list[NodeOverride]] = {}   # discovery source -> its rows (discovery)
        self.revision = 0
        self.effective = merge_overrides(self.base, [], source=self._source())
        self.health_process: ProcessDefinition = checked.health_process
        self.reloads = 0
        self.changes = 0
        self.last_change: dict[str, Any] | None = None
        self.sync_error: str | None = None
        # The last refusal the reload triggers logged (problem + files digest, live/triggers.py):
        # the same one again is not logged again; None after a reload that went through.
        self.last_refusal: str | None = None
        self._lock = asyncio.Lock()
        self._poller: Periodic[None] = Periodic(
            "inferlb-live-config", self._poll_turn, interval_s=lambda: self.poll_s,
            wait=lambda seconds: self.watch.wait(seconds), on_error=self._poll_failed, logger=log)

    def _source(self) -> str:
        cfg = self.settings.config
        return str(cfg) if cfg is not None else "fleet"

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        """Apply the overrides the database holds (before readiness), then poll in a task."""
        if self.engine is not None:
            await self.watch.start()
        await self.poll_once()
        self._poller.start()

    async def close(self) -> None:
        await self._poller.stop()
        await self.watch.close()

    async def _poll_turn(self) -> None:
        """One turn of the poll (on the background runner, after the watch's wait)."""
        await self.poll_once()
        if settle(self.gateway.rt.fleet):
            self._flush_events()

    def _poll_failed(self, exc: Exception) -> None:
        # The poll must outlive one bad turn; the next one retries.
        # The poller logs it (one line, at most one a minute while failing: background.py).
        self.sync_error = describe_error(exc)

    # ------------------------------------------------------------------ reload (files)

    def _read_files(self) -> Checked:
        settings = self.settings
        if settings.config is not None:    # the file is the base: read it again
            settings = settings.model_copy(update={"fleet": None})
        return self.check(settings)

    async def reload(self, *, trigger: str, actor: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Re-read and validate the fleet file and the processes, then swap (module docstring).
        Raises ConfigError / ProcessValidationError / Conflict with nothing changed."""
        t0 = self.clock.monotonic()
        async with self._lock:
            # Parsing BPMN is CPU work of tens of ms: off the event loop, requests keep flowing.
            checked = await asyncio.to_thread(self._read_files)
            eff = merge_overrides(checked.fleet, self.overrides, source=self._source(),
                                  discovered=self._discovered())
            self._restart_only(eff.cfg)
            if self.rollouts is not None:
                self.rollouts.check_config(eff.cfg, source=self._source())
            evaluation = await self._gate_routing(eff.cfg, actor or {})
            old = self.gateway.snapshot
            changes = self._swap(eff, checked.request_process, checked.health_process,
                                 {"trigger": trigger, **(actor or {})}, rollout=checked.rollout_process)
            self.base = checked.fleet
            self.reloads += 1
            proc = {"file": checked.request_process.path.name, "version": checked.request_process.version,
                    "previous": old.process.version, "engine": checked.request_process.mode}
            out: dict[str, Any] = {
                   "reloaded": True, "trigger": trigger, "process": proc,
                   "health_process": {"file": checked.health_process.path.name,
                                      "version": checked.health_process.version},
                   "rollout_process": {"file": checked.rollout_process.path.name,
                                       "version": checked.rollout_process.version}
                   if checked.rollout_process is not None else None,
                   "config_version": eff.version, "previous_config_version": old.config_version,
                   "routing_evaluation": evaluation,
                   "nodes": changes, "versions": self.gateway.rt.versions.describe(),
                   "took_ms": round((self.clock.monotonic() - t0) * 1000.0, 3)}
            self.last_change = {"at": round(self.clock.time(), 6), "kind": "reload", **out}
            log.info("reloaded (%s): process %s, config %s, %s", trigger, proc["version"], eff.version,
                     ", ".join(changes) or "no node changes")
            return out

    def _restart_only(self, cfg: FleetConfig) -> None:
        current = self.effective.cfg
        for key in RESTART_ONLY:
            if getattr(cfg, key) != getattr(current, key):
                raise Conflict(f"{self._source()}: {key}: this section changed, and a running gateway cannot take "
                               f"it (it is built once at start-up): restart to apply it, or undo the change "
                               f"to reload the rest", param=key, code="restart_required")
        if cfg.routing != current.routing:
            self._router_for(cfg)   # 409 restart_required when it needs a predictor not wired at start-up

    def _router_for(self, cfg: FleetConfig) -> Router:
        """The router of ``cfg.routing``. The learned profile's predictor, training loop and
        metrics are wired once (app.py): a routing whose scorers need a predictor reloads
        only onto that same lifecycle (same ``routing.predictor``); switching away from it reloads
        (the predictor stays wired, idle). Anything else: 409 ``restart_required``."""
        r = cfg.routing
        learner = self.gateway.rt.learner
        same = learner is not None and _predictor_params(r.predictor) == learner.p
        router = r.build_router(clock=self.clock.time, lifecycle=learner if same else None)
        if getattr(router, "lifecycle", None) is not None and not same:
            why = ("a routing with a latency predictor is built once at start-up" if learner is None else
                   "routing.predictor differs from the predictor wired at start-up")
            raise Conflict(f"{self._source()}: routing: {why}; restart to apply it", param="routing",
                           code="restart_required")
        # The reward bandit's evidence survives a reload that keeps its settings (routing/reward.py).
        old = getattr(self.gateway.rt.router, "reward", None)
        new = getattr(router, "reward", None)
        if old is not None and new is not None and old.p == new.p:
            router.reward = old   # type: ignore[attr-defined]
        return router

    async def _gate_routing(self, cfg: FleetConfig, actor: Mapping[str, Any]) -> dict[str, Any] | None:
        """The off-policy evaluation a routing-policy change must pass first (learned/policy_gate.py):
        None when none is required or the policy is unchanged, the verdict when it passed; 409
        ``evaluation_failed`` when refused, 503 ``evaluation_unavailable`` without an audit trail
        (a change to a fixed heuristic profile always passes: routing/gate.py). Either outcome is a
        ``routing:policy`` node event."""
        old, new = self.effective.cfg.routing, cfg.routing
        req = requirement_for(old, new)
        if req is None or not routing_changed(old, new):
            return None
        now = self.clock.time()
        who = {"by": actor.get("by", actor.get("trigger")), "key_id": actor.get("key_id")}
        try:
            current_logged = getattr(self.gateway.rt.router, "lifecycle", None) is not None
            # Reading and replaying thousands of decisions is CPU work: off the event loop.
            verdict = await asyncio.to_thread(gate_routing_change, self.engine, old, new, req,
                                              current_logged=current_logged, now=now)
        except StoreError as exc:
            verdict = {"passed": False, "from": old.profile, "to": new.profile,
                       "reason": f"the audit trail cannot be read ({exc}), so the change cannot be evaluated"}
            self._record(verdict_event(verdict, at=now, actor=who))
            raise Unavailable(f"{self._source()}: routing: {verdict['reason']}; nothing changed",
                              code="evaluation_unavailable") from exc
        self._record(verdict_event(verdict, at=now, actor=who))
        if not verdict["passed"]:
            raise Conflict(f"{self._source()}: routing: the change from {old.profile} to {new.profile} needs a "
                           f"passing off-policy evaluation (routing.require_evaluation): {verdict['reason']}; "
                           f"nothing changed", param="routing", code="evaluation_failed")
        return verdict

    def _record(self, event: NodeEvent) -> None:
        if self.record is not None:
            self.record([event])

    # ------------------------------------------------------------------ node overrides (database)

    def _db(self) -> Engine:
        if self.engine is None:
            raise Unavailable("Live node changes need the database that holds the node overrides",
                              code="overrides_unavailable")
        return self.engine

    async def poll_once(self) -> bool:
        """One turn of the poll: :meth:`sync_once` when the revision watch says a read is due,
        the watch told of it once the read succeeded (a failed one is tried at the next turn)."""
        mark = self.watch.due()
        if mark is None:
            return False
        changed = await self.sync_once()
        if self.sync_error is None:
            self.watch.seen(mark)
        return changed

    async def sync_once(self) -> bool:
        """When the shared revision moved: apply the database's overrides if their rows changed,
        and have the rollout manager follow the ``rollouts`` table; True when something changed.
        A database that is away, or overrides this replica's file cannot take, leave the node
        config as it is (``sync_error`` says why; rollouts are still followed) and the revision
        unread, so the next poll tries again."""
        if self.engine is None:
            return False
        try:
            rev = await asyncio.to_thread(read_revision, self.engine)
            if rev == self.revision:
                self.sync_error = None
                return False
            async with self._lock:
                rev, rows = await asyncio.to_thread(load_overrides, self.engine)
                if rev == self.revision:
                    return False
                changed = False
                refused: ConfigError | None = None
                if rows != self.overrides:    # the revision moves with rollouts too (module docstring)
                    try:
                        eff = merge_overrides(self.base, rows, source="node overrides",
                                              discovered=self._discovered())
                    except ConfigError as exc:
                        refused = exc
                    else:
                        self._swap(eff, self.gateway.process, self.health_process,
                                   {"trigger": "overrides", "revision": rev})
                        self.overrides = rows
                        changed = True
                if self.rollouts is not None:
                    changed = await self.rollouts.sync() or changed
                if refused is not None:
                    raise refused
                self.revision = rev
                self.sync_error = None
                return changed
        except (StoreError, ConfigError) as exc:
            error = str(exc)[:500]
            if error != self.sync_error:    # once per distinct problem, not every poll
                log.warning("node overrides not applied: %s", error)
            self.sync_error = error
            return False

    async def change_nodes(self, name: str, change: NodeChange, *, what: str,
                           actor: Mapping[str, Any]) -> dict[str, Any]:
        """Validate ``change`` against the overrides as the database holds them now, write it
        (refused if another replica wrote meanwhile: then re-read and validate again, three
        times at most), then apply it here. 400/404/409 from ``change`` or the merge, 503 when the
        database is away; nothing is applied in either case."""
        engine = self._db()
        async with self._lock:
            for _ in range(3):
                try:
                    rev, rows = await asyncio.to_thread(load_overrides, engine)
                except StoreError as exc:
                    raise Unavailable(f"The node overrides cannot be read: {exc}",
                                      code="overrides_unavailable") from exc
                try:
                    current = merge_overrides(self.base, rows, source="node overrides",
                                              discovered=self._discovered()) \
                        if rows != self.overrides else self.effective
                except ConfigError as exc:
                    raise Conflict(f"The stored node overrides do not fit this gateway's fleet file: {exc}",
                                   param=exc.path, code="overrides_conflict") from exc
                new_rows = change(current, rows)
                try:
                    eff = merge_overrides(self.base, new_rows, source="node", discovered=self._discovered())
                except ConfigError as exc:
                    raise InvalidRequest(str(exc), param=exc.path, code="invalid_node") from exc
                new = next((o for o in new_rows if o.name == name), None)
                try:
                    new_rev = await asyncio.to_thread(save_override, engine, name, new, expect_revision=rev)
                except StaleOverrides:
                    continue
                except StoreError as exc:
                    raise Unavailable(f"The node override could not be saved: {exc}",
                                      code="overrides_unavailable") from exc
                # The revision moves with rollouts too: when it moved before this change, leave it
                # for the poll, which then has the rollout manager follow (the rows are applied here).
                self.overrides = new_rows
                if rev == self.revision:
                    self.revision = new_rev
                changes = self._swap(eff, self.gateway.process, self.health_process,
                                     {"trigger": what, **actor, "revision": new_rev})
                self.last_change = {"at": round(self.clock.time(), 6), "kind": what, "node": name,
                                    "revision": new_rev, "nodes": changes, **actor}
                return {"node": name, "action": what, "revision": new_rev, "config_version": eff.version,
                        "changes": changes}
        raise Unavailable("The node overrides kept changing under this request; try again", code="overrides_busy")

    # ------------------------------------------------------------------ discovered nodes (per replica)

    def _discovered(self) -> list[NodeOverride]:
        return [row for rows in self.discovered.values() for row in rows]

    async def set_discovered(self, source: str, rows: Sequence[NodeOverride], evidence: Mapping[str, Any]
                             ) -> list[str]:
        """Put ``rows`` in force as discovery ``source``'s nodes and apply them (one line per fleet
        change). ConfigError (the merged fleet invalid) with nothing changed."""
        async with self._lock:
            others = [row for name, got in self.discovered.items() if name != source for row in got]
            eff = merge_overrides(self.base, self.overrides, source=f"discovery {source}",
                                  discovered=[*others, *rows])
            changes = self._swap(eff, self.gateway.process, self.health_process, evidence)
            self.discovered[source] = list(rows)
            self.last_change = {"at": round(self.clock.time(), 6), "kind": "discovery", "source": source,
                                "nodes": changes}
            return changes

    # ------------------------------------------------------------------ the swap

    def _swap(self, eff: Effective, process: ProcessDefinition, health: ProcessDefinition,
              evidence: Mapping[str, Any], *, rollout: ProcessDefinition | None = None) -> list[str]:
        """Install ``eff`` and the processes everywhere; no ``await`` in here (atomic on the loop).
        The only refusal (a new router that needs a restart) comes before anything changed. The
        version table (and with a rollout manager, its config and ``rollout``, the rollout
        process of a reload) is swapped here too."""
        gw = self.gateway
        old = gw.snapshot
        rt = old.rt
        router = rt.router
        if eff.cfg.routing != rt.fleet_cfg.routing:
            router = self._router_for(eff.cfg)
        for m in eff.cfg.models:
            if m.tokenizer and rt.fleet_cfg.model(m.name) != m:
                rt.estimator.use_tokenizer(m.name, m.tokenizer)
        if process is not old.process and self.obs is not None:
            self.obs.instrument(process)
        if self.rollouts is not None:
            self.rollouts.follow_config(eff.cfg, rollout)
        else:
            rt.versions.swap_config(eff.cfg)
        changes = apply_fleet(rt.fleet, eff, evidence)
        new = Snapshot(dataclasses.replace(rt, fleet_cfg=eff.cfg, router=router), process, eff.version)
        gw.swap(new)
        self.effective = eff
        self.health_process = health
        if self.monitor is not None:
            self.monitor.process = health
            self.monitor.interval_s = eff.cfg.health.interval_s
            self.monitor.prober.cfg = eff.cfg.health
            self.monitor.prober.targets = targets_for(eff.cfg.nodes, eff.cfg.health)
        if self.store is not None:
            self.store.slos[:] = list(eff.cfg.slos)
        if self.obs is not None:
            self.obs.follow(eff.cfg)
        if self.on_swap is not None:
            self.on_swap(new)
        self.changes += 1
        self._flush_events()
        return changes

    def _flush_events(self) -> None:
        """Hand the node events of a change to the event writer now (not at the next health round),
        so ``/admin/fleet/events`` shows them at once."""
        if self.record is not None:
            events = self.gateway.rt.fleet.take_events()
            if events:
                self.record(events)

    # ------------------------------------------------------------------ what operators see

    def sources(self) -> dict[str, str]:
        return dict(self.effective.sources)

    def status(self) -> dict[str, Any]:
        return {"config_version": self.effective.version, "process_version": self.gateway.process.version,
                "overrides_revision": self.revision, "overrides": [o.to_json() for o in self.overrides],
                "reloads": self.reloads, "changes": self.changes, "last_change": self.last_change,
                "sync_error": self.sync_error, "poll_s": self.poll_s, "watch": self.watch.describe()}


def _predictor_params(raw: Mapping[str, Any]) -> LifecycleParams | None:
    try:
        return LifecycleParams.model_validate(raw)
    except ValueError:   # a ValidationError: the fleet check reports it with its key path
        return None
