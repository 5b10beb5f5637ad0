"""Migration 0007: day partitions on PostgreSQL (upgrade and downgrade keep every row and the
reports' numbers), SQLite left as it was; the writer's upsert on the partitioned key."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import insert, inspect, text
from sqlalchemy.engine import Engine

from inferlb.config.settings import SLOConfig
from inferlb.store.db import downgrade, make_engine, migrations_dir, upgrade
from inferlb.store.partitions import day_bounds, day_of, day_partitions, ensure_days, is_partitioned
from inferlb.store.queries import get_request
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.store.rows import UNKNOWN_OUTCOME, record_rows, upsert_records
from inferlb.store.schema import ATTEMPTS, REQUESTS
from inferlb.store.sla import sla_report, sla_report_python

# The revision 0007 upgrades from (later migrations may sit between 0004 and 0007).
BEFORE = ScriptDirectory(str(migrations_dir())).get_revision("0007").down_revision
assert isinstance(BEFORE, str)

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, as in conftest.py

MakeRecord = Callable[..., RequestRecord]
SLOS = [SLOConfig(model="llama-8b", e2e_max_s=0.5, ttft_max_s=0.2, e2e_p95_s=0.6),
        SLOConfig(model="*", e2e_max_s=2.0)]


def _records(make_record: MakeRecord, n: int = 300, days: int = 3) -> list[RequestRecord]:
    """``n`` varied records over ``days`` UTC days from T0 (seeded: the same every run)."""
    rng = random.Random(7)
    out = []
    for i in range(n):
        t = round(T0 + rng.uniform(0, days * 86_400), 6)
        e2e = rng.uniform(0.05, 3.0)
        out.append(make_record(
            i, received_at=t, last_byte_at=round(t + e2e, 6), first_byte_at=round(t + e2e / 4, 6),
            model_requested=rng.choice(["llama-8b", "qwen-7b"]), node=rng.choice(["gpu-a", "gpu-b", None]),
            status=rng.choice(["ok", "ok", "ok", "upstream_error", "client_closed"]),
            stream=rng.random() < 0.6, tenant=rng.choice(["acme", "globex"]), attempts=[]))
    return out


def _insert_plain(engine: Engine, records: list[RequestRecord]) -> None:
    """Rows as the writer makes them, inserted without its upsert (which targets 0007's key)."""
    rows = [record_rows(r) for r in records]
    with engine.begin() as conn:
        conn.execute(insert(REQUESTS), [r for r, _ in rows])
        attempts = [a for _, a_rows in rows for a in a_rows]
        if attempts:
            conn.execute(insert(ATTEMPTS), attempts)


def _reports(engine: Engine) -> list[Any]:
    return [sla_report(engine, group_by=g, bucket=b, slos=SLOS, since=s, until=u)
            for g, b, s, u in (("model", None, None, None), ("model,node", "1h", None, None),
                               ("tenant,stream", "1d", T0 + 3600, T0 + 2 * 86_400), ("none", None, None, None))]


@pytest.mark.postgres
def test_pg_upgrade_and_downgrade_keep_rows_and_reports(pg_schema_factory: Callable[[], str],
                                                        make_record: MakeRecord) -> None:
    url = pg_schema_factory()
    upgrade(url, BEFORE)
    engine = make_engine(url)
    try:
        records = _records(make_record)
        records[0] = make_record(0, received_at=T0 + 5.5)   # one with its two attempts
        _insert_plain(engine, records)
        before, detail = _reports(engine), get_request(engine, "req-00000")
        assert detail is not None and len(detail["attempts"]) == 2

        upgrade(url, "0007")
        with engine.connect() as conn:
            assert is_partitioned(conn)
            days = {p.lo_us for p in day_partitions(conn, "requests")}
            # every day holding rows got its partition, and nothing is left in the default one
            assert {day_bounds(day_of(T0 + d * 86_400))[0] for d in range(4)} <= days
            assert conn.execute(text("SELECT count(*) FROM requests_pdefault")).scalar_one() == 0
            assert conn.execute(text("SELECT count(*) FROM requests")).scalar_one() == len(records)
            names = {ix["name"] for ix in inspect(conn).get_indexes("requests")}
            assert {"ix_requests_received", "ix_requests_tenant", "ix_requests_node"} <= names
            # the parent's indexes exist on every partition (the reports' window scans use them)
            per_part = conn.execute(text(
                "SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() "
                "AND tablename = :t"), {"t": day_partitions(conn, "requests")[0].name}).scalar_one()
            assert per_part == 7   # primary key + 6 secondary indexes
        assert _reports(engine) == before
        assert get_request(engine, "req-00000") == detail

        downgrade(url, BEFORE)
        with engine.connect() as conn:
            assert not is_partitioned(conn)
            assert not [t for t in inspect(conn).get_table_names() if t.startswith("requests_p")]
            fks = inspect(conn).get_foreign_keys("request_attempts")
            assert fks[0]["referred_table"] == "requests" and fks[0]["options"].get("ondelete") == "CASCADE"
            assert inspect(conn).get_pk_constraint("requests")["constrained_columns"] == ["request_id"]
        assert _reports(engine) == before
        assert get_request(engine, "req-00000") == detail
        upgrade(url)   # and up again
        assert _reports(engine) == before
    finally:
        engine.dispose()


def test_sqlite_schema_is_unchanged_by_0007(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url, BEFORE)
    engine = make_engine(url)
    sql = "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'alembic%' ORDER BY name"
    try:
        with engine.connect() as conn:
            schema = conn.execute(text(sql)).all()
        upgrade(url, "0007")
        with engine.connect() as conn:
            assert conn.execute(text(sql)).all() == schema
            assert not is_partitioned(conn)
        downgrade(url, BEFORE)
        with engine.connect() as conn:
            assert conn.execute(text(sql)).all() == schema
    finally:
        engine.dispose()


def test_writer_upsert_on_the_partitioned_key(engine: Engine, make_record: MakeRecord, rows_in: Any) -> None:
    rec = make_record(1, status="upstream_error", http_status=502)
    with engine.begin() as conn:
        upsert_records(conn, [make_record(1, status=UNKNOWN_OUTCOME, attempts=[])])
        upsert_records(conn, [rec])
        upsert_records(conn, [make_record(1)])                       # the last version wins
        upsert_records(conn, [make_record(1, status=UNKNOWN_OUTCOME, attempts=[])])   # never replaces it
    assert rows_in(engine) == 1 and rows_in(engine, "request_attempts") == 2
    got = get_request(engine, "req-00001")
    assert got is not None and got["status"] == "ok" and [a["number"] for a in got["attempts"]] == [1, 2]


@pytest.mark.postgres
def test_ensure_days_moves_rows_out_of_the_default_partition(pg_migrated_url: str,
                                                             make_record: MakeRecord) -> None:
    engine = make_engine(pg_migrated_url)
    far = date(2031, 5, 4)   # no partition for it yet: its rows land in the default one
    t = day_bounds(far)[0] / 1e6 + 3600
    try:
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE request_attempts, requests"))
            upsert_records(conn, [make_record(900, received_at=t, attempts=[
                AttemptRecord(number=n, node="gpu-a", model="llama-8b", started_at=t + n, ended_at=t + n + 0.5,
                              outcome="ok", http_status=200) for n in (1, 2)]),
                make_record(901, received_at=t + 86_400, attempts=[])])
        with engine.begin() as conn:
            assert conn.execute(text("SELECT count(*) FROM requests_pdefault")).scalar_one() == 2
            assert conn.execute(text("SELECT count(*) FROM request_attempts_pdefault")).scalar_one() == 2
            created = ensure_days(conn, far, far)
            assert created == ["requests_p20310504", "request_attempts_p20310504"]
            assert ensure_days(conn, far, far) == []            # idempotent
        with engine.connect() as conn:
            assert conn.execute(text("SELECT request_id FROM requests_p20310504")).scalars().all() == ["req-00900"]
            assert conn.execute(text("SELECT count(*) FROM request_attempts_p20310504")).scalar_one() == 2
            assert conn.execute(text("SELECT count(*) FROM requests_pdefault")).scalar_one() == 1
        got = get_request(engine, "req-00900")
        assert got is not None and len(got["attempts"]) == 2
    finally:
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE request_attempts, requests"))
            for name in ("requests_p20310504", "request_attempts_p20310504"):
                conn.execute(text(f'DROP TABLE IF EXISTS "{name}"'))
        engine.dispose()


def test_day_bounds() -> None:
    lo, hi = day_bounds(date(2026, 1, 1))
    assert lo == int(T0 * 1_000_000) and hi - lo == 86_400_000_000
    assert day_of(T0 + 86_399.999) == date(2026, 1, 1) and day_of(T0 + 86_400) == date(2026, 1, 2)
    assert day_of(T0) + timedelta(days=1) == date(2026, 1, 2)


@pytest.mark.postgres
def test_database_aggregation_equals_the_python_one(pg_migrated_url: str, make_record: MakeRecord) -> None:
    """The SLA report aggregated by PostgreSQL (sla_sql.py) gives the numbers of the Python path."""
    engine = make_engine(pg_migrated_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE request_attempts, requests"))
            upsert_records(conn, _records(make_record, n=400, days=2))
        slos = [*SLOS, SLOConfig(model="qwen-7b", ttft_max_s=0.4, ttft_p95_s=0.3)]
        for group_by in ("model", "model,node", "tenant,stream", "none", "version,priority"):
            for bucket in (None, "1h", "7m"):
                kw: dict[str, Any] = {"group_by": group_by, "bucket": bucket, "slos": slos}
                assert sla_report(engine, in_database=True, **kw) == sla_report_python(engine, **kw)
                window = {"since": T0 + 3_600.5, "until": T0 + 86_400}
                assert (sla_report(engine, in_database=True, **kw, **window)
                        == sla_report_python(engine, **kw, **window))
    finally:
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE request_attempts, requests"))
        engine.dispose()
