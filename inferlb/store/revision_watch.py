"""How a replica notices that the shared revision moved, without a thread hop and a query per poll.

The live config (live/manager.py) wakes every ``poll_s`` (``INFERLB_OVERRIDES_POLL_S``) and asks
its watch whether a read is due (:meth:`RevisionWatch.due`). Only then does it read the revision
(:func:`~inferlb.store.overrides.read_revision`: one primary-key read in a worker thread),
and once that read succeeded it hands the mark back (:meth:`RevisionWatch.seen`). Reading at
every poll cost an idle gateway about 1 ms of CPU per second (docs/benchmarks.md, "Idle CPU and
memory growth").

Contract of every watch:

* :meth:`~RevisionWatch.due` is synchronous and cheap: no thread, no SQL, at most two
  ``os.stat`` calls.
* A change committed by any process makes ``due`` return a mark at the next poll after the
  commit (SQLite: the commit moved the files; PostgreSQL: its notification arrived, and at every
  poll while the watch is not listening).
* A mark counts only once :meth:`~RevisionWatch.seen` got it: a read that failed leaves ``due``
  true, so the next poll reads again.
* ``due`` is also true once ``reread_s`` (``INFERLB_OVERRIDES_REREAD_S``) passed since the last
  read, whatever the cheap check says: the safety net for what that check cannot see (a write
  inside one timestamp tick that left the file sizes as they were, a notification lost on the way).
* :meth:`~RevisionWatch.wait` is the poller's sleep: ``timeout_s``, or less when the watch hears of
  a change sooner (a PostgreSQL notification ends it at once, so a change applies within
  milliseconds there).

The kinds (:func:`revision_watch` picks one for an engine):

* :class:`SqliteFileWatch` (a SQLite file, the default database): ``(inode, size, mtime_ns)`` of
  the database file and of its ``-wal`` file. Every commit writes one of them (the ``-wal`` under
  ``journal_mode=WAL``, store/db.py; the main file otherwise, and at checkpoints), so an
  unchanged pair means no commit since the last read. This replica's own writes (the audit writer)
  move them too: a gateway under traffic reads at every poll, as it did before.
* :class:`PgNotifyWatch` (PostgreSQL): a dedicated connection ``LISTEN``-s on its channel,
  :data:`~inferlb.store.overrides.REVISION_CHANNEL` by default (the tenant keys' cache listens
  on its own, admission/service.py), on which every revision bump notifies
  from its own transaction (:func:`~inferlb.store.overrides.bump_revision`; the payload is
  the schema, so deployments sharing one database in different schemas ignore each other). The
  connection reconnects after ``retry_s``, doubling up to ``retry_max_s``; while it is down every
  poll reads (the old polling), and every (re)connection makes one read due (what was committed
  while nobody listened).
* :class:`PollWatch` (an in-memory SQLite, another database): every poll reads.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

from inferlb.background import Background
from inferlb.store.db import pg_connect_params, sqlite_file
from inferlb.store.overrides import REVISION_CHANNEL
from inferlb.types import Clock
from inferlb.wakeup import Wakeup

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["Mark", "PgNotifyWatch", "PollWatch", "RevisionWatch", "SqliteFileWatch", "pg_listener_connect",
           "revision_watch"]

log = logging.getLogger("inferlb.live")

# (inode, size, mtime_ns) of one file, None when it does not exist (a -wal file between sessions).
FileSig = tuple[int, int, int] | None


@dataclass(frozen=True, slots=True)
class Mark:
    """What :meth:`RevisionWatch.due` saw: the cheap check's ``state`` and when (``at``, monotonic)."""

    state: Hashable
    at: float


class RevisionWatch:
    """The common part: a read is due when :meth:`state` differs from the last one seen, or
    ``reread_s`` passed since the last read. Subclasses say what ``state`` is."""

    kind = "poll"

    def __init__(self, *, clock: Clock, reread_s: float = 30.0) -> None:
        self.clock = clock
        self.reread_s = reread_s
        self._seen: Hashable = None
        self._seen_at: float | None = None
        self.reads = 0                    # marks handed back: reads the watch let through

    def state(self) -> Hashable:
        """What the cheap check sees now; a fresh ``object()`` means "unknown: read"."""
        return object()

    def due(self) -> Mark | None:
        """A mark when the revision should be read now, else None (module docstring)."""
        now = self.clock.monotonic()
        state = self.state()
        if self._seen_at is None or state != self._seen or now - self._seen_at >= self.reread_s:
            return Mark(state, now)
        return None

    def seen(self, mark: Mark) -> None:
        """The revision was read after ``mark`` was taken: what it saw is now known."""
        self._seen = mark.state
        self._seen_at = mark.at
        self.reads += 1

    async def wait(self, timeout_s: float) -> bool:
        """Sleep ``timeout_s``; True when cut short by news of a change (never, here)."""
        await asyncio.sleep(timeout_s)
        return False

    async def start(self) -> None:
        """Start what the watch runs in the background (nothing, here)."""

    async def close(self) -> None:
        """Stop it."""

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "reread_s": self.reread_s, "reads": self.reads}


class PollWatch(RevisionWatch):
    """Every poll reads (an in-memory SQLite, a database without a cheaper signal)."""


