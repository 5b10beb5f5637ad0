"""Database fixtures for the node-event store: SQLite and PostgreSQL like tests/store/conftest.py
(its session fixtures are reused: fresh ``t_<random>`` schemas, dropped at the end)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.store.conftest import BACKENDS, pg_admin, pg_schema_factory

__all__ = ["pg_admin", "pg_schema_factory"]


@pytest.fixture(params=BACKENDS)
def fresh_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database (no tables) on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'events.db'}"
    factory: Callable[[], str] = request.getfixturevalue("pg_schema_factory")
    return factory()
