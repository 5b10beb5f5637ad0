"""The audit store's timer: day partitions made ahead and retention, on ONE replica at a time.

Contract:

* :meth:`AuditMaintenance.run_once` does one round, and only when ``leader()`` is true (several
  gateway replicas share one database; the predicate comes from the replica election, injected by
  ``create_app``; the default, always true, is right for one replica): on a partitioned PostgreSQL
  ``requests`` it creates the day partitions from today to ``ahead_days`` ahead
  (:func:`~inferlb.store.partitions.ensure_days`); with ``retention_days`` set it prunes
  what was received before ``clock.time() - retention_days`` (:func:`~inferlb.store.retention.prune`).
  It returns what it did, or None when this replica is not the leader.
* :meth:`start` runs a round at once and then every ``interval_s`` (counted from the end of a
  round) on the background runner; database calls run in a worker thread, never on the event
  loop. A failed round is logged and retried at the next interval: a database that is away never
  stops the gateway (the default partition takes rows of days not yet created); any other error
  is logged by the runner with its traceback, and the timer goes on. :meth:`close` cancels the
  timer and waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy.engine import Engine

from inferlb.background import Periodic
from inferlb.errors import StoreError
from inferlb.store.partitions import AHEAD_DAYS, day_of, ensure_days, is_partitioned
from inferlb.store.retention import PruneResult, prune
from inferlb.types import Clock

__all__ = ["AuditMaintenance", "MaintenanceRound"]

log = logging.getLogger(__name__)


def _always() -> bool:
    return True


@dataclass
class MaintenanceRound:
    """What one round did."""

    created: list[str] = field(default_factory=list)
    pruned: PruneResult | None = None


class AuditMaintenance:
    """Partitions ahead and retention on a timer, run by the leader replica only."""

    def __init__(self, engine: Engine, *, clock: Clock, retention_days: float | None = None,
                 interval_s: float = 3600.0, leader: Callable[[], bool] = _always,
                 ahead_days: int = AHEAD_DAYS) -> None:
        if retention_days is not None and retention_days <= 0:
            raise ValueError("retention_days must be positive (None keeps everything)")
        self._engine, self._clock, self._leader = engine, clock, leader
        self.retention_days, self.interval_s, self.ahead_days = retention_days, interval_s, ahead_days
        self._timer: Periodic[None] = Periodic("inferlb-audit-maintenance", self._turn,
                                               interval_s=lambda: self.interval_s, first_s=0.0, logger=log)
        self.rounds = 0
        self.last_error: str | None = None

    def _round(self) -> MaintenanceRound:
        out = MaintenanceRound()
        now = self._clock.time()
        with self._engine.begin() as conn:
            if is_partitioned(conn):
                today = day_of(now)
                out.created = ensure_days(conn, today, today + timedelta(days=self.ahead_days))
        if self.retention_days is not None:
            out.pruned = prune(self._engine, now - self.retention_days * 86_400)
        return out

    async def run_once(self) -> MaintenanceRound | None:
        """One round if this replica leads (see the module docstring); StoreError on database failure."""
        if not self._leader():
            return None
        try:
            done = await asyncio.to_thread(self._round)
        except StoreError:
            raise
        except Exception as exc:   # SQLAlchemy errors of ensure_days: the one boundary of this class
            raise StoreError(f"audit maintenance failed: {type(exc).__name__}: {exc}") from exc
        self.rounds += 1
        if done.created or (done.pruned and (done.pruned.partitions_dropped or done.pruned.rows_deleted)):
            log.info("audit maintenance: %d partition(s) created%s", len(done.created),
                     f"; pruned: {done.pruned.describe()}" if done.pruned else "")
        return done

    async def _turn(self) -> None:
        try:
            await self.run_once()
            self.last_error = None
        except StoreError as exc:
            self.last_error = str(exc)
            log.warning("%s (retried in %.0f s)", exc, self.interval_s)

    async def start(self) -> None:
        self._timer.start()

    async def close(self) -> None:
        await self._timer.stop()
