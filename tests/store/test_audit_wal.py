"""The audit write-ahead log: crash recovery (a real SIGKILL), segments, and the writer's limits:
a hung database, a journal that cannot be written, the high-water mark."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine, make_url

from inferlb.errors import AuditUnavailable
from inferlb.store import journal as journal_mod
from inferlb.store import wal as wal_mod
from inferlb.store.db import make_engine, upgrade
from inferlb.store.queries import get_request
from inferlb.store.records import RequestRecord
from inferlb.store.wal import Wal, recover, start_entry
from inferlb.store.writer import AuditWriter
from inferlb.types import ManualClock
from tests.store.conftest import count_rows
from tests.store.test_audit_writer import _table_missing
from tests.support import ROOT

MakeRecord = Callable[..., RequestRecord]
RowsIn = Callable[..., int]

_CRASHER = r"""
import asyncio, os, signal, sys
sys.path.insert(0, sys.argv[3])
from tests.store.conftest import _record
from inferlb.store.db import make_engine, upgrade
from inferlb.store.writer import AuditWriter

async def main():
    # An hour-long flush interval: nothing reaches the database; only the write-ahead log has them.
    w = AuditWriter(make_engine(sys.argv[1]), journal_dir=sys.argv[2], flush_interval_s=3600)
    await w.start()
    for i in range(1, 5):   # started under process p-7 and config c0ffee123456 (what gateway.py stamps)
        await w.begin(_record(i, status="unknown", last_byte_at=None, attempts=[], process_version="p-7",
                              config_version="c0ffee123456"))
    w.submit(_record(1))                 # finished
    w.submit(_record(5))                 # finished without a start entry (e.g. rejected input)
    await w.begin(_record(6, status="unknown", last_byte_at=None, attempts=[]))  # commits the group
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def _kill_a_writer(db_url: str, journal: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _CRASHER, db_url, str(journal), str(ROOT)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr


async def test_sigkill_loses_nothing_finished_and_marks_the_rest_unknown_outcome(
    engine: Engine, db_url: str, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    journal = tmp_path / "j"
    _kill_a_writer(db_url, journal)
    assert rows_in(engine) == 0 and list(journal.glob("wal-*.log"))
    # Request 2 had reached the database by another way (e.g. a previous flush): it keeps its row.
    w0 = AuditWriter(engine, journal_dir=tmp_path / "other")
    await w0.start(background=False)
    w0.submit(make_record(2, status="upstream_error"))
    await w0.flush_once()
    await w0.close()

    w = AuditWriter(engine, journal_dir=journal, clock=ManualClock())
    await w.start(background=False)
    assert rows_in(engine) == 6
    status = {i: (get_request(engine, f"req-{i:05d}") or {}).get("status") for i in range(1, 7)}
    assert status == {1: "ok", 2: "upstream_error", 3: "unknown_outcome", 4: "unknown_outcome", 5: "ok",
                      6: "unknown_outcome"}
    got = get_request(engine, "req-00003")
    assert got is not None and got["endpoint"] == "chat" and got["tenant"] == "acme"
    # The start entry carries the versions the request started under, so the rebuilt row has them.
    assert (got["process_version"], got["config_version"]) == ("p-7", "c0ffee123456")
    assert w.backlog()["records_recovered"] == 6   # 1 and 5 finished; 2, 3, 4 and 6 unfinished
    assert all(p.name.startswith(f"wal-{os.getpid()}-") for p in journal.glob("wal-*.log"))  # orphans gone
    await w.close()
    assert list(journal.glob("wal-*.log")) == [] and list(journal.glob("audit-*")) == []


def test_segments_rotate_carry_open_starts_and_are_deleted_once_released(
    tmp_path: Path, make_record: MakeRecord
) -> None:
    wal = Wal(tmp_path, segment_bytes=1)       # every write after the first starts a new segment
    assert wal.open().records == []
    a, b = make_record(1), make_record(2)
    wal.write([(a.request_id, start_entry(a)), (b.request_id, start_entry(b))], [])
    seq = wal.write([], [a])                   # rotates: segment 1 starts with both starts, then a
    assert seq == 1 and wal.stats()["segments"] == 1   # segment 0 was needed by nobody any more
    wal.write([], [])                          # rotates again: segment 2 carries b's start only
    assert wal.stats()["segments"] == 2        # segment 1 holds a, not yet released
    wal.release(1)
    assert wal.collect() == 1 and wal.stats()["segments"] == 1
    # A crash now: only the last segment is left, and it still knows b was in flight.
    files = sorted(tmp_path.glob("wal-*.log"))
    assert len(files) == 1
    rec = recover(files)
    assert [(r.request_id, r.status) for r in rec.records] == [("req-00002", "unknown_outcome")]
    wal.close()                                # b still in flight: the segment is kept
    assert len(list(tmp_path.glob("wal-*.log"))) == 1


def test_a_recovered_start_keeps_its_versions_and_an_old_entry_without_them_still_recovers(
    tmp_path: Path, make_record: MakeRecord
) -> None:
    a = make_record(1, process_version="p-3", config_version="abc123def456")
    p = tmp_path / "wal-1-x-00000000.log"
    old = json.dumps({"k": "s", "id": "req-00002", "t": a.received_at, "e": "chat", "m": "llama-8b"}) + "\n"
    p.write_bytes(start_entry(a) + old.encode())      # no end for either: both were in flight
    rec = recover([p])
    got = {r.request_id: (r.status, r.process_version, r.config_version) for r in rec.records}
    assert got == {"req-00001": ("unknown_outcome", "p-3", "abc123def456"),
                   "req-00002": ("unknown_outcome", None, None)}


def test_recover_skips_a_torn_line_and_lets_the_last_version_win(tmp_path: Path, make_record: MakeRecord) -> None:
    a = make_record(1)
    first = json.dumps({"k": "f", "r": make_record(1, status="upstream_error").to_json()}) + "\n"
    last = json.dumps({"k": "f", "r": a.to_json()}) + "\n"
    p = tmp_path / "wal-1-x-00000000.log"
    p.write_bytes(start_entry(a) + first.encode() + last.encode() + b'{"k":"s","id":"cut')
    rec = recover([p])
    assert [(r.request_id, r.status) for r in rec.records] == [("req-00001", "ok")]
    assert (rec.finished, rec.unknown, rec.corrupt_lines) == (1, 0, 1)


# -- a database that hangs (item: connection open, no replies) ----------------------------------------


@pytest.fixture
def hung_db_url() -> Iterator[str]:
    """A PostgreSQL URL whose server accepts connections and never sends a byte."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.05)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    port = srv.getsockname()[1]
    yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/test"
    stop.set()
    t.join()
    for c in held:   # the hung calls now fail at once, and their thread ends
        c.close()
    srv.close()


async def test_a_hung_database_is_bounded_spooled_and_reported(
    hung_db_url: str, tmp_path: Path, make_record: MakeRecord
) -> None:
    engine = make_engine(hung_db_url, connect_timeout_s=30)   # the writer's bound must act first
    clock = ManualClock()
    w = AuditWriter(engine, journal_dir=tmp_path / "j", clock=clock, db_timeout_s=0.2, batch_size=4)
    await w.start(background=False)
    for i in range(3):
        w.submit(make_record(i))
    assert await w.flush_once() == 0           # returns after db_timeout_s, not after 30 s
    b = w.backlog()
    assert (b["pending"], b["spooled"], b["healthy"], b["state"]) == (0, 3, False, "degraded")
    assert "did not answer within 0.2s" in b["reason"]
    assert b["accepting"]                       # below the high-water mark: still serving
    w.submit(make_record(9))
    assert await w.flush_once(force=True) == 0  # the hung call still holds the database thread
    assert "has not returned" in w.backlog()["last_error"] and w.backlog()["spooled"] == 4
    await w.close(timeout_s=1)
    assert w.backlog()["records_dropped"] == 0
    engine.dispose()


class _Proxy:
    """A TCP relay to PostgreSQL that can stop forwarding (the server hangs, connections stay open)."""

    def __init__(self, port: int) -> None:
        self.port, self.target = 0, port
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> _Proxy:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", self.target)
        self.writers += [w, uw]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    await self.flowing.wait()      # hung: hold every byte, answer nothing
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(r, uw), pipe(ur, w))

    def reset_all(self) -> None:
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.reset_all()
        self.flowing.set()
        if self.server is not None:
            self.server.close()


@pytest.mark.postgres
async def test_a_database_that_hangs_on_a_pooled_connection_is_bounded_then_recovers(
    request: pytest.FixtureRequest, tmp_path: Path, make_record: MakeRecord
) -> None:
    url = make_url(request.getfixturevalue("pg_schema_factory")())
    upgrade(url)
    proxy = await _Proxy(url.port or 5432).start()
    engine = make_engine(url.set(port=proxy.port))
    w = AuditWriter(engine, journal_dir=tmp_path / "j", clock=ManualClock(), db_timeout_s=0.3)
    try:
        await w.start(background=False)
        w.submit(make_record(1))
        assert await w.flush_once() == 1           # the pool now holds an open connection
        proxy.flowing.clear()                      # the server stops answering; the connection stays open
        w.submit(make_record(2))
        assert await w.flush_once(force=True) == 0
        b = w.backlog()
        assert (b["spooled"], b["state"]) == (1, "degraded") and "did not answer within 0.3s" in b["reason"]
        proxy.reset_all()                          # e.g. the server restarts: the hung call fails
        proxy.flowing.set()
        busy = w._batches._busy                    # the call left running on the database thread
        assert busy is not None
        await asyncio.wait_for(asyncio.shield(busy), 30)
        assert await w.flush_once(force=True) == 1
        assert w.backlog()["state"] == "ok" and w.backlog()["spooled"] == 0
        direct = make_engine(url)
        assert count_rows(direct) == 2
        direct.dispose()
    finally:
        await w.close(timeout_s=2)
        await proxy.close()
        engine.dispose()


@pytest.mark.postgres
def test_postgres_connections_get_a_statement_timeout_and_keep_the_url_options(
    request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("pg_schema_factory")()     # carries options=-csearch_path=<schema>
    engine = make_engine(url, statement_timeout_ms=1234)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar_one() == "1234ms"
            assert conn.exec_driver_sql("SHOW search_path").scalar_one().startswith("t_")
    finally:
        engine.dispose()


# -- the journal cannot be written; the high-water mark --------------------------------------------------


def _raise_enospc(fd: int, data: bytes) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_mod, "_write_all", _raise_enospc)
    monkeypatch.setattr(wal_mod, "_write_all", _raise_enospc)


async def test_an_unwritable_journal_fails_closed_logs_rarely_and_recovers(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    w = AuditWriter(engine, journal_dir=tmp_path / "j", clock=clock, error_log_interval_s=60)
    await w.start(background=False)
    _disk_full(monkeypatch)
    caplog.set_level(logging.ERROR, logger="inferlb.store.writer")
    for i in range(50):                          # 50 flushes: each one fails to journal
        w.submit(make_record(i))
        await w.flush_once()
        clock.advance(0.2)                       # 10 s in all
    errors = [r for r in caplog.records if "cannot write the audit" in r.getMessage()]
    assert len(errors) == 1
    assert rows_in(engine) == 50                 # the database took them all the same
    b = w.backlog()
    assert b["journal_error"] and not b["healthy"] and b["state"] == "unavailable" and not w.accepting()
    with pytest.raises(AuditUnavailable) as exc:
        await w.begin(make_record(100))
    assert exc.value.status == 503 and exc.value.code == "audit_unavailable"
    assert exc.value.headers and int(exc.value.headers["retry-after"]) >= 1

    monkeypatch.undo()                           # space is freed
    await w._probe_wal()                         # what the background task does each interval
    await w.flush_once()
    b = w.backlog()
    assert b["journal_error"] is None and b["healthy"] and b["state"] == "ok" and w.accepting()
    await w.begin(make_record(101))
    await w.close()


async def test_past_the_high_water_mark_requests_are_refused_then_served_again(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, rows_in: RowsIn
) -> None:
    clock = ManualClock()
    w = AuditWriter(engine, journal_dir=tmp_path / "j", clock=clock, max_records=3)
    await w.start(background=False)
    with _table_missing(engine):                # the database refuses every write
        for i in range(3):
            await w.begin(make_record(i))
            w.submit(make_record(i))
        await w.flush_once()
        assert w.backlog()["spooled"] == 3 and not w.accepting()
        assert w.backlog()["state"] == "unavailable" and "limit 3" in w.backlog()["reason"]
        with pytest.raises(AuditUnavailable):
            await w.begin(make_record(3))
    clock.advance(60)                           # the database is back, the backoff over
    assert await w.flush_once() == 3
    assert w.accepting() and w.backlog()["state"] == "ok" and rows_in(engine) == 3
    await w.close()


async def test_fail_open_serves_and_counts_what_it_cannot_record(
    tmp_path: Path, make_record: MakeRecord
) -> None:
    bad = make_engine(f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}")
    w = AuditWriter(bad, journal_dir=tmp_path / "j", clock=ManualClock(), max_records=2, on_full="open")
    await w.start(background=False)
    for i in range(2):
        w.submit(make_record(i))
    await w.flush_once()
    await w.begin(make_record(2))               # served, no exception
    w.submit(make_record(2))
    b = w.backlog()
    assert w.accepting() and b["records_unrecorded"] == 1 and b["spooled"] == 2 and b["state"] == "degraded"
    await w.close()
    bad.dispose()


async def test_a_spool_that_failed_while_the_database_is_away_recovers_by_itself(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    w = AuditWriter(engine, journal_dir=tmp_path / "j", clock=clock)
    await w.start(background=False)
    with _table_missing(engine):
        w.submit(make_record(1))
        await w.flush_once()                     # journaled in the log, then spooled: database away
        monkeypatch.setattr(journal_mod, "_write_all", _raise_enospc)
        w.submit(make_record(2))
        await w.flush_once()                     # backing off: the spool append fails
        assert w.backlog()["journal_error"] and not w.accepting()
        monkeypatch.undo()                       # space is freed; the database is still away
        await w.flush_once()                     # record 2, kept in memory, is spooled at the next try
        b = w.backlog()
        assert b["journal_error"] is None and w.accepting() and b["spooled"] == 2 and b["state"] == "degraded"
    clock.advance(60)
    assert await w.flush_once() == 2
    await w.close()


async def test_a_spool_error_is_cleared_when_the_database_takes_the_records(
    engine: Engine, tmp_path: Path, make_record: MakeRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    w = AuditWriter(engine, journal_dir=tmp_path / "j", clock=clock)
    await w.start(background=False)
    monkeypatch.setattr(journal_mod, "_write_all", _raise_enospc)   # the spool's disk stays full
    with _table_missing(engine):
        w.submit(make_record(1))
        await w.flush_once()
        assert w.backlog()["journal_error"] and w.backlog()["pending"] == 1 and not w.accepting()
    clock.advance(60)
    assert await w.flush_once() == 1             # the database is back: nothing needs the spool now
    b = w.backlog()
    assert b["journal_error"] is None and b["healthy"] and w.accepting()
    monkeypatch.undo()
    await w.close()


async def test_a_linger_gathers_start_entries_until_a_request_waits_on_one(
    engine: Engine, tmp_path: Path, make_record: MakeRecord
) -> None:
    """``wal_commit_linger_s``: entries nobody waits on gather (no commit, however long the
    linger), and the first request that awaits its entry ends the linger: one fsync for all."""
    w = AuditWriter(engine, journal_dir=tmp_path / "j", clock=ManualClock(), wal_commit_linger_s=3600)
    await w.start()
    try:
        fsyncs = w._wal.fsyncs
        records = [make_record(i) for i in range(5)]
        for r in records:
            r.stream = False                     # a stream's entry does not linger (the next test)
        pending = [w.journal_start(r) for r in records]
        for _ in range(20):
            await asyncio.sleep(0)               # the journal task runs, and lingers
        assert len(w._wal_starts) == 5 and w._wal.fsyncs == fsyncs
        durable = [await asyncio.wait_for(p, 30) for p in pending if p is not None]
        assert durable == [True] * 5
        assert w._wal.fsyncs == fsyncs + 1       # one group commit for the five
    finally:
        await w.close()


async def test_a_streamed_requests_start_entry_is_not_held_by_the_linger(
    engine: Engine, tmp_path: Path, make_record: MakeRecord
) -> None:
    """A stream's first byte follows the node's first token: its group commits without lingering."""
    w = AuditWriter(engine, journal_dir=tmp_path / "j", clock=ManualClock(), wal_commit_linger_s=3600)
    await w.start()
    try:
        rec = make_record(1)
        rec.stream = True
        pending = w.journal_start(rec)
        assert pending is not None
        assert w._wal_urgent.is_set()            # the journal task will not linger on this group
        assert await asyncio.wait_for(pending, 30) is True
    finally:
        await w.close()
