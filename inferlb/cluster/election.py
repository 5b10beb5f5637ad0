"""Election of the one replica that runs once-only background work, with a fencing token.

Mechanism: a lease row per role in the audit database (``leader_leases``, migration 0009), taken
and renewed by one atomic upsert on the **database's clock**:

* a replica takes the role when the row is missing or its lease has run out, and then the
  ``token`` grows by one (a new term); the holder renews it every ``lease_s / 3``;
* :meth:`Election.leader` is True only while this replica holds the role *and* its own
  conservative deadline has not passed: the renewal's start (local monotonic clock) + the
  lease − a margin. A holder that cannot reach the database stops believing it leads before its
  lease can be taken by another replica;
* a holder that dies (SIGKILL) stops renewing: another replica's next attempt after the lease
  ran out takes the role with the next token (failover within ``lease_s + lease_s / 3``); where a
  supervisor sees it die (``serve --workers``), :func:`release_holder` ends its lease at once and
  the others are poked (:meth:`Election.poke`) to take it without waiting;
* :meth:`Election.fence` is the writers' check: inside the writer's own transaction it reads the
  role's row (``FOR SHARE`` on PostgreSQL, so a take-over waits for that transaction) and raises
  :class:`FencedOut` unless the row still names this holder and token. A paused former leader
  whose lease was taken can therefore not write after the new one started.

:class:`LocalLeader` is the single-replica stand-in: always the leader, a fence that passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from inferlb.background import Periodic
from inferlb.errors import StoreError
from inferlb.store.db import describe_db_error
from inferlb.types import Clock

__all__ = ["Election", "FencedOut", "Leadership", "LocalLeader", "release_holder"]

log = logging.getLogger("inferlb.cluster")

_PG_NOW = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
_SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"


class FencedOut(StoreError):
    """A write for a role whose lease this replica no longer holds (a newer token exists)."""


class Leadership(Protocol):
    """What background jobs take: :meth:`leader` and, for their writes, :meth:`fence`."""

    def leader(self) -> bool: ...

    def fence(self, conn: Connection) -> None: ...

    def status(self) -> dict[str, Any]: ...


class LocalLeader:
    """One replica alone: it always leads; fences pass."""

    def leader(self) -> bool:
        return True

    def fence(self, conn: Connection) -> None:
        return None

    def status(self) -> dict[str, Any]:
        return {"mode": "single", "leader": True}


def _now_sql(engine: Engine) -> str:
    return _SQLITE_NOW if engine.dialect.name == "sqlite" else _PG_NOW


def release_holder(engine: Engine, holder: str) -> int:
    """End every lease ``holder`` holds now (its process is known to be dead: no fence can be
    passed by it any more); returns how many. A database error is logged and returns 0: the
    leases then run out on their own."""
    sql = text(f"UPDATE leader_leases SET expires_at = {_now_sql(engine)} "
               f"WHERE holder = :me AND expires_at > {_now_sql(engine)}")
    try:
        with engine.begin() as conn:
            return int(conn.execute(sql, {"me": holder}).rowcount or 0)
    except SQLAlchemyError as exc:
        log.warning("could not release the leases of %s (%s); they run out on their own", holder,
                    describe_db_error(exc))
        return 0


class Election:
    """See the module docstring. ``role`` names the lease (one per kind of once-only work; the
    gateway elects ``"background"``)."""

    def __init__(self, engine: Engine, holder: str, *, lease_s: float, clock: Clock, role: str = "background",
                 margin_s: float | None = None) -> None:
        self.engine = engine
        self.holder = holder
        self.role = role
        self.lease_s = lease_s
        self.clock = clock
        self.margin_s = margin_s if margin_s is not None else min(1.0, lease_s / 5)
        self.token: int | None = None
        self.valid_until = 0.0          # local monotonic
        self.current_holder: str | None = None
        self.current_token: int | None = None
        self.attempts = 0
        self.failures = 0
        self.terms = 0                  # times this replica took the role
        self.last_error: str | None = None
        self._timer: Periodic[bool] = Periodic(
            f"inferlb-election-{role}", lambda: asyncio.to_thread(self.attempt), interval_s=lease_s / 3.0,
            # No back-off: a replica must retry its lease at its own pace (failover bound); the
            # runner still logs a failing attempt once a minute, without a traceback.
            logger=log, backoff_max_s=0.0, wait=self._wait)
        self._poke: asyncio.Event | None = None
        now = _now_sql(engine)
        self._acquire_sql = text(
            f"INSERT INTO leader_leases (name, holder, token, expires_at, acquired_at) "
            f"VALUES (:name, :me, 1, {now} + :lease, {now}) "
            f"ON CONFLICT (name) DO UPDATE SET "
            f"token = CASE WHEN leader_leases.holder = :me AND leader_leases.expires_at > {now} "
            f"THEN leader_leases.token ELSE leader_leases.token + 1 END, "
            f"acquired_at = CASE WHEN leader_leases.holder = :me AND leader_leases.expires_at > {now} "
            f"THEN leader_leases.acquired_at ELSE {now} END, "
            f"holder = :me, expires_at = {now} + :lease "
            f"WHERE leader_leases.holder = :me OR leader_leases.expires_at <= {now} "
            f"RETURNING token")
        self._read_sql = text(f"SELECT holder, token, expires_at - {now} AS left_s FROM leader_leases "
                              f"WHERE name = :name")
        lock = "" if engine.dialect.name == "sqlite" else " FOR SHARE"
        self._fence_sql = text(f"SELECT holder, token FROM leader_leases WHERE name = :name{lock}")
        self._release_sql = text(f"UPDATE leader_leases SET expires_at = {now} "
                                 f"WHERE name = :name AND holder = :me AND token = :token")

    # ------------------------------------------------------------------ the predicate and the fence

    def leader(self) -> bool:
        return self.token is not None and self.clock.monotonic() < self.valid_until

    def fence(self, conn: Connection) -> None:
        """Raise :class:`FencedOut` unless the role's row still names this holder and token
        (call it inside the transaction that writes)."""
        token = self.token
        row = conn.execute(self._fence_sql, {"name": self.role}).first()
        if token is None or row is None or row.holder != self.holder or int(row.token) != token:
            raise FencedOut(f"role {self.role!r}: this replica ({self.holder}, token {token}) no longer holds it"
                            + (f"; {row.holder} holds token {row.token}" if row is not None else ""))

    # ------------------------------------------------------------------ one attempt

    def attempt(self) -> bool:
        """Take or renew the lease (blocking; run it in a thread). Returns :meth:`leader`."""
        self.attempts += 1
        started = self.clock.monotonic()
        try:
            with self.engine.begin() as conn:
                row = conn.execute(self._acquire_sql, {"name": self.role, "me": self.holder,
                                                       "lease": float(self.lease_s)}).first()
                if row is None:
                    cur = conn.execute(self._read_sql, {"name": self.role}).first()
                    self.current_holder = cur.holder if cur is not None else None
                    self.current_token = int(cur.token) if cur is not None else None
        except SQLAlchemyError as exc:
            self.failures += 1
            self.last_error = describe_db_error(exc)
            return self.leader()
        self.last_error = None
        if row is None:
            if self.token is not None:
                log.warning("leadership of %r lost to %s (token %s)", self.role, self.current_holder,
                            self.current_token)
            self.token = None
            return False
        token = int(row.token)
        if token != self.token:
            self.terms += 1
            log.info("this replica (%s) now leads %r with fencing token %d", self.holder, self.role, token)
        self.token = token
        self.current_holder, self.current_token = self.holder, token
        self.valid_until = started + self.lease_s - self.margin_s
        return True

    def release(self) -> None:
        """Give the role up at once (a clean shutdown), so another replica takes it without waiting."""
        if self.token is None:
            return
        with contextlib.suppress(SQLAlchemyError), self.engine.begin() as conn:
            conn.execute(self._release_sql, {"name": self.role, "me": self.holder, "token": self.token})
        self.token = None

    # ------------------------------------------------------------------ the loop

    async def _wait(self, delay: float) -> None:
        """The timer's wait: ``delay`` seconds, or until :meth:`poke`."""
        if self._poke is None:
            self._poke = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._poke.wait()
        self._poke.clear()

    def poke(self) -> None:
        """Attempt now instead of at the next renewal (the holder left: inferlb/cluster/leave.py).
        On the loop."""
        if self._poke is not None:
            self._poke.set()

    async def start(self) -> None:
        """One attempt now, then one every ``lease_s / 3`` on the background runner."""
        await asyncio.to_thread(self.attempt)
        self._timer.start()

    async def close(self) -> None:
        await self._timer.stop()
        await asyncio.to_thread(self.release)

    def status(self) -> dict[str, Any]:
        return {"mode": "elected", "role": self.role, "leader": self.leader(), "holder": self.current_holder,
                "token": self.current_token, "lease_s": self.lease_s, "terms_here": self.terms,
                "attempts": self.attempts, "failures": self.failures, "last_error": self.last_error}
