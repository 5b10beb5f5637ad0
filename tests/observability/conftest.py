"""Observability tests reuse the audit-store database fixtures: every ``db_url`` test runs on SQLite
and PostgreSQL (skipped when PostgreSQL is unreachable, failing under ``INFERLB_REQUIRE_PG=1``)."""

from __future__ import annotations

from tests.store.conftest import (  # noqa: F401  (fixtures, found by name)
    db_url,
    engine,
    pg_admin,
    pg_migrated_url,
    pg_schema_factory,
)
