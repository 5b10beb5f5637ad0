"""Fixtures: one database that two gateway replicas share, on SQLite and PostgreSQL (the store's
PostgreSQL fixtures: skipped when the server is unreachable, failed with ``INFERLB_REQUIRE_PG=1``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from inferlb.store.db import make_engine, upgrade
from tests.store.conftest import BACKENDS, pg_admin, pg_migrated_url, pg_schema_factory

__all__ = ["pg_admin", "pg_migrated_url", "pg_schema_factory", "shared_db", "shared_db_url"]

# What replicas share: emptied before each test (the PostgreSQL schema lives for the session).
_SHARED = ("rollout_events", "rollouts", "node_overrides", "fleet_revision")


@pytest.fixture(params=BACKENDS)
def shared_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database with no rollouts, node overrides or revision yet."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shared.db'}"
        upgrade(url)
        return url
    url = str(request.getfixturevalue("pg_migrated_url"))
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for table in _SHARED:
                conn.execute(text(f"DELETE FROM {table}"))
    finally:
        engine.dispose()
    return url


@pytest.fixture
def shared_db(shared_db_url: str) -> Iterator[Engine]:
    engine = make_engine(shared_db_url)
    yield engine
    engine.dispose()