class SqliteFileWatch(RevisionWatch):
    """A SQLite file: a read is due when its or its ``-wal`` file's stat moved (module docstring).
    ``stat`` is injectable for tests (default :func:`os.stat`)."""

    kind = "sqlite-stat"

    def __init__(self, path: Path, *, clock: Clock, reread_s: float = 30.0,
                 stat: Callable[[str], os.stat_result] = os.stat) -> None:
        super().__init__(clock=clock, reread_s=reread_s)
        self.path = str(path)
        self.wal = f"{path}-wal"
        self._stat = stat

    def _sig(self, path: str) -> FileSig:
        try:
            st = self._stat(path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def state(self) -> Hashable:
        return (self._sig(self.path), self._sig(self.wal))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": self.path}


class PgNotifyWatch(RevisionWatch):
    """PostgreSQL: ``LISTEN`` on a connection of its own (module docstring). ``connect`` opens an
    autocommit ``psycopg.AsyncConnection``; ``sleep`` is the wait between reconnections
    (injectable for tests)."""

    kind = "postgresql-notify"

    def __init__(self, connect: Callable[[], Awaitable[AsyncConnection[Any]]], *, clock: Clock,
                 reread_s: float = 30.0, retry_s: float = 1.0, retry_max_s: float = 30.0,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 channel: str = REVISION_CHANNEL, what: str = "revision") -> None:
        super().__init__(clock=clock, reread_s=reread_s)
        self._connect = connect
        self.channel = channel              # the NOTIFY channel listened on (payload: the schema)
        self.what = what                    # how its log lines name it ("revision", "api keys")
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self._sleep = sleep
        self.listening = False
        self.backend_pid: int | None = None     # the listening connection's server process
        self.notes = 0                          # notifications and (re)connections heard
        self.connects = 0
        self.error: str | None = None
        self._wake = Wakeup()
        self._listener = Background(f"inferlb-{what.replace(' ', '-')}-listen", self._run, logger=log)

    def state(self) -> Hashable:
        # Not listening: nothing can be trusted, every poll reads.
        return self.notes if self.listening else object()

    def _moved(self) -> None:
        self.notes += 1
        self._wake.set()

    async def wait(self, timeout_s: float) -> bool:
        return await self._wake.wait(timeout_s)

    async def start(self) -> None:
        if not self._listener.started:
            self._listener.start()

    async def close(self) -> None:
        await self._listener.stop()
        self.listening = False

    async def _run(self) -> None:
        delay = self.retry_s
        while True:
            connects = self.connects
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # psycopg / OS errors: the server away, the connection killed
                error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
                if error != self.error:    # once per distinct problem, not every retry
                    log.warning("%s listener down, polling every poll until it is back: %s", self.what, error)
                self.error = error
            finally:
                self.listening = False
                self.backend_pid = None
            if self.connects != connects:
                delay = self.retry_s       # it was up: the first try to get it back comes soon
            await self._sleep(delay)
            delay = min(delay * 2.0, self.retry_max_s)

    async def _listen(self) -> None:
        conn = await self._connect()
        async with conn:
            # A channel is one of this code's constants (an identifier), never input.
            await conn.execute(f"LISTEN {self.channel}")
            row = await (await conn.execute("SELECT current_schema()")).fetchone()
            schema = str(row[0]) if row is not None and row[0] is not None else ""
            self.backend_pid = conn.info.backend_pid
            self.listening = True
            self.connects += 1
            if self.error is not None:
                log.info("%s listener back (LISTEN %s)", self.what, self.channel)
            self.error = None
            self._moved()                  # what was committed while nobody listened
            async for note in conn.notifies():
                if note.payload == schema:
                    self._moved()
        raise ConnectionError("the notification stream ended")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "listening": self.listening, "connects": self.connects,
                "error": self.error}


def pg_listener_connect(engine: Engine) -> Callable[[], Awaitable[AsyncConnection[Any]]]:
    """What opens a :class:`PgNotifyWatch`'s connection for a PostgreSQL ``engine``: an
    autocommit ``psycopg.AsyncConnection`` with the engine's parameters (host, database, user,
    schema search path)."""
    params = pg_connect_params(engine)

    async def connect() -> AsyncConnection[Any]:
        # The postgres extra: present whenever a PostgreSQL engine could be made.
        import psycopg

        return await psycopg.AsyncConnection.connect(autocommit=True, **params)

    return connect


def revision_watch(engine: Engine | None, *, clock: Clock, reread_s: float = 30.0) -> RevisionWatch:
    """The watch for ``engine`` (module docstring): SQLite file → stat, PostgreSQL → NOTIFY,
    anything else → poll."""
    if engine is None:
        return PollWatch(clock=clock, reread_s=reread_s)
    backend = engine.url.get_backend_name()
    if backend == "sqlite":
        path = sqlite_file(engine.url)
        if path is not None:
            return SqliteFileWatch(path, clock=clock, reread_s=reread_s)
    elif backend == "postgresql":
        return PgNotifyWatch(pg_listener_connect(engine), clock=clock, reread_s=reread_s)
    return PollWatch(clock=clock, reread_s=reread_s)
