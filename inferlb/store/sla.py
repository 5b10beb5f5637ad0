"""The SLA report of the audit store: latency percentiles, errors and SLO attainment per group.

Contract:

* :func:`sla_report` groups by any of :data:`~.report_params.GROUP_BY` (``model`` = the model requested,
  ``version``, ``node`` = the node that answered, ``tenant``, ``priority``, ``stream`` = whether
  the client asked for a streamed answer, true / false; ``served`` = the model that served, which
  for a model alias with tiers is the tier: ``model,served`` is the per-tier report; several at once as
  ``"model,node"``, none as ``"none"``) and, with ``bucket`` (``5m``, ``1h``, …), by time bucket:
  buckets are aligned on the epoch (UTC) and a request falls in the bucket of its ``received_at``;
  a row's ``bucket`` is the bucket's start in epoch seconds. Per group: ``count``; ``ok``;
  ``client_errors`` (statuses caused by the client: ``rejected_invalid``, ``client_closed``);
  ``rejected`` (the tenant's own rate-limit and quota refusals by admission, the 429s
  ``rejected_rate_limit`` and ``rejected_quota``: the client was over what it bought, not failed
  by the service); ``rejected_share = rejected / (count - client_errors)``; ``admitted = count -
  client_errors - rejected``; ``errors`` (every other non-ok status of those: load shedding,
  queue timeouts and a node's own 429s included, since they are the service's failures);
  ``error_rate = errors / admitted``; p50/p95/p99 of e2e latency in ms over the ok
  requests; p50/p95/p99 of TTFT in ms over the ok *streamed* requests only (``ttft_count`` of
  them): a non-streamed answer's first byte comes with its last, so its "TTFT" is its whole
  generation and would mix two quantities in one percentile; ``slo_attainment`` = share of the
  ``admitted`` requests that succeeded within the ``e2e_max_s`` of the SLO for
  their model (exact name, else ``*``) and, streamed ones, its ``ttft_max_s``, null when no
  request of the group has such an SLO; ``slo_p95_met`` (groups keyed by
  model only) whether the group's p95s meet the SLO's ``*_p95_s`` targets. Percentiles use linear
  interpolation between closest ranks (numpy's default, PostgreSQL's ``percentile_cont``): on
  SQLite computed in Python from the fetched rows, on PostgreSQL in the database (sla_sql.py,
  only the aggregates travel), with the same numbers either way. Rows
  are sorted by bucket, then by key values (null last).
* Database failures raise :class:`~inferlb.errors.StoreError`; bad parameters
  :class:`~inferlb.errors.InvalidRequest` (:mod:`.report_params`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.engine import Connection, Engine, RowMapping

from inferlb.config.settings import SLOConfig
from inferlb.store.read import run_query
from inferlb.store.report_params import (
    _check_window,
    _window,
    bucket_of,
    check_buckets,
    group_columns,
    parse_bucket,
    parse_group_by,
)
from inferlb.store.schema import REQUESTS
from inferlb.store.sla_sql import QUANTILES, Tally, slo_table, tally_sql

__all__ = ["CLIENT_STATUSES", "LIMIT_STATUSES", "SLA_COLUMNS", "percentile", "sla_report", "sla_report_python"]

CLIENT_STATUSES = frozenset({"rejected_invalid", "client_closed"})
# Admission's refusals of a tenant over its own limits (admission/controller.py): 429 rate limit
# (RPM, TPM, max_parallel) and 429 insufficient_quota (spend budget). Shedding (rejected_overload,
# rejected_queue_timeout) is the gateway's failure to serve and stays an error.
LIMIT_STATUSES = frozenset({"rejected_rate_limit", "rejected_quota"})
# The keys of every sla_report row after the group key, in order (for tables and CSV headers).
SLA_COLUMNS = (
    "count", "ok", "errors", "client_errors", "rejected", "rejected_share", "admitted", "error_rate",
    "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "ttft_count",
    "slo_attainment", "slo_p95_met",
)


def _none_last(v: Any) -> tuple[bool, str]:
    return (v is None, "" if v is None else str(v))


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
    count = ok = client = rejected = slo_n = slo_good = 0
    e2e: list[float] = []
    ttft: list[float] = []
    for r in rows:
        count += 1
        status = r["status"]
        if status in CLIENT_STATUSES:
            client += 1
            continue
        if status in LIMIT_STATUSES:
            rejected += 1
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
    return Tally(count=count, ok=ok, client=client, rejected=rejected, slo_n=slo_n, slo_good=slo_good,
                 e2e=tuple(percentile(e2e, q) for q in QUANTILES),
                 ttft=tuple(percentile(ttft, q) for q in QUANTILES), ttft_count=len(ttft))


def _group_stats(keys: dict[str, Any], tally: Tally, slos: Sequence[SLOConfig]) -> dict[str, Any]:
    valid = tally.count - tally.client
    admitted = valid - tally.rejected
    errors = admitted - tally.ok
    out: dict[str, Any] = {
        **keys,
        "count": tally.count,
        "ok": tally.ok,
        "errors": errors,
        "client_errors": tally.client,
        "rejected": tally.rejected,
        "rejected_share": round(tally.rejected / valid, 6) if valid else None,
        "admitted": admitted,
        "error_rate": round(errors / admitted, 6) if admitted else None,
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
                     client_statuses=CLIENT_STATUSES, limit_statuses=LIMIT_STATUSES)


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
    groups = run_query(engine, lambda conn: tally(conn, keys, bucket_us, where, slos))

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
