"""Audit records as database rows: cleaning, the ``requests`` / ``request_attempts`` rows, the
idempotent batch upsert, and which errors are a record's fault.

Contract: :func:`upsert_records` writes a batch on a caller-owned connection as ``INSERT … ON
CONFLICT (request_id) DO UPDATE`` (the last version of a request in the batch wins; its attempts are
replaced). On PostgreSQL the conflict target is ``(request_id, received_at_us)``, the primary key of
the partitioned table (migration 0007); a request keeps its ``received_at`` across submissions.
A record with status ``unknown_outcome`` (a request recovered from the write-ahead log
with no finished record) is inserted with ``ON CONFLICT DO NOTHING``: it never replaces a row that
holds the request's real outcome.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import bindparam, delete, insert
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from inferlb.errors import StoreError
from inferlb.jsoncodec import dumps
from inferlb.store.records import RequestRecord
from inferlb.store.schema import ATTEMPTS as _ATTEMPTS
from inferlb.store.schema import REQUESTS as _REQUESTS
from inferlb.store.schema import to_us

__all__ = ["UNKNOWN_OUTCOME", "clean_json", "clean_str", "is_record_error", "json_text", "record_rows",
           "upsert_records"]

UNKNOWN_OUTCOME = "unknown_outcome"

# json_text's fast path: orjson refuses (and the cleaning path writes) what it would write otherwise
# than the cleaned copy: non-string keys, subclasses, dataclasses, dates.
_STRICT_JSON = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


# -- record → rows ---------------------------------------------------------------------------------


def clean_str(s: str) -> str:
    """``s`` as both databases store it: NUL becomes U+FFFD, lone surrogates are replaced."""
    if "\x00" in s:
        s = s.replace("\x00", "\ufffd")
    if s.isascii():   # the common case: no surrogate possible, no encode needed
        return s
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: neither database's UTF-8 encoding accepts them
        s = s.encode("utf-8", "replace").decode("utf-8")
    return s


def _clean_opt(s: str | None) -> str | None:
    return None if s is None else clean_str(str(s))


def clean_json(v: Any) -> Any:
    """``v`` with strings cleaned (:func:`clean_str`) and non-finite floats as null."""
    t = type(v)   # exact types first: this runs for every value of every record
    if t is str:
        return clean_str(v)
    if t is int or t is bool or v is None:
        return v
    if t is dict:
        return {(k if type(k) is str and k.isascii() and "\x00" not in k else clean_str(str(k))): clean_json(x)
                for k, x in v.items()}
    if t is list:
        return [clean_json(x) for x in v]
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return clean_str(v)
    if isinstance(v, bool | int):
        return v
    if isinstance(v, dict):
        return {clean_str(str(k)): clean_json(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [clean_json(x) for x in v]
    return clean_str(str(v))


def _ms_between(start_us: int | None, end_us: int | None) -> float | None:
    return None if start_us is None or end_us is None else (end_us - start_us) / 1000.0


def json_text(v: Any) -> str:
    """The text a JSON column stores for ``v``: ``dumps(clean_json(v))``, the document the
    column's own type wrote before (None is the JSON ``null``, as SQLAlchemy's ``JSON`` writes it).

    Fast path: orjson writes ``v`` as it is when nothing in it needs cleaning (no NUL, no lone
    surrogate, string keys, only JSON types: strict options, so anything else raises) and then the
    document is the same; otherwise the cleaned copy is written. 2–3× cheaper for a routing decision
    than cleaning a copy first, on every record (docs/benchmarks.md, "The audit path's CPU")."""
    try:
        out = orjson.dumps(v, option=_STRICT_JSON)
    except TypeError:   # orjson.JSONEncodeError: a key, a type, a surrogate or an int it will not write
        pass
    else:
        # orjson escapes NUL as \u0000; the same bytes can also come from a literal backslash
        # followed by "u0000" (escaped as \\u0000): the slow path then writes it, correctly.
        if b"\\u0000" not in out:
            return out.decode()
    return dumps(clean_json(v)).decode()


def record_rows(rec: RequestRecord) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``requests`` row and ``request_attempts`` rows for one record (cleaned, µs timestamps)."""
    return _record_rows(rec, clean_json)


