"""The rollout manager's database side: queued writes, resuming, following other replicas.

Contract:

* State changes (``_changed``) and events (``_queue``, at most ``_MAX_PENDING_EVENTS`` waiting;
  the oldest dropped and counted beyond) are written by :meth:`RolloutPersistence.flush` off the
  event loop (rollout/store.py ``save_progress``); on a database failure they stay
  queued. A round's writes carry ``fence`` (the election's token check): fenced out, every queued
  change is dropped as stale. A change written over a rollout another replica ended meanwhile is
  refused by the database (stale) and the row re-read and followed.
* :meth:`RolloutPersistence.resume` continues the running rollouts of the database and re-applies
  a model's newest completed rollout while the fleet file still has the weights it started from.
* :meth:`RolloutPersistence.sync` follows the ``rollouts`` table (starts, steps, ends, aborts
  written by any replica), applying the rows' weights here.

Mixed into :class:`~.manager.RolloutManager`, which holds the state and defines ``_admit``,
``_apply`` and ``running_for``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from sqlalchemy.engine import Connection, Engine

from inferlb.cluster.election import FencedOut
from inferlb.config.rollout import RolloutConfig, RolloutCriteria
from inferlb.errors import StoreError
from inferlb.rollout.state import Rollout
from inferlb.rollout.store import following, list_rollouts, running_rollouts, save_progress
from inferlb.rollout.window import VersionWindow
from inferlb.types import Clock
from inferlb.versions.table import VersionTable

__all__ = ["RolloutPersistence"]

log = logging.getLogger("inferlb.rollout")

_MAX_PENDING_EVENTS = 10_000  # events waiting for the database, per manager


class RolloutPersistence:
    """The database side of :class:`~.manager.RolloutManager` (a mixin)."""

    versions: VersionTable
    window: VersionWindow
    clock: Clock
    cfg: RolloutConfig
    engine: Engine | None
    fence: Callable[[Connection], None] | None
    rollouts: dict[str, Rollout]
    events_dropped: int
    follows: int
    _events: dict[str, list[dict[str, Any]]]
    _changed: dict[str, dict[str, Any]]
    _ignored: set[str]
    _reread: set[str]
    _lock: asyncio.Lock

    if TYPE_CHECKING:   # defined by RolloutManager (manager.py)
        def running_for(self, model: str) -> Rollout | None: ...
        def _admit(self, r: Rollout) -> None: ...
        def _apply(self, r: Rollout) -> None: ...

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
        changed. Called by the live config's poll when the shared revision moved (live/manager.py);
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
