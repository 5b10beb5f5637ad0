"""The batch upsert's statements (store/rows.py): compiled once, the same SQL as the
dialect's ``ON CONFLICT`` construct, and the rows they write."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from inferlb.store import rows
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


@pytest.mark.parametrize("url", ["sqlite://", "postgresql+psycopg://u@127.0.0.1/db"])
def test_statements_compile_to_the_on_conflict_sql(url: str) -> None:
    """Same SQL text and parameter order as the ON CONFLICT constructs, with the same bind
    processing per column (JSON serialisation, booleans); no database needed."""
    engine = create_engine(url)

    class _Conn:
        dialect = engine.dialect

    ours = rows._statements(_Conn())  # type: ignore[arg-type]
    columns = [c.key for c in REQUESTS.c]
    for theirs, mine in zip(_constructs(engine.dialect.name), ours, strict=True):
        expected = theirs.compile(dialect=engine.dialect, column_keys=columns)
        got = mine.compile(dialect=engine.dialect)
        assert str(got) == str(expected)
        assert got.positiontup == expected.positiontup
        assert ({k: type(p).__qualname__ for k, p in got._bind_processors.items()}
                == {k: type(p).__qualname__ for k, p in expected._bind_processors.items()})
        assert mine._generate_cache_key() is not None   # what lets SQLAlchemy compile it once


def test_upsert_is_compiled_once(engine: Engine, make_record: Callable[..., RequestRecord]) -> None:
    """The second batch reuses the compiled upsert (the ON CONFLICT construct has no cache key
    and was compiled for every batch)."""
    seen: list[tuple[str, str]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _note(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        seen.append((statement.split(None, 3)[2], str(context.cache_hit)))

    for batch in range(2):
        with engine.begin() as conn:
            rows.upsert_records(conn, [make_record(batch * 10 + i) for i in range(3)])
    upserts = [hit for table, hit in seen if table == "requests"]
    assert len(upserts) == 2
    assert upserts[1].endswith("CACHE_HIT")


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
