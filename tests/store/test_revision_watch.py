"""The revision watch (store/revision_watch.py): a change committed through another engine
(another replica, ``inferlb fleet``) makes a read due, nothing else does, and a read that was not
handed back stays due.

* SQLite: the stat of the database file and its ``-wal`` (a real file, two engines);
* PostgreSQL: ``NOTIFY`` from the transaction that bumps the revision, on a real server; the
  listener's connection killed server-side falls back to polling, then reconnects and catches up;
* the safety re-read follows an injected clock; nothing here sleeps for time (waits for a
  notification are bounded by a hang guard, never asserted as durations).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from inferlb.store.db import make_engine, upgrade
from inferlb.store.overrides import NodeOverride, read_revision, save_override
from inferlb.store.revision_watch import (
    Mark,
    PgNotifyWatch,
    PollWatch,
    RevisionWatch,
    SqliteFileWatch,
    revision_watch,
)
from inferlb.types import ManualClock

HANG_GUARD_S = 20.0    # only a broken listener gets near this


def drained(name: str) -> NodeOverride:
    return NodeOverride(name, "file", {}, drained=True)


def take(watch: RevisionWatch) -> Mark:
    mark = watch.due()
    assert mark is not None
    return mark


def read_through(watch: RevisionWatch, engine: Engine) -> int | None:
    """What the live config's poll does (live/manager.py ``poll_once``): read only when due."""
    mark = watch.due()
    if mark is None:
        return None
    rev = read_revision(engine)
    watch.seen(mark)
    return rev


class CountSql:
    """Counts the statements ``engine`` sends."""

    def __init__(self, engine: Engine) -> None:
        self.n = 0
        event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, *_args: Any) -> None:
        self.n += 1


# ---------------------------------------------------------------------------------------- SQLite


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[tuple[Path, Engine, Engine]]:
    """(file, the replica's engine, another writer's engine) on one migrated SQLite file."""
    path = tmp_path / "audit.db"
    upgrade(f"sqlite:///{path}")
    mine, other = make_engine(f"sqlite:///{path}"), make_engine(f"sqlite:///{path}")
    yield path, mine, other
    mine.dispose()
    other.dispose()


def test_sqlite_reads_only_after_another_engine_committed(sqlite_db: tuple[Path, Engine, Engine]) -> None:
    path, mine, other = sqlite_db
    clock = ManualClock()
    watch = revision_watch(mine, clock=clock, reread_s=30.0)
    assert isinstance(watch, SqliteFileWatch) and watch.path == str(path.resolve())
    sql = CountSql(mine)
    assert read_through(watch, mine) == 0          # the first poll always reads
    # ... and so does the next one: the first connection created the -wal file.
    assert [read_through(watch, mine) for _ in range(3)] == [0, None, None]
    assert sql.n == 2
    for _ in range(20):                            # nothing changed: no SQL at all
        assert read_through(watch, mine) is None
    assert sql.n == 2
    save_override(other, "n1", drained("n1"))      # another replica / the CLI
    assert read_through(watch, mine) == 1
    assert read_through(watch, mine) is None
    save_override(other, "n1", None)
    save_override(other, "n2", drained("n2"))
    assert read_through(watch, mine) == 3
    assert [read_through(watch, mine) for _ in range(5)] == [None] * 5
    assert sql.n == 4 and watch.reads == 4


def test_sqlite_safety_reread_follows_the_clock(sqlite_db: tuple[Path, Engine, Engine]) -> None:
    _path, mine, _other = sqlite_db
    clock = ManualClock()
    watch = revision_watch(mine, clock=clock, reread_s=30.0)
    assert [read_through(watch, mine) for _ in range(3)] == [0, 0, None]   # (the -wal created)
    clock.advance(29.9)
    assert watch.due() is None
    clock.advance(0.1)
    assert read_through(watch, mine) == 0          # re-read although nothing moved
    assert watch.due() is None


