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
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, delete, insert, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import BindTyping, Connection

from inferlb.errors import StoreError
from inferlb.store.records import RequestRecord
from inferlb.store.schema import ATTEMPTS as _ATTEMPTS
from inferlb.store.schema import REQUESTS as _REQUESTS
from inferlb.store.schema import to_us

__all__ = ["UNKNOWN_OUTCOME", "clean_json", "clean_str", "is_record_error", "record_rows", "upsert_records"]

UNKNOWN_OUTCOME = "unknown_outcome"

_IN_CHUNK = 500  # ids per DELETE … IN (…): far below SQLite's and PostgreSQL's parameter limits


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


def record_rows(rec: RequestRecord) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``requests`` row and ``request_attempts`` rows for one record (cleaned, µs timestamps)."""
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
        "decision": clean_json(rec.decision),
        "workflow_path": clean_json(list(rec.workflow_path)),
        "tags": clean_json(dict(rec.tags)),
        "engine": _clean_opt(rec.engine),
        "attempt_count": len(attempts),
        "e2e_ms": _ms_between(received, last),
        "ttft_ms": _ms_between(received, first),
        "queue_wait_ms": rec.queue_wait_ms,
        "decisions": clean_json(list(rec.decisions)),
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


_STATEMENTS: dict[str, tuple[Any, Any]] = {}


class _PlainPG(postgresql.base.PGDialect):
    """PostgreSQL's SQL without bind casts (``:name`` stays a plain parameter text() can read)."""

    bind_typing = BindTyping.NONE


_BASE_DIALECTS: dict[str, Any] = {"postgresql": _PlainPG, "sqlite": sqlite.base.SQLiteDialect}


def _cacheable(stmt: Any, conn: Connection) -> Any:
    """``stmt`` (an INSERT of every ``requests`` column) as a ``text()`` construct with the same SQL
    and the columns' types on its parameters. SQLAlchemy has no cache key for the dialects'
    ``ON CONFLICT`` clauses, so it compiled the upsert again for every batch: 0.4 ms per batch, 12 µs
    per record in batches of 34 and far more in the small batches of a lightly loaded gateway
    (docs/benchmarks.md, "The request path profiled again"). A ``text()`` construct is compiled
    once and cached; its typed parameters go through the same bind processing (JSON serialisation,
    booleans) as the columns'."""
    # The dialect's own SQL without driver details (bind casts): the driver's are added when the
    # text() construct is compiled for the connection, as they were for the statement.
    named = _BASE_DIALECTS[conn.dialect.name](paramstyle="named")   # :name parameters, which text() reads
    sql = str(stmt.compile(dialect=named, column_keys=[c.key for c in _REQUESTS.c]))
    return text(sql).bindparams(*(bindparam(c.key, type_=c.type) for c in _REQUESTS.c))


def _statements(conn: Connection) -> tuple[Any, Any]:
    """(upsert, insert-if-absent) for the connection's dialect, built once (:func:`_cacheable`)."""
    name = conn.dialect.name
    got = _STATEMENTS.get(name)
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
        got = _STATEMENTS[name] = (_cacheable(upsert, conn), _cacheable(absent, conn))
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
        row, attempts = record_rows(rec)
        rows.append(row)
        attempt_rows.extend(attempts)
    upsert, insert_if_absent = _statements(conn)
    if unknown:
        conn.execute(insert_if_absent, [record_rows(r)[0] for r in unknown.values()])
    if not rows:
        return
    conn.execute(upsert, rows)
    ids = [r["request_id"] for r in rows]
    for i in range(0, len(ids), _IN_CHUNK):
        conn.execute(delete(_ATTEMPTS).where(_ATTEMPTS.c.request_id.in_(ids[i : i + _IN_CHUNK])))
    if attempt_rows:
        conn.execute(insert(_ATTEMPTS), attempt_rows)


def is_record_error(exc: BaseException) -> bool:
    """True when the data of a record is at fault, not the database (which stays usable)."""
    if isinstance(exc, sa_exc.IntegrityError | sa_exc.DataError):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        return False  # operational, programming (missing table, permissions), interface errors
    if isinstance(exc, sa_exc.StatementError):  # the driver could not bind a value
        exc = exc.orig if exc.orig is not None else exc
    return isinstance(exc, OverflowError | TypeError | ValueError | UnicodeError)
