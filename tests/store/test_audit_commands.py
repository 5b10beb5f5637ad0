"""CLI-facing store commands: db_upgrade and the SLA report in table / json / csv."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable

import pytest
from sqlalchemy import inspect
from sqlalchemy.engine import Engine

from inferlb.cli.audit import db_upgrade, report_sla
from inferlb.config.settings import SLOConfig
from inferlb.errors import InvalidRequest
from inferlb.store.db import make_engine
from inferlb.store.records import RequestRecord
from inferlb.store.rows import upsert_records

T0 = 1_767_225_600.0


def test_db_upgrade(fresh_url: str) -> None:
    db_upgrade(fresh_url)
    engine = make_engine(fresh_url)
    try:
        with engine.connect() as conn:
            assert {"requests", "request_attempts"} <= set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


@pytest.fixture
def seeded(db_url: str, engine: Engine, make_record: Callable[..., RequestRecord]) -> str:
    # e2e of 100, 200, 300 and 400 ms
    recs = [make_record(i, model_requested="m1", received_at=T0 + i, first_byte_at=T0 + i + 0.05,
                        last_byte_at=T0 + i + 0.1 * (i + 1)) for i in range(4)]
    recs.append(make_record(9, model_requested="m2", status="upstream_error"))
    with engine.begin() as conn:
        upsert_records(conn, recs)
    return db_url


SLOS = [SLOConfig(model="m1", e2e_max_s=0.3)]


def test_report_json(seeded: str) -> None:
    data = json.loads(report_sla(seeded, group_by="model", slos=SLOS, fmt="json"))["data"]
    assert [(r["model"], r["count"], r["errors"]) for r in data] == [("m1", 4, 0), ("m2", 1, 1)]
    assert data[0]["slo_attainment"] == 0.75  # 100, 200 and 300 ms are within 0.3 s
    assert data[0]["e2e_p50_ms"] == 250.0


def test_report_csv(seeded: str) -> None:
    rows = list(csv.DictReader(io.StringIO(report_sla(seeded, group_by="node", fmt="csv"))))
    assert [(r["node"], r["count"]) for r in rows] == [("gpu-a", "5")]
    assert "e2e_p95_ms" in rows[0] and rows[0]["slo_attainment"] == ""


def test_report_table(seeded: str) -> None:
    out = report_sla(seeded, since=str(T0), until="2030-01-01T00:00:00Z", slos=SLOS)
    assert "SLA report by model" in out and "\x1b[" not in out
    m1 = next(line for line in out.splitlines() if " m1 " in line)
    assert "250.000" in m1 and "0.750" in m1


def test_report_empty_and_bad_input(seeded: str) -> None:
    empty = report_sla(seeded, group_by="tenant", since=T0 + 10_000)
    assert "SLA report by tenant" in empty and "no requests in the window" in empty and "e2e p95" in empty
    header = report_sla(seeded, since=T0 + 10_000, fmt="csv").splitlines()[0]
    assert header.startswith("model,count,ok,errors")
    with pytest.raises(InvalidRequest):
        report_sla(seeded, fmt="xml")
    with pytest.raises(InvalidRequest):
        report_sla(seeded, since="last tuesday")