def test_a_read_not_handed_back_stays_due(sqlite_db: tuple[Path, Engine, Engine]) -> None:
    _path, mine, other = sqlite_db
    watch = revision_watch(mine, clock=ManualClock())
    assert [read_through(watch, mine) for _ in range(3)] == [0, 0, None]   # (the -wal created)
    save_override(other, "n1", drained("n1"))
    first = watch.due()
    assert first is not None                       # the read fails: seen() is not called
    again = watch.due()
    assert again is not None and again.state == first.state
    watch.seen(again)
    assert watch.due() is None


def test_sqlite_stat_sees_the_wal_and_the_main_file(tmp_path: Path) -> None:
    """A commit in WAL mode grows the ``-wal``; a checkpoint rewrites the main file: both move the state."""
    stats: dict[str, tuple[int, int, int]] = {}

    class St:
        def __init__(self, ino: int, size: int, mtime: int) -> None:
            self.st_ino, self.st_size, self.st_mtime_ns = ino, size, mtime

    def stat(path: str) -> Any:
        if path not in stats:
            raise FileNotFoundError(path)
        return St(*stats[path])

    db = tmp_path / "x.db"
    watch = SqliteFileWatch(db, clock=ManualClock(), stat=stat)
    stats[str(db)] = (1, 4096, 10)
    mark = watch.due()
    assert mark is not None
    watch.seen(mark)
    assert watch.due() is None
    stats[f"{db}-wal"] = (2, 8192, 11)             # a -wal appears: a commit
    assert watch.due() is not None
    watch.seen(take(watch))
    stats[f"{db}-wal"] = (2, 8192, 12)             # same size, later mtime (a WAL restarted from the top)
    assert watch.due() is not None
    watch.seen(take(watch))
    stats[str(db)] = (3, 4096, 12)                 # the file replaced (a restore): new inode
    assert watch.due() is not None


def test_in_memory_sqlite_polls() -> None:
    engine = make_engine("sqlite://")
    try:
        watch = revision_watch(engine, clock=ManualClock())
        assert isinstance(watch, PollWatch)
        watch.seen(take(watch))
        assert watch.due() is not None             # no file to look at: every poll reads
    finally:
        engine.dispose()


async def test_the_listener_falls_back_to_polling_and_backs_off_while_it_cannot_connect() -> None:
    sleeps: list[float] = []
    tried = asyncio.Event()

    async def connect() -> Any:
        raise OSError("connection refused")

    async def sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 6:
            tried.set()
            await asyncio.Event().wait()           # park here until closed

    watch = PgNotifyWatch(connect, clock=ManualClock(), retry_s=1.0, retry_max_s=8.0, sleep=sleep)
    await watch.start()
    try:
        await asyncio.wait_for(tried.wait(), HANG_GUARD_S)
        assert sleeps == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
        assert not watch.listening and watch.error == "OSError: connection refused"
        for _ in range(3):                         # every poll reads while nobody listens
            mark = watch.due()
            assert mark is not None
            watch.seen(mark)
    finally:
        await watch.close()


# ------------------------------------------------------------------------------------ PostgreSQL


@pytest.fixture
def pg_url(pg_migrated_url: str) -> str:
    engine = make_engine(pg_migrated_url)
    try:
        with engine.begin() as conn:   # the schema lives for the session
            conn.execute(text("DELETE FROM node_overrides"))
            conn.execute(text("DELETE FROM fleet_revision"))
    finally:
        engine.dispose()
    return pg_migrated_url


@pytest.fixture
def pg_engines(pg_url: str) -> Iterator[tuple[Engine, Engine]]:
    mine, other = make_engine(pg_url), make_engine(pg_url)
    yield mine, other
    mine.dispose()
    other.dispose()


async def next_news(watch: RevisionWatch) -> None:
    """Wait for the watch to hear something (bounded by the hang guard, not asserted as time)."""
    assert await watch.wait(HANG_GUARD_S), "no notification within the hang guard"


