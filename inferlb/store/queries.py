"""Read side of the audit store: the audit list and one request (the SLA report is :mod:`.sla`,
the parameters :mod:`.report_params`).

Contract:

* Times in and out are epoch seconds (floats, µs precision); the time window is ``since``
  inclusive, ``until`` exclusive, on ``received_at``. :func:`~.report_params.parse_time` turns user input (epoch
  seconds, ISO-8601, or a look-back like ``15m`` / ``24h`` / ``7d``) into that.
* Bad filter values raise :class:`~inferlb.errors.InvalidRequest` naming the parameter, so
  the API answers 400; database failures raise :class:`~inferlb.errors.StoreError`.
* :func:`list_requests` pages by keyset, newest first (``received_at DESC, request_id DESC``): the
  cursor is an opaque url-safe token of the last row's position, so pages never skip or repeat a
  row even while new requests arrive. The ``model`` filter matches the requested or served model.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import literal, or_, select, tuple_
from sqlalchemy.engine import Connection, Engine, RowMapping

from inferlb.errors import InvalidRequest
from inferlb.store.read import run_query
from inferlb.store.report_params import (
    _check_filter,
    _check_window,
    _decode_cursor,
    _encode_cursor,
    _window,
)
from inferlb.store.schema import ATTEMPTS, REQUESTS, from_us

__all__ = ["MAX_LIMIT", "get_request", "list_requests"]

MAX_LIMIT = 1000


# -- rows → dicts ----------------------------------------------------------------------------------

_REQUEST_FIELDS = (
    "request_id", "endpoint", "model_requested", "tenant", "model_served", "model_version", "node",
    "priority", "stream", "status", "http_status", "error_class", "prompt_tokens_est", "prompt_tokens",
    "completion_tokens", "cost_est", "decision", "workflow_path", "tags", "engine", "attempt_count",
    "e2e_ms", "ttft_ms", "queue_wait_ms", "decisions", "process_version", "config_version",
)
_REQUEST_TIMES = ("received_at", "admitted_at", "routed_at", "first_byte_at", "last_byte_at", "deadline_at")
_ATTEMPT_FIELDS = ("number", "node", "model", "outcome", "http_status", "error_class")
_ATTEMPT_TIMES = ("started_at", "ended_at", "first_byte_at")


def _request_dict(row: RowMapping) -> dict[str, Any]:
    out: dict[str, Any] = {f: row[f] for f in _REQUEST_FIELDS}
    for f in _REQUEST_TIMES:
        out[f] = from_us(row[f + "_us"])
    return out


def _attempt_dict(row: RowMapping) -> dict[str, Any]:
    out: dict[str, Any] = {f: row[f] for f in _ATTEMPT_FIELDS}
    for f in _ATTEMPT_TIMES:
        out[f] = from_us(row[f + "_us"])
    return out


# -- queries ---------------------------------------------------------------------------------------


def list_requests(
    engine: Engine,
    *,
    since: float | None = None,
    until: float | None = None,
    model: str | None = None,
    node: str | None = None,
    status: str | None = None,
    tenant: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of requests, newest first, and the cursor of the next page (None on the last)."""
    _check_window(since, until)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {MAX_LIMIT}", param="limit")
    t = REQUESTS.c
    conds = _window(since, until)
    if (m := _check_filter(model, "model")) is not None:
        conds.append(or_(t.model_requested == m, t.model_served == m))
    exact = ((t.node, node, "node"), (t.status, status, "status"), (t.tenant, tenant, "tenant"))
    for col, value, name in exact:
        if (v := _check_filter(value, name)) is not None:
            conds.append(col == v)
    if cursor:
        r, i = _decode_cursor(cursor)
        conds.append(tuple_(t.received_at_us, t.request_id) < tuple_(literal(r), literal(i)))
    stmt = (
        select(REQUESTS)
        .where(*conds)
        .order_by(t.received_at_us.desc(), t.request_id.desc())
        .limit(limit + 1)  # one extra row says whether another page exists
    )
    rows = run_query(engine, lambda conn: list(conn.execute(stmt).mappings()))
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = _encode_cursor(last["received_at_us"], last["request_id"])
    return [_request_dict(r) for r in page], next_cursor


def get_request(engine: Engine, request_id: str) -> dict[str, Any] | None:
    """The whole record with its attempts (by number), or None when there is no such request."""
    if any(ord(c) < 32 for c in request_id) or len(request_id) > 4096:
        return None  # the writer never stores such an id, and PostgreSQL would reject the parameter

    def fetch(conn: Connection) -> dict[str, Any] | None:
        row = conn.execute(select(REQUESTS).where(REQUESTS.c.request_id == request_id)).mappings().first()
        if row is None:
            return None
        attempts = conn.execute(
            select(ATTEMPTS).where(ATTEMPTS.c.request_id == request_id).order_by(ATTEMPTS.c.number)
        ).mappings()
        out = _request_dict(row)
        out["attempts"] = [_attempt_dict(a) for a in attempts]
        return out

    return run_query(engine, fetch)
