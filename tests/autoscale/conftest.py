"""Autoscaling tests reuse the audit-store database fixtures (SQLite and PostgreSQL) and seed a
synthetic, seasonal audit history with a known shape."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from inferlb.store.db import make_engine
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.store.rows import upsert_records
from tests.store.conftest import (  # noqa: F401  (fixtures, found by name)
    db_url,
    pg_admin,
    pg_migrated_url,
    pg_schema_factory,
)

T0 = 1_767_225_600.0          # 2026-01-01T00:00:00Z
TOKENS = 200                  # prompt 100 + completion 100 per request


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:  # noqa: F811  (the imported fixture, by name)
    eng = make_engine(db_url)
    with eng.begin() as conn:   # the PostgreSQL schema is shared by the session
        conn.execute(text("DELETE FROM scaling_events"))
    yield eng
    eng.dispose()


def per_minute(i: int, period_min: int = 60, base: float = 30.0, amp: float = 20.0) -> int:
    """Requests received in minute ``i``: a sine of ``period_min`` minutes."""
    return round(base + amp * math.sin(2 * math.pi * i / period_min))


def seasonal_records(minutes: int, nodes: dict[str, str], *, start: float = T0, period_min: int = 60,
                     model: str = "m", e2e_s: float = 1.0, slow_from: int | None = None) -> list[RequestRecord]:
    """``per_minute(i)`` ok requests of ``TOKENS`` tokens each minute, round-robin over ``nodes``
    (name -> GPU type). From minute ``slow_from`` on, answers take 10 s (the SLO breaks)."""
    out: list[RequestRecord] = []
    names = sorted(nodes)
    k = 0
    for i in range(minutes):
        n = per_minute(i, period_min)
        for j in range(n):
            t = round(start + i * 60 + j * 60 / max(n, 1), 6)
            node = names[k % len(names)]
            k += 1
            e2e = 10.0 if slow_from is not None and i >= slow_from else e2e_s
            out.append(RequestRecord(
                request_id=f"as-{i:05d}-{j:03d}", received_at=t, endpoint="chat", model_requested=model,
                model_served=model, node=node, status="ok", http_status=200, admitted_at=t, routed_at=t,
                first_byte_at=round(t + e2e / 2, 6), last_byte_at=round(t + e2e, 6), prompt_tokens=100,
                completion_tokens=100, engine="compiled",
                attempts=[AttemptRecord(number=1, node=node, model=model, started_at=t, ended_at=round(t + e2e, 6),
                                        outcome="ok", http_status=200)]))
    return out


def seed(engine: Engine, records: list[RequestRecord]) -> None:
    with engine.begin() as conn:
        upsert_records(conn, records)
