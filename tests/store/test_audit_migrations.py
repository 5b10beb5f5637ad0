"""Migrations and engines: upgrading to head creates exactly the models' schema on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from inferlb.errors import StoreError
from inferlb.store.db import downgrade, is_sqlite, make_engine, migrations_dir, normalize_url, upgrade
from inferlb.store.partitions import PARTITION_NAME
from inferlb.store.schema import Base

REPO = Path(__file__).resolve().parents[2]


def _head() -> str:
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


def _not_a_partition(name: str | None, type_: str, parent_names: object) -> bool:
    return not (type_ == "table" and name is not None and PARTITION_NAME.match(name))


def test_upgrade_creates_exactly_the_model_schema(fresh_url: str) -> None:
    upgrade(fresh_url)
    engine = make_engine(fresh_url)
    try:
        with engine.connect() as conn:
            pg = conn.dialect.name == "postgresql"
            tables = set(inspect(conn).get_table_names())
            partitions = {t for t in tables if PARTITION_NAME.match(t)}
            assert tables - partitions == {"alembic_version", *Base.metadata.tables}
            # Day partitions (and a default one) exist on PostgreSQL only (migration 0007).
            assert bool(partitions) == pg
            assert {"requests", "request_attempts", "api_keys", "node_events",
                    "scaling_events"} <= set(Base.metadata.tables)
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == _head()
            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": _not_a_partition})
            diff = compare_metadata(ctx, Base.metadata)
            indexes = {ix["name"] for ix in inspect(conn).get_indexes("requests")}
            assert {"ix_requests_received", "ix_requests_model_requested", "ix_requests_node",
                    "ix_requests_status", "ix_requests_tenant"} <= indexes
            fks = inspect(conn).get_foreign_keys("request_attempts")
            if pg:
                # A partitioned table's foreign key would need the partition key: 0007 drops it,
                # the one difference from the models, and the primary keys gain the partition key.
                assert [(d[0], d[1].name) for d in diff] == [("add_fk", "fk_request_attempts_request_id_requests")]
                assert fks == []
                pk = inspect(conn).get_pk_constraint("requests")["constrained_columns"]
                assert pk == ["request_id", "received_at_us"]
            else:
                assert diff == []
                assert fks[0]["referred_table"] == "requests" and fks[0]["options"].get("ondelete") == "CASCADE"
    finally:
        engine.dispose()
    upgrade(fresh_url)  # at head already: a no-op, not an error


def test_downgrade_then_upgrade_again(fresh_url: str) -> None:
    upgrade(fresh_url)
    downgrade(fresh_url, "base")
    engine = make_engine(fresh_url)
    try:
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
        upgrade(fresh_url)
        with engine.connect() as conn:
            assert {"requests", "request_attempts"} <= set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_env_reads_the_url_from_inferlb_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'from-env.db'}"
    monkeypatch.setenv("INFERLB_DATABASE_URL", url)
    # The ini's logging section reconfigures logging like the CLI would: undo that afterwards.
    root, names = logging.getLogger(), ("sqlalchemy.engine", "alembic")
    saved = (root.handlers[:], root.level, [logging.getLogger(n).level for n in names])
    try:
        command.upgrade(Config(str(REPO / "alembic.ini")), "head")  # what `alembic upgrade head` does
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
        for n, level in zip(names, saved[2], strict=True):
            logging.getLogger(n).setLevel(level)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert "requests" in inspect(conn).get_table_names()
    finally:
        engine.dispose()


def test_sqlite_connections_get_wal_and_pragmas(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_in_memory_sqlite_is_one_shared_database() -> None:
    engine = make_engine("sqlite://")
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        with engine.connect() as conn:  # another checkout sees the same database
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 0
    finally:
        engine.dispose()


def test_url_normalisation() -> None:
    assert normalize_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgres://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgresql+psycopg://u@h/db").drivername == "postgresql+psycopg"
    assert is_sqlite("sqlite:///x.db") and not is_sqlite("postgresql://u@h/db")
    with pytest.raises(StoreError):
        normalize_url("not a url")


def test_migrations_dir_is_the_repository_one() -> None:
    assert migrations_dir() == REPO / "migrations"


def test_upgrade_of_an_unreachable_database_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        upgrade(f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}")
