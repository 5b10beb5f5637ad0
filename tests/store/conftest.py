"""Database fixtures for the audit-store tests: every ``db_url`` test runs on SQLite and PostgreSQL.

PostgreSQL comes from ``INFERLB_TEST_PG_URL`` (default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``). Each test session works in its own
``t_<random>`` schema (``search_path`` set through the URL's ``options``) and drops it at the end,
so runs never see each other's rows. When the server is unreachable the PostgreSQL cases skip,
unless ``INFERLB_REQUIRE_PG=1`` (CI), where they fail.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine, make_url

from inferlb.store.db import make_engine, upgrade
from inferlb.store.records import AttemptRecord, RequestRecord

PG_URL = os.environ.get("INFERLB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REQUIRE_PG = os.environ.get("INFERLB_REQUIRE_PG") == "1"

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine]:
    """An engine on the PostgreSQL test database (public schema), or skip / fail when unreachable."""
    engine = make_engine(make_url(PG_URL).update_query_dict({"connect_timeout": "3"}))
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        engine.dispose()
        msg = f"PostgreSQL unreachable at {PG_URL}: {type(exc).__name__}"
        if REQUIRE_PG:
            pytest.fail(msg + " (INFERLB_REQUIRE_PG=1)")
        pytest.skip(msg)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def pg_schema_factory(pg_admin: Engine) -> Iterator[Callable[[], str]]:
    """Makes fresh schemas (returning a URL whose search_path is the schema); drops them all at the end."""
    made: list[str] = []

    def new() -> str:
        schema = "t_" + secrets.token_hex(6)
        with pg_admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        made.append(schema)
        # application_name lets a test find (and kill) only its own server connections.
        query = {"options": f"-csearch_path={schema}", "application_name": schema}
        url = make_url(PG_URL).update_query_dict(query)
        return url.render_as_string(hide_password=False)

    yield new
    with pg_admin.begin() as conn:
        for schema in made:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


@pytest.fixture(scope="session")
def pg_migrated_url(pg_schema_factory: Callable[[], str]) -> str:
    url = pg_schema_factory()
    upgrade(url)
    return url


@pytest.fixture(params=BACKENDS)
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database (no tables) on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh.db'}"
    factory: Callable[[], str] = request.getfixturevalue("pg_schema_factory")
    return factory()


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database on each backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'audit.db'}"
        upgrade(url)
        return url
    url = request.getfixturevalue("pg_migrated_url")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE request_attempts, requests"))
    finally:
        engine.dispose()
    return str(url)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _record(i: int, **kw: Any) -> RequestRecord:
    """A complete record; ``i`` spaces requests 1 s apart. Keyword arguments override fields."""
    t = round(T0 + i + 0.123457, 6)
    base: dict[str, Any] = {
        "request_id": f"req-{i:05d}",
        "received_at": t,
        "endpoint": "chat",
        "model_requested": "llama-8b",
        "tenant": "acme",
        "model_served": "llama-8b",
        "model_version": "v1",
        "node": "gpu-a",
        "priority": "interactive",
        "stream": True,
        "status": "ok",
        "http_status": 200,
        "admitted_at": round(t + 0.000101, 6),
        "routed_at": round(t + 0.000202, 6),
        "first_byte_at": round(t + 0.150001, 6),
        "last_byte_at": round(t + 0.900009, 6),
        "prompt_tokens_est": 120,
        "prompt_tokens": 118,
        "completion_tokens": 64,
        "cost_est": 0.000123,
        "decision": {"picked": "gpu-a", "scores": {"gpu-a": 0.91, "gpu-b": 0.4}, "eliminated": []},
        "decisions": [{"attempt": 1, "model": "llama-8b", "pick": "gpu-b"},
                      {"attempt": 2, "model": "llama-8b", "pick": "gpu-a"}],
        "deadline_at": round(t + 60.000001, 6),
        "workflow_path": ["start", "evaluate", "admit", "route", "dispatch", "record", "end"],
        "tags": {"ab": "control"},
        "engine": "compiled",
        "attempts": [
            AttemptRecord(number=1, node="gpu-b", model="llama-8b", started_at=round(t + 0.000303, 6),
                          ended_at=round(t + 0.050404, 6), outcome="retryable", http_status=503,
                          error_class="upstream_status"),
            AttemptRecord(number=2, node="gpu-a", model="llama-8b", started_at=round(t + 0.060505, 6),
                          ended_at=round(t + 0.900009, 6), outcome="ok", http_status=200,
                          first_byte_at=round(t + 0.150001, 6)),
        ],
    }
    base.update(kw)
    return RequestRecord(**base)


@pytest.fixture
def make_record() -> Callable[..., RequestRecord]:
    return _record


def count_rows(engine: Engine, table: str = "requests") -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


@pytest.fixture
def rows_in() -> Callable[..., int]:
    return count_rows
