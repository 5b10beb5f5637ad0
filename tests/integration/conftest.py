"""Fixtures: the database two gateway replicas share, on SQLite and PostgreSQL (tests/rollout/conftest.py)."""

from __future__ import annotations

from tests.rollout.conftest import pg_admin, pg_migrated_url, pg_schema_factory, shared_db_url

__all__ = ["pg_admin", "pg_migrated_url", "pg_schema_factory", "shared_db_url"]
