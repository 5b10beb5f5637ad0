"""Alembic environment for the inferlb audit store.

Where the database comes from, first match wins:

1. ``config.attributes["connection"]``: an open SQLAlchemy Connection (tests, embedding callers);
2. ``config.attributes["url"]``: set by :func:`inferlb.store.db.upgrade`;
3. ``INFERLB_DATABASE_URL`` through inferlb's settings (the ``alembic`` command line).

alembic.ini carries no URL on purpose: one source of truth, and no password in a file.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from inferlb.config.settings import load_settings
from inferlb.store.db import make_engine, normalize_url
from inferlb.store.partitions import PARTITION_NAME
from inferlb.store.schema import Base

__all__: list[str] = []

config = context.config

# Only the `alembic` CLI has an ini file; programmatic upgrades must not reconfigure the
# application's logging (and never disable its existing loggers).
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url") or load_settings().database_url
    return normalize_url(url).render_as_string(hide_password=False)


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Leave the day partitions of the audit tables (migration 0007, PostgreSQL) out of autogenerate."""
    return not (type_ == "table" and name is not None and PARTITION_NAME.match(name))


# Migration 0007 partitions ``requests`` by day on PostgreSQL, and a partitioned table's foreign key
# would need the partition key: 0007 drops this one there, the one way the database differs from the
# schema on purpose, so autogenerate (and ``alembic check``) must not try to add it back.
_DROPPED_ON_POSTGRESQL = {"fk_request_attempts_request_id_requests"}


def include_object(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    """Leave out of autogenerate what migration 0007 removes from PostgreSQL on purpose."""
    return not (type_ == "foreign_key_constraint" and name in _DROPPED_ON_POSTGRESQL
                and context.get_context().dialect.name == "postgresql")


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_name=include_name,
        include_object=include_object,
        # SQLite cannot ALTER most things in place; batch mode copies the table for future migrations.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade head --sql``)."""
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _configure(given)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _configure(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