@pytest.mark.postgres
async def test_postgres_notify_makes_a_read_due(pg_engines: tuple[Engine, Engine]) -> None:
    mine, other = pg_engines
    watch = revision_watch(mine, clock=ManualClock(), reread_s=3600.0)
    assert isinstance(watch, PgNotifyWatch)
    sql = CountSql(mine)
    await watch.start()
    try:
        await next_news(watch)                     # connected and listening: one catch-up read due
        assert watch.listening
        assert await asyncio.to_thread(read_through, watch, mine) == 0
        assert [watch.due() for _ in range(20)] == [None] * 20
        assert sql.n == 1
        await asyncio.to_thread(save_override, other, "n1", drained("n1"))
        await next_news(watch)
        assert await asyncio.to_thread(read_through, watch, mine) == 1
        assert watch.due() is None
        assert sql.n == 2
    finally:
        await watch.close()


@pytest.mark.postgres
async def test_postgres_ignores_other_schemas(pg_engines: tuple[Engine, Engine], pg_schema_factory: Any) -> None:
    mine, other = pg_engines
    foreign_url = pg_schema_factory()
    upgrade(foreign_url)
    foreign = make_engine(foreign_url)
    watch = revision_watch(mine, clock=ManualClock(), reread_s=3600.0)
    await watch.start()
    try:
        await next_news(watch)
        assert await asyncio.to_thread(read_through, watch, mine) == 0
        assert isinstance(watch, PgNotifyWatch)
        before = watch.notes
        await asyncio.to_thread(save_override, foreign, "n1", drained("n1"))   # another deployment
        await asyncio.to_thread(save_override, other, "n2", drained("n2"))
        await next_news(watch)
        # Notifications arrive in commit order: when this schema's came, the other's had been seen.
        assert watch.notes == before + 1
        assert await asyncio.to_thread(read_through, watch, mine) == 1
    finally:
        await watch.close()
        foreign.dispose()


@pytest.mark.postgres
async def test_postgres_listener_killed_polls_then_reconnects(pg_engines: tuple[Engine, Engine],
                                                             pg_admin: Engine) -> None:
    mine, other = pg_engines
    down = asyncio.Event()
    back = asyncio.Event()
    waits: list[float] = []

    async def sleep(s: float) -> None:             # the test decides when the listener retries
        waits.append(s)
        down.set()
        await back.wait()

    from inferlb.store.db import pg_connect_params

    params = pg_connect_params(mine)

    async def connect() -> Any:
        import psycopg

        return await psycopg.AsyncConnection.connect(autocommit=True, **params)

    watch = PgNotifyWatch(connect, clock=ManualClock(), reread_s=3600.0, retry_s=1.0, sleep=sleep)
    await watch.start()
    try:
        await next_news(watch)
        assert await asyncio.to_thread(read_through, watch, mine) == 0
        assert watch.due() is None
        pid = watch.backend_pid
        assert pid is not None
        with pg_admin.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
        await asyncio.wait_for(down.wait(), HANG_GUARD_S)
        assert not watch.listening and watch.error is not None and waits == [1.0]
        # Disconnected: every poll reads, so a change is still picked up at the next one.
        assert await asyncio.to_thread(read_through, watch, mine) == 0
        await asyncio.to_thread(save_override, other, "n1", drained("n1"))
        assert await asyncio.to_thread(read_through, watch, mine) == 1
        assert watch.due() is not None
        back.set()                                 # reconnect: one catch-up read, then quiet again
        await next_news(watch)
        assert watch.listening and watch.backend_pid not in (None, pid) and watch.connects == 2
        assert await asyncio.to_thread(read_through, watch, mine) == 1
        assert watch.due() is None
        await asyncio.to_thread(save_override, other, "n2", drained("n2"))
        await next_news(watch)
        assert await asyncio.to_thread(read_through, watch, mine) == 2
    finally:
        await watch.close()
