"""AuditWriter: round trip, idempotent upsert, outage → journal → drain, replay, close, quarantine."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from inferlb.store.db import is_sqlite, make_engine
from inferlb.store.journal import QUARANTINE_FILE, dump_record
from inferlb.store.queries import get_request
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.store.writer import AuditWriter
from inferlb.types import ManualClock

MakeRecord = Callable[..., RequestRecord]
RowsIn = Callable[..., int]


def _writer(engine: Engine, journal: Path, clock: ManualClock | None = None, **kw: Any) -> AuditWriter:
    kw.setdefault("batch_size", 4)
    return AuditWriter(engine, journal_dir=journal, flush_interval_s=0.05, clock=clock or ManualClock(), **kw)


def _journal_lines(journal: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in journal.glob("audit-*.jsonl"))


@contextlib.contextmanager
def _table_missing(engine: Engine) -> Iterator[None]:
    """A real outage of the requests table (renamed away), restored even when the test fails."""
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE requests RENAME TO requests_away"))
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE requests_away RENAME TO requests"))


def _broken_engine(engine: Engine, tmp_path: Path) -> Engine:
    """A real engine whose connections fail: a closed port, or a SQLite file in a missing directory."""
    if engine.dialect.name == "sqlite":
        return make_engine(f"sqlite:///{tmp_path / 'no-such-dir' / 'audit.db'}")
    return make_engine("postgresql+psycopg://postgres@127.0.0.1:1/test?connect_timeout=2")


async def test_round_trip_keeps_every_field_and_microseconds(
    engine: Engine, tmp_path: Path, make_record: MakeRecord
) -> None:
    rec = make_record(1)
    w = _writer(engine, tmp_path / "j")
    await w.start(background=False)
    w.submit(rec)
    assert await w.flush_once() == 1
    got = get_request(engine, rec.request_id)
    assert got is not None
    want = rec.to_json()
    for key, value in want.items():
        if key != "attempts":
            assert got[key] == value, key
    assert got["attempts"] == want["attempts"]
    assert got["received_at"] == 1_767_225_601.123457  # µs survive exactly
    assert got["e2e_ms"] == 900.009 and got["ttft_ms"] == 150.001
    assert got["attempt_count"] == 2
    assert w.backlog()["records_written"] == 1 and w.backlog()["pending"] == 0
    await w.close()


async def test_same_request_twice_is_one_row_and_last_version_wins(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    w = _writer(engine, tmp_path / "j")
    await w.start(background=False)
    first = make_record(1, status="unknown")
    w.submit(first)
    await w.flush_once()
    final = dataclasses.replace(first, status="upstream_error", attempts=first.attempts[:1])
    w.submit(final)
    w.submit(final)  # twice in one batch as well
    assert await w.flush_once() == 2
    assert rows_in(engine) == 1
    assert rows_in(engine, "request_attempts") == 1
    got = get_request(engine, first.request_id)
    assert got is not None and got["status"] == "upstream_error" and got["attempt_count"] == 1
    await w.close()


async def test_outage_spools_to_journal_then_drains_exactly(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    clock = ManualClock()
    journal = tmp_path / "j"
    w = _writer(engine, journal, clock)
    await w.start(background=False)
    with _table_missing(engine):  # every write fails for real
        for i in range(10):
            w.submit(make_record(i))
        assert await w.flush_once() == 0
        b = w.backlog()
        assert (b["pending"], b["spooled"], b["failed_flushes"], b["healthy"]) == (0, 10, 1, False)
        assert b["last_error"] and b["next_retry_in_s"] == pytest.approx(0.5)
        assert _journal_lines(journal) == 10  # durable before any retry

        for i in range(10, 13):
            w.submit(make_record(i))
        assert await w.flush_once() == 0  # backing off: no database try, but spooled at once
        assert w.backlog()["failed_flushes"] == 1 and w.backlog()["spooled"] == 13

    assert await w.flush_once() == 0  # the table is back, but we are still inside the backoff window
    clock.advance(0.5)
    assert await w.flush_once() == 13
    b = w.backlog()
    assert (b["pending"], b["spooled"], b["records_written"], b["records_dropped"]) == (0, 0, 13, 0)
    assert b["healthy"] and b["consecutive_failures"] == 0
    assert rows_in(engine) == 13 and rows_in(engine, "request_attempts") == 26
    assert _journal_lines(journal) == 0  # truncated after the drain
    await w.close()
    assert list(journal.glob("audit-*")) == []


async def test_backoff_doubles_and_is_capped(engine: Engine, tmp_path: Path, make_record: MakeRecord) -> None:
    clock = ManualClock()
    w = _writer(_broken_engine(engine, tmp_path), tmp_path / "j", clock, retry_base_s=0.5, retry_max_s=3.0)
    await w.start(background=False)
    w.submit(make_record(1))
    delays = []
    for _ in range(5):
        await w.flush_once()
        delays.append(w.backlog()["next_retry_in_s"])
        clock.advance(delays[-1])
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert w.backlog()["failed_flushes"] == 5 and w.backlog()["spooled"] == 1
    await w.close(timeout_s=5)


async def test_journal_survives_restart_and_is_replayed(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    journal = tmp_path / "j"
    down = _writer(_broken_engine(engine, tmp_path), journal)
    await down.start(background=False)
    for i in range(6):
        down.submit(make_record(i))
    await down.flush_once()
    down.submit(make_record(6))
    await down.close(timeout_s=5)  # cannot reach the database: spools the rest
    assert down.backlog()["records_dropped"] == 0
    assert _journal_lines(journal) == 7 and rows_in(engine) == 0

    up = _writer(engine, journal)
    await up.start(background=False)  # adopts the orphan journal and replays it
    assert rows_in(engine) == 7
    assert up.backlog()["records_written"] == 7 and up.backlog()["spooled"] == 0
    await up.close()
    assert list(journal.glob("audit-*")) == []


async def test_live_journal_is_not_adopted_and_torn_tail_is_skipped(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    journal = tmp_path / "j"
    live = _writer(_broken_engine(engine, tmp_path), journal)
    await live.start(background=False)
    live.submit(make_record(1))
    await live.flush_once()
    # A crashed process's journal: two whole lines and one cut by the crash.
    orphan = journal / "audit-999999-deadbeef.jsonl"
    orphan.write_bytes(dump_record(make_record(2)) + dump_record(make_record(3)) + b'{"request_id": "req-')

    other = _writer(engine, journal)
    await other.start(background=False)
    assert rows_in(engine) == 2  # the orphan's two records; the live writer's file is left alone
    assert other.backlog()["journal_corrupt_lines"] == 1
    assert not orphan.exists()
    assert live.backlog()["spooled"] == 1
    await other.close()
    await live.close(timeout_s=5)


async def test_close_flushes_everything(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    w = _writer(engine, tmp_path / "j", batch_size=100)
    await w.start()  # background task running, interval far from reached
    for i in range(7):
        w.submit(make_record(i))
    await w.close(timeout_s=10)
    assert rows_in(engine) == 7
    b = w.backlog()
    assert (b["pending"], b["spooled"], b["records_written"]) == (0, 0, 7)
    w.submit(make_record(99))  # after close: cannot be stored, and says so
    assert w.backlog()["records_dropped"] == 1


async def test_background_task_flushes_a_full_batch(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    w = AuditWriter(engine, journal_dir=tmp_path / "j", batch_size=3, flush_interval_s=3600)
    await w.start()
    for i in range(3):
        w.submit(make_record(i))  # the third wakes the task; the hour-long interval never elapses
    assert await w.wait_caught_up(10)
    assert rows_in(engine) == 3
    await w.close()


async def test_a_record_the_database_rejects_is_quarantined_not_blocking(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    journal = tmp_path / "j"
    w = _writer(engine, journal)
    await w.start(background=False)
    w.submit(make_record(1))
    w.submit(make_record(2, prompt_tokens=10**20))  # out of range for BIGINT on both databases
    w.submit(make_record(3))
    assert await w.flush_once() == 2
    assert rows_in(engine) == 2
    b = w.backlog()
    assert (b["quarantined"], b["pending"], b["spooled"], b["records_dropped"]) == (1, 0, 0, 0)
    kept = [json.loads(line) for line in (journal / QUARANTINE_FILE).read_text().splitlines()]
    assert [k["record"]["request_id"] for k in kept] == ["req-00002"] and kept[0]["error"]
    await w.close()


async def test_nul_and_nan_are_cleaned_not_failing(
    engine: Engine, tmp_path: Path, make_record: MakeRecord
) -> None:
    rec = make_record(1, model_requested="llama\x00-8b", tags={"k": "x\x00y", "score": float("nan")},
                      decision={"why": ["\x00"]})
    w = _writer(engine, tmp_path / "j")
    await w.start(background=False)
    w.submit(rec)
    assert await w.flush_once() == 1
    got = get_request(engine, rec.request_id)
    assert got is not None
    assert got["model_requested"] == "llama\ufffd-8b"
    assert got["tags"] == {"k": "x\ufffdy", "score": None} and got["decision"] == {"why": ["\ufffd"]}
    await w.close()


async def test_ordering_kept_across_journal_and_memory(
    engine: Engine, tmp_path: Path, make_record: MakeRecord
) -> None:
    clock = ManualClock()
    w = _writer(engine, tmp_path / "j", clock)
    await w.start(background=False)
    start = make_record(1, status="unknown", last_byte_at=None, attempts=[])
    with _table_missing(engine):
        w.submit(start)
        await w.flush_once()  # start row spooled
    done = make_record(1, attempts=[AttemptRecord(1, "gpu-a", "llama-8b", started_at=start.received_at)])
    w.submit(done)  # completion in memory, behind the spooled start row
    clock.advance(1)
    assert await w.flush_once() == 2
    got = get_request(engine, start.request_id)
    assert got is not None and got["status"] == "ok" and got["attempt_count"] == 1
    await w.close()


def test_is_sqlite_matches_fixture(db_url: str, engine: Engine) -> None:
    assert is_sqlite(db_url) == (engine.dialect.name == "sqlite")


async def test_close_without_start_still_stores(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    w = _writer(engine, tmp_path / "j")
    w.submit(make_record(1))
    await w.close()
    assert rows_in(engine) == 1 and w.backlog()["records_dropped"] == 0


async def test_wait_caught_up_reports_a_backlog_it_cannot_clear(
    engine: Engine, tmp_path: Path, make_record: MakeRecord
) -> None:
    w = _writer(_broken_engine(engine, tmp_path), tmp_path / "j")
    await w.start(background=False)  # no task: nothing will drain it
    w.submit(make_record(1))
    await w.flush_once()
    assert w.backlog()["spooled"] == 1
    assert await w.wait_caught_up(0.01) is False
    await w.close(timeout_s=5)


async def test_postgres_connections_killed_between_flushes_are_replaced(
    request: pytest.FixtureRequest, engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("server-side connection kill is a PostgreSQL scenario")
    admin: Engine = request.getfixturevalue("pg_admin")
    w = _writer(engine, tmp_path / "j")
    await w.start(background=False)
    w.submit(make_record(1))
    assert await w.flush_once() == 1
    app_name = engine.url.query["application_name"]
    with admin.begin() as conn:  # what a server restart does to the pooled connections
        killed = conn.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                   "WHERE application_name = :a"), {"a": app_name}).scalar_one()
    assert killed >= 1
    w.submit(make_record(2))
    assert await w.flush_once() == 1  # pre-ping replaced the dead connection: no failed flush
    assert w.backlog()["failed_flushes"] == 0 and rows_in(engine) == 2
    await w.close()


async def test_a_lone_bad_record_is_quarantined_but_a_missing_table_never_is(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    w = _writer(engine, tmp_path / "j")
    await w.start(background=False)
    w.submit(make_record(1, http_status=10**20))  # alone in its batch; fits neither database
    assert await w.flush_once() == 0
    assert w.backlog()["quarantined"] == 1 and w.backlog()["failed_flushes"] == 0
    with _table_missing(engine):
        for i in range(2, 5):
            w.submit(make_record(i))
        assert await w.flush_once() == 0
        b = w.backlog()
        assert (b["quarantined"], b["spooled"], b["failed_flushes"]) == (1, 3, 1)
    assert await w.flush_once(force=True) == 3
    assert rows_in(engine) == 3
    await w.close()


async def _spin(passes: int = 200) -> None:
    for _ in range(passes):
        await asyncio.sleep(0)


async def test_an_idle_writer_parks_instead_of_waking_every_interval(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    # A 1 µs interval: a flush task that did not park would run a round on nearly every pass.
    w = AuditWriter(engine, journal_dir=tmp_path / "j", flush_interval_s=1e-6, clock=ManualClock())
    await w.start()
    try:
        await _spin()
        assert w.flush_rounds == 0
        w.submit(make_record(1))                 # one record, far from a full batch: still written
        assert await w.wait_caught_up(10)
        assert rows_in(engine) == 1 and w.flush_rounds >= 1
        await _spin(5)
        rounds = w.flush_rounds
        await _spin()
        assert w.flush_rounds == rounds          # nothing pending again: parked
    finally:
        await w.close()
