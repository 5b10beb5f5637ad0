"""Audit retention on SQLite and PostgreSQL: prune (partitions dropped / batched deletes), the
leader-only maintenance round, and ``inferlb db prune``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from inferlb.cli.main import main
from inferlb.config.settings import SLOConfig
from inferlb.errors import InvalidRequest
from inferlb.store.db import upgrade
from inferlb.store.maintenance import AuditMaintenance
from inferlb.store.partitions import day_of, day_partitions, ensure_days, is_partitioned
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.store.retention import parse_age, prune
from inferlb.store.rows import upsert_records
from inferlb.store.sla import sla_report
from inferlb.types import ManualClock

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, as in conftest.py
DAY = 86_400.0
MakeRecord = Callable[..., RequestRecord]
SLOS = [SLOConfig(model="*", e2e_max_s=1.0)]


def _attempt(n: int, at: float) -> AttemptRecord:
    return AttemptRecord(number=n, node="gpu-a", model="llama-8b", started_at=round(at, 6),
                         ended_at=round(at + 0.5, 6), outcome="ok", http_status=200)


def _seed(engine: Engine, make_record: MakeRecord) -> list[RequestRecord]:
    """Requests every 3 h over 3 days from T0, each with one attempt 1 s after it; one request just
    before T0 + 1.5 d whose second attempt starts after that instant (in flight across a cut)."""
    recs = [make_record(i, received_at=T0 + i * 3 * 3600 + 60, status="ok" if i % 4 else "upstream_error",
                        last_byte_at=T0 + i * 3 * 3600 + 60.4 + (i % 3),
                        attempts=[_attempt(1, T0 + i * 3 * 3600 + 61)]) for i in range(24)]
    cut = T0 + 1.5 * DAY
    recs.append(make_record(100, received_at=cut - 2, last_byte_at=cut + 5,
                            attempts=[_attempt(1, cut - 1), _attempt(2, cut + 1)]))
    with engine.begin() as conn:
        if is_partitioned(conn):   # day partitions for the data (else every row sits in the default one)
            ensure_days(conn, day_of(T0), day_of(T0 + 3 * DAY))
        upsert_records(conn, recs)
    return recs


def _ids(engine: Engine, table: str) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text(f"SELECT request_id FROM {table}")).scalars())


@pytest.mark.parametrize("batch_size", [7, 5000])
def test_prune_removes_exactly_what_came_before_the_cut(engine: Engine, make_record: MakeRecord,
                                                        batch_size: int) -> None:
    recs = _seed(engine, make_record)
    cut = T0 + 1.5 * DAY
    after = sla_report(engine, since=cut, group_by="model,node", bucket="1h", slos=SLOS)
    result = prune(engine, cut, batch_size=batch_size)
    keep = {r.request_id for r in recs if r.received_at >= cut}
    assert _ids(engine, "requests") == keep
    # the in-flight request's attempt after the cut went with it: no attempt outlives its request
    assert _ids(engine, "request_attempts") == keep
    assert sla_report(engine, since=cut, group_by="model,node", bucket="1h", slos=SLOS) == after
    assert sla_report(engine, until=cut) == []
    with engine.connect() as conn:
        partitioned = is_partitioned(conn)
        if partitioned:
            first = [p.lo_us for p in day_partitions(conn, "requests")]
            assert round(T0 * 1e6) not in first      # the whole first day is gone as a partition
    if partitioned:
        assert result.partitions_dropped[:2] == ["requests_p20260101", "request_attempts_p20260101"]
        # day 2 before the cut: 00:01, 03:01, 06:01, 09:01 and the in-flight one (the rest stays);
        # their attempts, and the in-flight one's second attempt, after the cut
        assert result.rows_deleted == 5 and result.attempts_deleted == 6
    else:
        assert result.partitions_dropped == [] and result.rows_deleted == len(recs) - len(keep)
    again = prune(engine, cut, batch_size=batch_size)    # nothing left to do
    assert again.rows_deleted == 0 and again.partitions_dropped == [] and again.attempts_deleted == 0


def test_prune_everything_and_nothing(engine: Engine, make_record: MakeRecord, rows_in: Any) -> None:
    _seed(engine, make_record)
    assert prune(engine, T0 - DAY).rows_deleted == 0 and rows_in(engine) == 25
    prune(engine, T0 + 10 * DAY)
    assert rows_in(engine) == 0 and rows_in(engine, "request_attempts") == 0


def test_maintenance_runs_on_the_leader_only(engine: Engine, make_record: MakeRecord, rows_in: Any) -> None:
    _seed(engine, make_record)
    clock = ManualClock(wall=T0 + 3 * DAY)
    leading = False
    m = AuditMaintenance(engine, clock=clock, retention_days=2, leader=lambda: leading)

    async def go() -> Any:
        return await m.run_once()

    assert asyncio.run(go()) is None and rows_in(engine) == 25     # not the leader: nothing
    leading = True
    done = asyncio.run(go())
    assert done is not None and done.pruned is not None
    assert _ids(engine, "requests") == {f"req-{i:05d}" for i in (*range(8, 24), 100)}   # from T0 + 1 d on
    with engine.connect() as conn:
        if is_partitioned(conn):
            today = day_of(clock.time())
            made = {p.name for p in day_partitions(conn, "requests")}
            assert {f"requests_p{today + timedelta(days=d):%Y%m%d}" for d in range(8)} <= made
            assert set(done.created) >= {f"request_attempts_p{today + timedelta(days=7):%Y%m%d}"}
        else:
            assert done.created == []
    with pytest.raises(ValueError):
        AuditMaintenance(engine, clock=clock, retention_days=0)


def test_maintenance_timer_first_round_at_start(engine: Engine, make_record: MakeRecord, rows_in: Any) -> None:
    _seed(engine, make_record)
    m = AuditMaintenance(engine, clock=ManualClock(wall=T0 + 100 * DAY), retention_days=30, interval_s=3600)

    async def go() -> None:
        await m.start()
        for _ in range(500):            # bounded: the first round runs in a worker thread
            if m.rounds:
                break
            await asyncio.sleep(0.01)
        await m.close()

    asyncio.run(go())
    assert m.rounds == 1 and m.last_error is None and rows_in(engine) == 0


def test_parse_age() -> None:
    assert parse_age("30d") == 30 * DAY and parse_age("12h") == 43_200 and parse_age("90m") == 5400
    assert parse_age("2w") == 14 * DAY and parse_age("45") == 45
    for bad in ("", "0d", "-1d", "30 days", "d", "1y"):
        with pytest.raises(InvalidRequest):
            parse_age(bad)


def test_cli_db_prune(tmp_path: Path, make_record: MakeRecord, capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    upgrade(url)
    from inferlb.store.db import make_engine

    engine = make_engine(url)
    try:
        now = time.time()   # the command prunes against the real clock
        with engine.begin() as conn:
            upsert_records(conn, [make_record(0, received_at=round(now - 40 * DAY, 6)),
                                  make_record(1, received_at=round(now - DAY, 6))])
        monkeypatch.delenv("INFERLB_AUDIT_RETENTION_DAYS", raising=False)
        assert main(["db", "prune", "--database-url", url]) == 2
        assert "--older-than" in capsys.readouterr().err
        assert main(["db", "prune", "--older-than", "soon", "--database-url", url]) == 2
        assert "older-than" in capsys.readouterr().err
        assert main(["db", "prune", "--older-than", "30d", "--database-url", url]) == 0
        assert "1 request row(s) deleted" in capsys.readouterr().out
        assert _ids(engine, "requests") == {"req-00001"}
        monkeypatch.setenv("INFERLB_AUDIT_RETENTION_DAYS", "0.5")
        assert main(["db", "prune", "--database-url", url]) == 0 and _ids(engine, "requests") == set()
    finally:
        engine.dispose()
