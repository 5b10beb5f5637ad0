"""Read side of the audit store: the audit list, one request, the SLA report.

Contract:

* Times in and out are epoch seconds (floats, µs precision); the time window is ``since``
  inclusive, ``until`` exclusive, on ``received_at``. :func:`parse_time` turns user input (epoch
  seconds, ISO-8601, or a look-back like ``15m`` / ``24h`` / ``7d``) into that.
* Bad filter values raise :class:`~inferlb.engine.errors.InvalidRequest` naming the parameter, so
  the API answers 400; database failures raise :class:`~inferlb.engine.errors.StoreError`.
* :func:`list_requests` pages by keyset, newest first (``received_at DESC, request_id DESC``): the
  cursor is an opaque url-safe token of the last row's position, so pages never skip or repeat a
  row even while new requests arrive. The ``model`` filter matches the requested or served model.
* :func:`sla_report` groups by any of :data:`GROUP_BY` (``model`` = the model requested,
  ``version``, ``node`` = the node that answered, ``tenant``, ``priority``, ``stream`` = whether
  the client asked for a streamed answer, true / false; several at once as
  ``"model,node"``, none as ``"none"``) and, with ``bucket`` (``5m``, ``1h``, …), by time bucket:
  buckets are aligned on the epoch (UTC) and a request falls in the bucket of its ``received_at``;
  a row's ``bucket`` is the bucket's start in epoch seconds. Per group: ``count``; ``ok``;
  ``client_errors`` (statuses caused by the client: ``rejected_invalid``, ``client_closed``);
  ``errors`` (every other non-ok status, load shedding included);
  ``error_rate = errors / (count - client_errors)``; p50/p95/p99 of e2e latency in ms over the ok
  requests; p50/p95/p99 of TTFT in ms over the ok *streamed* requests only (``ttft_count`` of
  them): a non-streamed answer's first byte comes with its last, so its "TTFT" is its whole
  generation and would mix two quantities in one percentile; ``slo_attainment`` = share of the
  eligible (non-client-error) requests that succeeded within the ``e2e_max_s`` of the SLO for
  their model (exact name, else ``*``) and, streamed ones, its ``ttft_max_s``, null when no
  request of the group has such an SLO; ``slo_p95_met`` (groups keyed by
  model only) whether the group's p95s meet the SLO's ``*_p95_s`` targets. Percentiles use linear
  interpolation between closest ranks (numpy's default, PostgreSQL's ``percentile_cont``): on
  SQLite computed in Python from the fetched rows, on PostgreSQL in the database (sla_sql.py,
  only the aggregates travel), with the same numbers either way. Rows
  are sorted by bucket, then by key values (null last).
* :func:`parse_group_by` and :func:`parse_bucket` validate those two parameters for every report
  (the cost report of :mod:`.ledger` shares them); a window may hold at most :data:`MAX_BUCKETS`.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, func, literal, or_, select, tuple_
from sqlalchemy.engine import Connection, Engine, RowMapping
from sqlalchemy.exc import SQLAlchemyError

from ..errors import InvalidRequest, StoreError
from ..settings import SLOConfig
from .db import describe_db_error
from .models import ATTEMPTS, REQUESTS, from_us
from .sla_sql import QUANTILES, Tally, slo_table, tally_sql

__all__ = [
    "CLIENT_STATUSES",
    "GROUP_BY",
    "MAX_BUCKETS",
    "MAX_LIMIT",
    "SLA_COLUMNS",
    "bucket_of",
    "check_buckets",
    "get_request",
    "group_columns",
    "list_requests",
    "parse_bucket",
    "parse_group_by",
    "parse_time",
    "percentile",
    "run_query",
    "sla_report",
    "sla_report_python",
    "time_window",
]

MAX_LIMIT = 1000
MAX_BUCKETS = 10_000
GROUP_BY = ("model", "version", "node", "tenant", "priority", "stream")
CLIENT_STATUSES = frozenset({"rejected_invalid", "client_closed"})
# The keys of every sla_report row after the group key, in order (for tables and CSV headers).
SLA_COLUMNS = (
    "count", "ok", "errors", "client_errors", "error_rate",
    "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "ttft_count",
    "slo_attainment", "slo_p95_met",
)
_MAX_EPOCH = 253_402_300_800.0  # 10000-01-01: beyond what ISO-8601 can name
_MAX_FILTER_LEN = 512
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_T = TypeVar("_T")


# -- input validation ------------------------------------------------------------------------------


def parse_time(value: str | float | None, *, param: str, now: float | None = None) -> float | None:
    """Epoch seconds from epoch seconds, ISO-8601 (naive means UTC) or ``<n>[smhdw]`` ago."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        text = value.strip()
        m = _DURATION.match(text)
        if m:
            base = time.time() if now is None else now
            t = base - float(m.group(1)) * _UNIT_S[m.group(2)]
        else:
            try:
                t = float(text)
            except ValueError:
                try:
                    dt = datetime.fromisoformat(text)
                except ValueError:
                    raise InvalidRequest(
                        f"'{param}' must be epoch seconds, ISO-8601 or a look-back like 24h",
                        param=param, code="invalid_time") from None
                t = (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    else:
        t = float(value)
    if not math.isfinite(t) or not 0 <= t < _MAX_EPOCH:
        raise InvalidRequest(f"'{param}' is out of range", param=param, code="invalid_time")
    return t


def _check_window(since: float | None, until: float | None) -> None:
    for name, t in (("since", since), ("until", until)):
        if t is not None and (not math.isfinite(t) or not 0 <= t < _MAX_EPOCH):
            raise InvalidRequest(f"'{name}' is out of range", param=name, code="invalid_time")
    if since is not None and until is not None and since > until:
        raise InvalidRequest("'since' is after 'until'", param="since", code="invalid_time")


def _check_filter(value: str | None, param: str) -> str | None:
    if value is None:
        return None
    # PostgreSQL rejects NUL in a text parameter; a client must get 400, never 500.
    if len(value) > _MAX_FILTER_LEN or any(ord(c) < 32 for c in value):
        raise InvalidRequest(f"'{param}' is not a valid value", param=param)
    return value


def parse_group_by(value: str | Sequence[str] | None, *, default: str = "model") -> tuple[str, ...]:
    """``"model,node"`` (or a sequence) → ``("model", "node")``; ``"none"`` → ``()``; else 400."""
    if value is None or (isinstance(value, str) and not value.strip()):
        value = default
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if parts == ["none"]:
            return ()
    else:
        parts = [str(p).strip() for p in value]   # already parsed: () means no grouping
        if not parts:
            return ()
    if not parts or len(parts) > 3 or len(set(parts)) != len(parts) or any(p not in GROUP_BY for p in parts):
        raise InvalidRequest(f"'group_by' must be 'none' or up to 3 distinct of {', '.join(GROUP_BY)}, "
                             "comma-separated", param="group_by")
    return tuple(parts)


def parse_bucket(value: str | float | None) -> int | None:
    """A bucket width (``30s``, ``5m``, ``1h``, ``1d``, or seconds) in µs; None for no bucketing."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    text = str(value).strip()
    m = _DURATION.match(text)
    try:
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)] if m else float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or not 1 <= seconds <= 366 * 86_400:
        raise InvalidRequest("'bucket' must be a duration from 1s to 366d, like 5m or 1h", param="bucket",
                             code="invalid_bucket")
    return round(seconds * 1_000_000)


def bucket_of(t_us: int, bucket_us: int) -> int:
    """The start (epoch µs) of the epoch-aligned bucket holding ``t_us``."""
    return t_us - t_us % bucket_us


def check_buckets(lo_us: int, hi_us: int, bucket_us: int | None) -> None:
    """400 when ``[lo_us, hi_us]`` spans more than :data:`MAX_BUCKETS` buckets."""
    if bucket_us is not None and hi_us >= lo_us and (
            bucket_of(hi_us, bucket_us) - bucket_of(lo_us, bucket_us)) // bucket_us >= MAX_BUCKETS:
        raise InvalidRequest(f"the window holds more than {MAX_BUCKETS} buckets: use a larger 'bucket'",
                             param="bucket", code="too_many_buckets")


def group_columns() -> dict[str, ColumnElement[Any]]:
    """The ``requests`` column behind each group key."""
    t = REQUESTS.c
    return {"model": t.model_requested, "version": t.model_version, "node": t.node, "tenant": t.tenant,
            "priority": t.priority, "stream": t.stream}


def _none_last(v: Any) -> tuple[bool, str]:
    return (v is None, "" if v is None else str(v))


def _encode_cursor(received_us: int, request_id: str) -> str:
    raw = json.dumps({"v": 1, "r": received_us, "i": request_id}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _decode_cursor(cursor: str) -> tuple[int, str]:
    bad = InvalidRequest(
        "'cursor' is not a cursor returned by this API", param="cursor", code="invalid_cursor"
    )
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError):
        raise bad from None
    if not isinstance(data, dict) or data.get("v") != 1:
        raise bad
    r, i = data.get("r"), data.get("i")
    if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < _MAX_EPOCH * 1_000_000:
        raise bad
    if not isinstance(i, str) or _check_filter(i, "cursor") is None:
        raise bad
    return r, i


def _run(engine: Engine, fn: Callable[[Connection], _T]) -> _T:
    """The one place this module's database errors become StoreError."""
    try:
        with engine.connect() as conn:
            return fn(conn)
    except SQLAlchemyError as exc:
        raise StoreError(f"audit query failed: {describe_db_error(exc)}") from exc


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


def _window(since: float | None, until: float | None) -> list[ColumnElement[bool]]:
    conds: list[ColumnElement[bool]] = []
    col = REQUESTS.c.received_at_us
    # Rounded like the writer rounds received_at, so a request received exactly at ``since`` is in.
    if since is not None:
        conds.append(col >= round(since * 1_000_000))
    if until is not None:
        conds.append(col < round(until * 1_000_000))
    return conds


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
    rows = _run(engine, lambda conn: list(conn.execute(stmt).mappings()))
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

    return _run(engine, fetch)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (``percentile_cont``); None for no values."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _slo_for(model: str, slos: Sequence[SLOConfig]) -> SLOConfig | None:
    exact, star = slo_table(slos)
    return exact.get(model) or star


def _within(slo: SLOConfig, e2e_ms: float | None, ttft_ms: float | None, streamed: bool) -> bool:
    if slo.e2e_max_s is not None and (e2e_ms is None or e2e_ms > slo.e2e_max_s * 1000):
        return False
    # TTFT targets apply to streamed answers: a non-streamed one has no first token before its last.
    return not (streamed and slo.ttft_max_s is not None and (ttft_ms is None or ttft_ms > slo.ttft_max_s * 1000))


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _tally_rows(rows: Iterable[RowMapping], slos: Sequence[SLOConfig]) -> Tally:
    """One group's tally from its fetched rows (the Python path; sla_sql.py is the database one)."""
    exact, star = slo_table(slos)
    count = ok = client = slo_n = slo_good = 0
    e2e: list[float] = []
    ttft: list[float] = []
    for r in rows:
        count += 1
        status = r["status"]
        if status in CLIENT_STATUSES:
            client += 1
            continue
        is_ok = status == "ok"
        if is_ok:
            ok += 1
            if r["e2e_ms"] is not None:
                e2e.append(r["e2e_ms"])
            if r["ttft_ms"] is not None and r["stream"]:
                ttft.append(r["ttft_ms"])
        slo = exact.get(r["model_requested"]) or star
        if slo is not None and (slo.e2e_max_s is not None or slo.ttft_max_s is not None):
            slo_n += 1
            slo_good += is_ok and _within(slo, r["e2e_ms"], r["ttft_ms"], bool(r["stream"]))
    e2e.sort()
    ttft.sort()
    return Tally(count=count, ok=ok, client=client, slo_n=slo_n, slo_good=slo_good,
                 e2e=tuple(percentile(e2e, q) for q in QUANTILES),
                 ttft=tuple(percentile(ttft, q) for q in QUANTILES), ttft_count=len(ttft))


def _group_stats(keys: dict[str, Any], tally: Tally, slos: Sequence[SLOConfig]) -> dict[str, Any]:
    eligible = tally.count - tally.client
    errors = eligible - tally.ok
    out: dict[str, Any] = {
        **keys,
        "count": tally.count,
        "ok": tally.ok,
        "errors": errors,
        "client_errors": tally.client,
        "error_rate": round(errors / eligible, 6) if eligible else None,
    }
    for name, values in (("e2e", tally.e2e), ("ttft", tally.ttft)):
        for q, v in zip((50, 95, 99), values, strict=True):
            out[f"{name}_p{q}_ms"] = _ms(v)
    out["ttft_count"] = tally.ttft_count
    out["slo_attainment"] = round(tally.slo_good / tally.slo_n, 6) if tally.slo_n else None
    out["slo_p95_met"] = None
    if keys.get("model") is not None:
        slo = _slo_for(keys["model"], slos)
        checks = []
        if slo is not None and slo.e2e_p95_s is not None and out["e2e_p95_ms"] is not None:
            checks.append(out["e2e_p95_ms"] <= slo.e2e_p95_s * 1000)
        if slo is not None and slo.ttft_p95_s is not None and out["ttft_p95_ms"] is not None:
            checks.append(out["ttft_p95_ms"] <= slo.ttft_p95_s * 1000)
        out["slo_p95_met"] = all(checks) if checks else None
    return out


def _tallies_python(conn: Connection, keys: tuple[str, ...], bucket_us: int | None,
                    where: list[ColumnElement[bool]], slos: Sequence[SLOConfig]) -> dict[tuple[Any, ...], Tally]:
    t = REQUESTS.c
    cols = group_columns()
    stmt = select(*(cols[k].label(f"g_{k}") for k in keys), t.received_at_us, t.model_requested, t.status,
                  t.e2e_ms, t.ttft_ms, t.stream).where(*where)
    groups: dict[tuple[Any, ...], list[RowMapping]] = {}
    lo = hi = None
    for r in conn.execute(stmt).mappings():
        g: tuple[Any, ...] = tuple(r[f"g_{k}"] for k in keys)
        if bucket_us is not None:
            at = r["received_at_us"]
            lo, hi = (at, at) if lo is None or hi is None else (min(lo, at), max(hi, at))
            check_buckets(lo, hi, bucket_us)
            g = (bucket_of(at, bucket_us), *g)
        groups.setdefault(g, []).append(r)
    return {g: _tally_rows(rows, slos) for g, rows in groups.items()}


def _tallies_sql(conn: Connection, keys: tuple[str, ...], bucket_us: int | None,
                 where: list[ColumnElement[bool]], slos: Sequence[SLOConfig]) -> dict[tuple[Any, ...], Tally]:
    if bucket_us is not None:   # the bucket bound first, from the window's extremes (an index lookup)
        col = REQUESTS.c.received_at_us
        lo, hi = conn.execute(select(func.min(col), func.max(col)).where(*where)).one()
        if lo is not None:
            check_buckets(lo, hi, bucket_us)
    cols = group_columns()
    return tally_sql(conn, group=[cols[k] for k in keys], bucket_us=bucket_us, where=where, slos=slos,
                     client_statuses=CLIENT_STATUSES)


def sla_report(
    engine: Engine,
    *,
    since: float | None = None,
    until: float | None = None,
    group_by: str | Sequence[str] = "model",
    bucket: str | float | None = None,
    slos: Sequence[SLOConfig] = (),
    in_database: bool | None = None,
) -> list[dict[str, Any]]:
    """Per-group (and per-bucket) latency, errors and SLO attainment (see the module docstring).

    ``in_database``: aggregate in the database (sla_sql.py) or in Python from the fetched rows;
    None (the default) chooses the database on PostgreSQL, Python on SQLite. Both give one report.
    """
    _check_window(since, until)
    keys = parse_group_by(group_by)
    bucket_us = parse_bucket(bucket)
    if bucket_us is not None and since is not None and until is not None:
        check_buckets(round(since * 1e6), round(until * 1e6), bucket_us)
    where = _window(since, until)
    sql = engine.dialect.name == "postgresql" if in_database is None else in_database
    tally = _tallies_sql if sql else _tallies_python
    groups = _run(engine, lambda conn: tally(conn, keys, bucket_us, where, slos))

    def order(g: tuple[Any, ...]) -> tuple[Any, ...]:
        if bucket_us is None:
            return tuple(_none_last(v) for v in g)
        return (g[0], *(_none_last(v) for v in g[1:]))

    out = []
    for g in sorted(groups, key=order):
        head: dict[str, Any] = {}
        values = list(g)
        if bucket_us is not None:
            head["bucket"] = values.pop(0) / 1_000_000
        head.update(zip(keys, values, strict=True))
        out.append(_group_stats(head, groups[g], slos))
    return out


def sla_report_python(engine: Engine, **kwargs: Any) -> list[dict[str, Any]]:
    """:func:`sla_report` aggregated in Python on every database (the reference; benchmarks, tests)."""
    return sla_report(engine, in_database=False, **kwargs)


def run_query(engine: Engine, fn: Callable[[Connection], _T]) -> _T:
    """Run ``fn`` on a connection; database errors become StoreError (for the other report modules)."""
    return _run(engine, fn)


def time_window(since: float | None, until: float | None) -> list[ColumnElement[bool]]:
    """Validated ``received_at`` conditions for ``[since, until)``."""
    _check_window(since, until)
    return _window(since, until)

