"""Node events in the database (SQLite and PostgreSQL): migration 0003, the writer, the queries."""

from __future__ import annotations

import asyncio

from sqlalchemy import inspect, text

from inferlb.node_types import NodeEvent
from inferlb.store.db import downgrade, make_engine, migrations_dir, upgrade
from inferlb.store.events import EventWriter, recent_events
from inferlb.store.schema import NODE_EVENTS
from inferlb.types import ManualClock

T0 = 1_767_225_600.0


def ev(i: int, node: str = "gpu-a", **kw: object) -> NodeEvent:
    base: dict[str, object] = {"node": node, "from_state": "healthy", "to_state": "ejected",
                               "reason": f"5 consecutive gateway-side failures #{i}", "at": T0 + i + 0.123456,
                               "evidence": {"rule": "consecutive_failures", "ejection_s": 30.0, "i": i}}
    base.update(kw)
    return NodeEvent(**base)  # type: ignore[arg-type]


def _head() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from inferlb.store.db import migrations_dir

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


def test_migration_0003_creates_the_table_the_code_uses(fresh_db: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import MetaData

    upgrade(fresh_db)
    engine = make_engine(fresh_db)
    try:
        with engine.connect() as conn:
            assert "node_events" in inspect(conn).get_table_names()
            # at the head revision, whichever migration that is (not a fixed id: later ones follow)
            from alembic.config import Config
            from alembic.script import ScriptDirectory

            cfg = Config()
            cfg.set_main_option("script_location", str(migrations_dir()))
            head = ScriptDirectory.from_config(cfg).get_current_head()
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == head
            only = MetaData()
            NODE_EVENTS.to_metadata(only)
            diff = [d for d in compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), only)
                    if "node_events" in repr(d)]
            assert diff == []
            assert {ix["name"] for ix in inspect(conn).get_indexes("node_events")} == {
                "ix_node_events_node", "ix_node_events_at"}
        downgrade(fresh_db, "0002")
        with engine.connect() as conn:
            assert "node_events" not in inspect(conn).get_table_names()
        upgrade(fresh_db)
    finally:
        engine.dispose()


async def test_writer_persists_and_queries_newest_first(fresh_db: str) -> None:
    upgrade(fresh_db)
    engine = make_engine(fresh_db)
    w = EventWriter(engine)
    try:
        w.submit([ev(1), ev(2, node="gpu-b", to_state="down"), ev(3, reason="bad\x00byte")])
        assert await w.flush_once() == 3
        rows = recent_events(engine)
        assert [r["evidence"]["i"] for r in rows] == [3, 2, 1]
        assert rows[0]["reason"] == "bad\ufffdbyte"                 # PostgreSQL refuses NUL in text
        assert rows[2] == {"id": rows[2]["id"], "at": T0 + 1.123456, "node": "gpu-a", "from": "healthy",
                           "to": "ejected", "reason": "5 consecutive gateway-side failures #1",
                           "evidence": {"rule": "consecutive_failures", "ejection_s": 30.0, "i": 1}}
        assert [r["to"] for r in recent_events(engine, node="gpu-b")] == ["down"]
        assert [r["evidence"]["i"] for r in recent_events(engine, since=T0 + 2)] == [3, 2]
        assert [r["evidence"]["i"] for r in recent_events(engine, limit=1)] == [3]
    finally:
        await w.close()
        engine.dispose()


async def test_a_database_failure_keeps_the_events_and_retries_with_backoff(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/late.db"
    engine = make_engine(url)                 # not migrated yet: "no such table"
    clock = ManualClock()
    w = EventWriter(engine, clock=clock, retry_base_s=2.0)
    try:
        w.submit([ev(1), ev(2)])
        assert await w.flush_once() == 0
        assert w.backlog()["pending"] == 2 and w.backlog()["consecutive_failures"] == 1
        upgrade(url)
        assert await w.flush_once() == 0      # still backing off (2 s, timed by the injected clock)
        clock.advance(2.0)
        assert await w.flush_once() == 2
        assert w.backlog() == {"pending": 0, "spooled": 0, "written": 2, "dropped": 0, "consecutive_failures": 0,
                               "last_error": w.backlog()["last_error"]}
        assert len(recent_events(engine)) == 2
    finally:
        await w.close()
        engine.dispose()


async def test_the_queue_is_bounded_and_counts_what_it_drops(tmp_path: object) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/x.db")
    w = EventWriter(engine, max_pending=3)
    w.submit([ev(i) for i in range(5)])
    assert w.backlog()["pending"] == 3 and w.dropped == 2
    engine.dispose()


async def test_with_a_journal_failed_events_are_spooled_not_held_and_survive_a_restart(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/late.db"
    journal = f"{tmp_path}/journal"
    engine = make_engine(url)                 # not migrated yet: every write fails
    clock = ManualClock()
    w = EventWriter(engine, clock=clock, journal_dir=journal, max_pending=2)
    await w.start()
    try:
        w.submit([ev(1), ev(2)])
        assert await w.flush_once() == 0
        w.submit([ev(3), ev(4)])
        assert await w.flush_once() == 0       # backing off: spooled at once, nothing held in memory
        assert w.backlog()["pending"] == 0 and w.backlog()["spooled"] == 4 and w.dropped == 0
    finally:
        await w.close(timeout_s=2)             # the database is still away: the spool keeps them
    upgrade(url)
    again = EventWriter(engine, clock=clock, journal_dir=journal)
    await again.start()                        # adopts the spool of the writer that went away
    try:
        assert await again.flush_once() == 4
        assert [r["evidence"]["i"] for r in recent_events(engine)] == [4, 3, 2, 1]
        assert again.backlog()["spooled"] == 0
    finally:
        await again.close()


async def test_an_idle_event_writer_parks_until_a_submit(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/idle.db"
    upgrade(url)
    engine = make_engine(url)
    # A 1 µs interval: a task that did not park would run a round on nearly every pass.
    w = EventWriter(engine, flush_interval_s=1e-6)
    await w.start()
    try:
        for _ in range(200):
            await asyncio.sleep(0)
        assert w.flush_rounds == 0
        w.submit([ev(1)])
        for _ in range(200):                     # the submit wakes the task at once
            if w.flush_rounds:
                break
            await asyncio.sleep(0)
        assert w.flush_rounds == 1
        assert await w.flush_once() == 0         # waits for the task's flush (one lock), nothing left
        assert w.written == 1 and len(recent_events(engine)) == 1
        rounds = w.flush_rounds
        for _ in range(200):
            await asyncio.sleep(0)
        assert w.flush_rounds == rounds          # nothing pending again: parked
    finally:
        await w.close()
        engine.dispose()
