"""The batch upsert's statements (store/rows.py): the driver's SQL, compiled once, the same SQL as
the dialect's ``ON CONFLICT`` construct; the JSON columns' text; and the rows they write."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from inferlb.store import db, rows
from inferlb.store.queries import get_request
from inferlb.store.records import RequestRecord
from inferlb.store.schema import REQUESTS


def _constructs(dialect_name: str) -> tuple[Any, Any]:
    """The upsert and insert-if-absent as SQLAlchemy builds them (what rows.py compiled per batch)."""
    ins = postgresql.insert if dialect_name == "postgresql" else sqlite.insert
    target = [REQUESTS.c.request_id] + ([REQUESTS.c.received_at_us] if dialect_name == "postgresql" else [])
    stmt = ins(REQUESTS)
    keys = {c.name for c in target}
    upsert = stmt.on_conflict_do_update(index_elements=target,
                                        set_={c.name: stmt.excluded[c.name] for c in REQUESTS.c if c.name not in keys})
    return upsert, ins(REQUESTS).on_conflict_do_nothing(index_elements=target)


class _FakeConn:
    def __init__(self, url: str) -> None:
        self.dialect = create_engine(url).dialect


@pytest.mark.parametrize("url", ["sqlite://", "postgresql+psycopg://u@127.0.0.1/db"])
def test_driver_sql_is_the_on_conflict_sql(url: str) -> None:
    """The driver's SQL text is the ON CONFLICT constructs' SQL for the dialect, with a named
    parameter for every column (PostgreSQL keeps psycopg's bind casts, ``::JSONB`` among them);
    no database needed."""
    conn = _FakeConn(url)
    ours = rows._driver_sql(conn)  # type: ignore[arg-type]
    columns = [c.key for c in REQUESTS.c]
    pg = conn.dialect.name == "postgresql"
    for theirs, mine in zip(_constructs(conn.dialect.name), (ours.upsert, ours.insert_if_absent), strict=True):
        if pg:
            assert mine == str(theirs.compile(dialect=conn.dialect, column_keys=columns))
        for c in columns:
            assert (f"%({c})s" if pg else f":{c}") in mine
    assert ("%(decision)s::JSONB" in ours.upsert) is pg
    assert ours.delete_attempts.startswith("DELETE FROM request_attempts WHERE request_attempts.request_id = ")
    assert rows._driver_sql(conn) is ours  # type: ignore[arg-type]  # compiled once per dialect


_JSON_VALUES: list[Any] = [
    None, {}, [], {"a": 1, "b": [1, 2.5, "x", None, True]}, {"k\x00": "v\x00"}, {"bad": float("nan")},
    {"inf": float("-inf")}, {2: "int key", None: "none key", True: "bool key"}, ("t", 1), {"big": 2**70},
    {"sur": "\ud800"}, {"lit": "\\u0000"}, {"ü": "ü€𝄞"}, {"nest": [{"a": [None, {"b": {"c": []}}]}]},
    {"set": {1}}, "s", 3, 2.0,
]


@pytest.mark.parametrize("value", _JSON_VALUES, ids=repr)
@pytest.mark.parametrize("url", ["sqlite://", "postgresql+psycopg://u@127.0.0.1/db"])
def test_json_text_is_what_the_json_column_wrote(url: str, value: Any) -> None:
    """json_text (what the driver now binds) is the text the column's JSON type wrote for the
    cleaned value (what SQLAlchemy bound before), on both dialects: the fast path and the cleaning
    path agree, NUL and lone surrogates included."""
    engine = create_engine(url, json_serializer=db._json_text)
    column = REQUESTS.c.decision.type.dialect_impl(engine.dialect)
    process = column.bind_processor(engine.dialect)
    assert process is not None
    bound = process(rows.clean_json(value))
    if not isinstance(bound, str):
        # psycopg's Jsonb wrapper: psycopg writes its obj with the serializer the engine registers
        # on each connection (make_engine's json_serializer)
        assert bound.dumps is None
        bound = db._json_text(bound.obj)
    assert rows.json_text(value) == bound


def test_upsert_runs_one_statement_text_per_kind(engine: Engine, make_record: Callable[..., RequestRecord]) -> None:
    """Every batch, whatever its size, executes the same few statement texts (the driver's, built
    once): the upsert, one DELETE and one INSERT of attempts, each an executemany."""
    seen: list[tuple[str, bool]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _note(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        seen.append((statement, executemany))

    for batch, size in enumerate((3, 5)):
        with engine.begin() as conn:
            rows.upsert_records(conn, [make_record(batch * 10 + i) for i in range(size)])
    assert len(seen) == 6 and seen[:3] == seen[3:]
    assert all(many for _, many in seen)


def test_rows_round_trip_through_the_cached_statements(engine: Engine,
                                                       make_record: Callable[..., RequestRecord]) -> None:
    """What the cached statements write reads back as the record (cleaned), an update replaces it,
    and an unknown-outcome record never replaces a real one."""
    rec = make_record(1, tags={"k\x00": "v\x00", "bad": float("nan")}, decision=None, stream=False)
    with engine.begin() as conn:
        rows.upsert_records(conn, [rec])
    got = get_request(engine, rec.request_id)
    assert got is not None
    assert got["tags"] == {"k\ufffd": "v\ufffd", "bad": None}
    assert got["decision"] is None and got["stream"] is False
    assert got["decisions"] == rec.decisions and got["workflow_path"] == rec.workflow_path
    with engine.begin() as conn:
        rows.upsert_records(conn, [make_record(1, status="error", http_status=502, stream=True)])
    with engine.begin() as conn:
        rows.upsert_records(conn, [make_record(1, status=rows.UNKNOWN_OUTCOME)])
    got = get_request(engine, rec.request_id)
    assert got is not None
    assert (got["status"], got["http_status"], got["stream"]) == ("error", 502, True)
    assert got["tags"] == {"ab": "control"} and got["decision"] == make_record(1).decision