def _record_rows(rec: RequestRecord, js: Callable[[Any], Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """:func:`record_rows` with ``js`` making the JSON columns' values (``clean_json``: Python
    values for SQLAlchemy's JSON type; :func:`json_text`: the text, for the driver)."""
    received = to_us(rec.received_at) or 0
    first = to_us(rec.first_byte_at)
    last = to_us(rec.last_byte_at)
    attempts: dict[int, dict[str, Any]] = {}
    for a in rec.attempts:
        # A repeated attempt number would violate the primary key; the later entry wins.
        attempts[int(a.number)] = {
            "request_id": clean_str(rec.request_id),
            "number": int(a.number),
            "node": clean_str(str(a.node)),
            "model": clean_str(str(a.model)),
            "started_at_us": to_us(a.started_at) or 0,
            "ended_at_us": to_us(a.ended_at),
            "outcome": clean_str(str(a.outcome)),
            "http_status": a.http_status,
            "error_class": _clean_opt(a.error_class),
            "first_byte_at_us": to_us(a.first_byte_at),
        }
    row = {
        "request_id": clean_str(rec.request_id),
        "received_at_us": received,
        "endpoint": clean_str(str(rec.endpoint)),
        "model_requested": clean_str(str(rec.model_requested)),
        "tenant": _clean_opt(rec.tenant),
        "model_served": _clean_opt(rec.model_served),
        "model_version": _clean_opt(rec.model_version),
        "node": _clean_opt(rec.node),
        "priority": _clean_opt(rec.priority),
        "stream": bool(rec.stream),
        "status": clean_str(str(rec.status)),
        "http_status": rec.http_status,
        "error_class": _clean_opt(rec.error_class),
        "admitted_at_us": to_us(rec.admitted_at),
        "routed_at_us": to_us(rec.routed_at),
        "first_byte_at_us": first,
        "last_byte_at_us": last,
        "prompt_tokens_est": rec.prompt_tokens_est,
        "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": rec.completion_tokens,
        "cost_est": rec.cost_est,
        "decision": js(rec.decision),
        "workflow_path": js(list(rec.workflow_path)),
        "tags": js(dict(rec.tags)),
        "engine": _clean_opt(rec.engine),
        "attempt_count": len(attempts),
        "e2e_ms": _ms_between(received, last),
        "ttft_ms": _ms_between(received, first),
        "queue_wait_ms": rec.queue_wait_ms,
        "decisions": js(list(rec.decisions)),
        "deadline_at_us": to_us(rec.deadline_at),
        "process_version": _clean_opt(rec.process_version),
        "config_version": _clean_opt(rec.config_version),
    }
    return row, sorted(attempts.values(), key=lambda r: int(r["number"]))


def _insert_stmt(conn: Connection) -> Any:
    name = conn.dialect.name
    if name == "postgresql":
        return postgresql.insert(_REQUESTS)
    if name == "sqlite":
        return sqlite.insert(_REQUESTS)
    raise StoreError(f"unsupported database dialect {name!r} (use SQLite or PostgreSQL)")


@dataclass(frozen=True)
class _DriverSQL:
    """The batch upsert's statements as the driver's own SQL text (see :func:`_driver_sql`)."""

    upsert: str
    insert_if_absent: str
    attempts: str      # INSERT of one request_attempts row
    delete_attempts: str   # DELETE of one request's attempts


_DRIVER_SQL: dict[str, _DriverSQL] = {}


def _driver_dialect(conn: Connection) -> Any:
    """The dialect that writes SQL the driver reads with a dict of parameters per row: the
    connection's own for PostgreSQL (psycopg's ``%(name)s``, with its bind casts such as
    ``::JSONB``), SQLite's with ``:name`` parameters (sqlite3 reads them whatever SQLAlchemy's
    paramstyle; its default ``?`` would need tuples)."""
    if conn.dialect.name == "sqlite":
        return sqlite.base.SQLiteDialect(paramstyle="named")
    return conn.dialect


def _driver_sql(conn: Connection) -> _DriverSQL:
    """The upsert, insert-if-absent, attempt insert and attempt delete for the connection's
    dialect, compiled once from SQLAlchemy's constructs into the driver's SQL text.

    They run through ``exec_driver_sql`` with rows :func:`_record_rows` builds in the form the
    driver binds (JSON columns as text, :func:`json_text`): SQLAlchemy's per-row parameter
    processing (a dict built per row from the compiled parameters, then each column type's bind
    processor) was a third of the database thread's CPU per record (docs/benchmarks.md, "The audit
    path's CPU"). Its errors are still mapped as before (IntegrityError, DataError …), so
    :func:`is_record_error` reads them the same way. Before this, the ``ON CONFLICT`` constructs
    (no SQLAlchemy cache key) were compiled into cached ``text()`` constructs for the same reason
    at batch level (docs/benchmarks.md, "The request path profiled again")."""
    name = conn.dialect.name
    got = _DRIVER_SQL.get(name)
    if got is None:
        stmt = _insert_stmt(conn)
        # PostgreSQL's requests is partitioned by received_at_us (migration 0007): its primary key,
        # the only conflict target it has, holds the partition key too.
        target = [_REQUESTS.c.request_id]
        if name == "postgresql":
            target.append(_REQUESTS.c.received_at_us)
        keys = {c.name for c in target}
        upsert = stmt.on_conflict_do_update(
            index_elements=target,
            set_={c.name: stmt.excluded[c.name] for c in _REQUESTS.c if c.name not in keys},
        )
        absent = _insert_stmt(conn).on_conflict_do_nothing(index_elements=target)
        dialect = _driver_dialect(conn)
        columns = [c.key for c in _REQUESTS.c]

        def sql(construct: Any, cols: list[str] | None = None) -> str:
            return str(construct.compile(dialect=dialect, column_keys=cols))

        got = _DRIVER_SQL[name] = _DriverSQL(
            upsert=sql(upsert, columns), insert_if_absent=sql(absent, columns),
            attempts=sql(insert(_ATTEMPTS), [c.key for c in _ATTEMPTS.c]),
            delete_attempts=sql(delete(_ATTEMPTS).where(_ATTEMPTS.c.request_id == bindparam("request_id"))))
    return got


def upsert_records(conn: Connection, records: Sequence[RequestRecord]) -> None:
    """Upsert ``records`` (requests + their attempts) on ``conn``; the caller owns the transaction."""
    latest: dict[str, RequestRecord] = {}
    unknown: dict[str, RequestRecord] = {}
    for rec in records:  # ON CONFLICT cannot touch one row twice in a statement: last version wins
        if rec.status == UNKNOWN_OUTCOME:
            if rec.request_id not in latest:
                unknown[rec.request_id] = rec
            continue
        unknown.pop(rec.request_id, None)
        latest.pop(rec.request_id, None)
        latest[rec.request_id] = rec
    rows: list[dict[str, Any]] = []
    attempt_rows: list[dict[str, Any]] = []
    for rec in latest.values():
        row, attempts = _record_rows(rec, json_text)
        rows.append(row)
        attempt_rows.extend(attempts)
    sql = _driver_sql(conn)
    if unknown:
        conn.exec_driver_sql(sql.insert_if_absent, [_record_rows(r, json_text)[0] for r in unknown.values()])
    if not rows:
        return
    conn.exec_driver_sql(sql.upsert, rows)
    # One statement text for any batch size (a DELETE … IN of n ids was a new prepared statement
    # for every n: store/db.py's SQLITE_CACHED_STATEMENTS).
    conn.exec_driver_sql(sql.delete_attempts, [{"request_id": r["request_id"]} for r in rows])
    if attempt_rows:
        conn.exec_driver_sql(sql.attempts, attempt_rows)


def is_record_error(exc: BaseException) -> bool:
    """True when the data of a record is at fault, not the database (which stays usable)."""
    if isinstance(exc, sa_exc.IntegrityError | sa_exc.DataError):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        return False  # operational, programming (missing table, permissions), interface errors
    if isinstance(exc, sa_exc.StatementError):  # the driver could not bind a value
        exc = exc.orig if exc.orig is not None else exc
    return isinstance(exc, OverflowError | TypeError | ValueError | UnicodeError)
