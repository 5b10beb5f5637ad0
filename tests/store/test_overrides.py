"""Node overrides and the live-config columns (migration 0005) on SQLite and PostgreSQL: saved and
read back exactly, the revision moves with every change, a write validated against an old revision
is refused, and an audit row keeps the process and config versions."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from inferlb.store.overrides import (
    NodeOverride,
    StaleOverrides,
    load_overrides,
    read_revision,
    save_override,
)
from inferlb.store.records import RequestRecord
from inferlb.store.rows import upsert_records
from inferlb.store.schema import REQUESTS


@pytest.fixture
def db(engine: Engine) -> Engine:
    with engine.begin() as conn:   # the PostgreSQL schema is shared by the session's tests
        conn.execute(text("DELETE FROM node_overrides"))
        conn.execute(text("DELETE FROM fleet_revision"))
    return engine


def test_save_load_and_revision(db: Engine) -> None:
    assert read_revision(db) == 0
    assert load_overrides(db) == (0, [])
    added = NodeOverride("x", "admin", {"name": "x", "url": "http://127.0.0.1:1", "models": ["m"], "weight": 2.5,
                                        "labels": {"zone": "b"}}, key_id="admin:abc", updated_at=1_767_225_600.25)
    assert save_override(db, "x", added) == 1
    assert save_override(db, "n1", NodeOverride("n1", "file", {"weight": 3.0}, drained=True), expect_revision=1) == 2
    rev, rows = load_overrides(db)
    assert rev == 2 == read_revision(db)
    assert rows == [NodeOverride("n1", "file", {"weight": 3.0}, drained=True), added]
    assert save_override(db, "x", None) == 3            # delete
    assert [o.name for o in load_overrides(db)[1]] == ["n1"]


def test_a_write_validated_against_an_old_revision_is_refused(db: Engine) -> None:
    save_override(db, "a", NodeOverride("a", "file", {"weight": 2.0}))
    with pytest.raises(StaleOverrides):
        save_override(db, "b", NodeOverride("b", "file", {}, drained=True), expect_revision=0)
    assert [o.name for o in load_overrides(db)[1]] == ["a"]       # nothing of the refused write


def test_audit_rows_keep_process_and_config_versions(db: Engine, make_record: Callable[..., RequestRecord]) -> None:
    rec = make_record(0)
    rec.process_version, rec.config_version = "0123456789ab", "ba9876543210"
    with db.begin() as conn:
        upsert_records(conn, [rec])
    with db.connect() as conn:
        row = conn.execute(select(REQUESTS.c.process_version, REQUESTS.c.config_version)
                           .where(REQUESTS.c.request_id == rec.request_id)).one()
    assert tuple(row) == ("0123456789ab", "ba9876543210")
    assert RequestRecord.from_json(rec.to_json()).process_version == "0123456789ab"
