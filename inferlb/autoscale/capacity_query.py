"""Read side for autoscaling and the capacity report: load series and node-buckets, aggregated in SQL.

Contract:

* Tokens are prompt + completion (the unit of the forecasts, the capacity model and the cost
  ledger's ``cost_per_1k_tokens``); a request without counted prompt tokens (rejected before a
  node answered) counts its estimate, so shed demand is still demand.
* :func:`load_series`: per model **requested** (the demand clients make), one value per step of
  ``[since, until)``: tokens/s and arrivals/s; steps without a request are 0. Steps are aligned on
  ``since``.
* :func:`node_buckets`: per node, model served and bucket (aligned on the epoch): tokens,
  requests eligible for the SLO (client errors excluded) and those within it, by the SLO rule of
  the SLA report (:mod:`.sla`: ``e2e_max_s``, and ``ttft_max_s`` for streamed answers). Models
  without an SLO count every ``ok`` request as within it. And the measured speed: Σ e2e ms and
  Σ completion tokens of the ok requests with both (``ok_ms`` / ``ok_tokens``). And the one
  saturation signal the audit trail holds: requests that waited ≥ :data:`QUEUED_MS` in the
  gateway's admission queue (``queued``; :attr:`~.capacity.NodeBucket.saturated`).
* Aggregation happens in the database (``GROUP BY``), identically on SQLite and PostgreSQL, so a
  week of audit rows is one grouped scan of the ``received_at`` index, not rows shipped to Python.
  Database errors become :class:`~inferlb.errors.StoreError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, case, func, literal, or_, select
from sqlalchemy.engine import Connection, Engine

from inferlb.autoscale.capacity import NodeBucket
from inferlb.config.settings import SLOConfig
from inferlb.errors import InvalidRequest
from inferlb.store.read import run_query
from inferlb.store.schema import REQUESTS
from inferlb.store.sla import CLIENT_STATUSES

__all__ = ["QUEUED_MS", "SeriesData", "load_series", "node_buckets", "slo_condition"]

QUEUED_MS = 100.0   # a request that waited this long in the admission queue found its node full


@dataclass(frozen=True)
class SeriesData:
    """One model's series over ``[start, start + len × step_s)``."""

    start: float
    step_s: float
    tokens_per_s: tuple[float, ...]
    arrivals_per_s: tuple[float, ...]


def _tokens() -> ColumnElement[int]:
    t = REQUESTS.c
    return func.coalesce(t.prompt_tokens, t.prompt_tokens_est, 0) + func.coalesce(t.completion_tokens, 0)


def _check(since: float, until: float, step_s: float, most: int = 1_000_000) -> None:
    if not (math.isfinite(since) and math.isfinite(until) and until > since):
        raise InvalidRequest("the window must have since < until", param="since")
    if not (math.isfinite(step_s) and step_s >= 1):
        raise InvalidRequest("the step must be at least 1 s", param="bucket")
    if (until - since) / step_s > most:
        raise InvalidRequest(f"at most {most:,} steps per window", param="bucket")


def load_series(engine: Engine, *, since: float, until: float, step_s: float,
                models: Sequence[str] | None = None) -> dict[str, SeriesData]:
    """Tokens/s and arrivals/s per model requested, per step (see the module docstring)."""
    _check(since, until, step_s)
    t = REQUESTS.c
    since_us, until_us, step_us = round(since * 1e6), round(until * 1e6), round(step_s * 1e6)
    n = math.ceil((until_us - since_us) / step_us)
    idx = ((t.received_at_us - since_us) // step_us).label("i")
    stmt = (select(t.model_requested, idx, func.count().label("n"), func.sum(_tokens()).label("tok"))
            .where(t.received_at_us >= since_us, t.received_at_us < until_us)
            .group_by(t.model_requested, idx))
    if models is not None:
        stmt = stmt.where(t.model_requested.in_(list(models)))
    tokens: dict[str, list[float]] = {}
    arrivals: dict[str, list[float]] = {}

    def fetch(conn: Connection) -> None:
        for r in conn.execute(stmt).mappings():
            i = int(r["i"])
            if not 0 <= i < n:
                continue
            m = r["model_requested"]
            tokens.setdefault(m, [0.0] * n)[i] = float(r["tok"] or 0) / step_s
            arrivals.setdefault(m, [0.0] * n)[i] = float(r["n"]) / step_s

    run_query(engine, fetch)
    for m in models or ():
        tokens.setdefault(m, [0.0] * n)
        arrivals.setdefault(m, [0.0] * n)
    return {m: SeriesData(since, step_s, tuple(tokens[m]), tuple(arrivals[m])) for m in sorted(tokens)}


def slo_condition(slos: Sequence[SLOConfig]) -> ColumnElement[bool]:
    """SQL: the request succeeded within its model's SLO (the SLA report's rule, in the database)."""
    t = REQUESTS.c

    def within(slo: SLOConfig) -> ColumnElement[bool]:
        parts: list[ColumnElement[bool]] = [t.status == "ok"]
        if slo.e2e_max_s is not None:
            parts.append(and_(t.e2e_ms.is_not(None), t.e2e_ms <= slo.e2e_max_s * 1000))
        if slo.ttft_max_s is not None:
            parts.append(or_(t.stream.is_(False),
                             and_(t.ttft_ms.is_not(None), t.ttft_ms <= slo.ttft_max_s * 1000)))
        return and_(*parts)

    exact = [s for s in slos if s.model != "*"]
    star = next((s for s in slos if s.model == "*"), None)
    default = within(star) if star is not None else (t.status == "ok")
    if not exact:
        return default
    whens = [(t.model_requested == s.model, within(s)) for s in exact]
    return case(*whens, else_=default) == literal(True)


def node_buckets(engine: Engine, *, since: float, until: float, bucket_s: float, node_gpu: Mapping[str, str],
                 slos: Sequence[SLOConfig] = ()) -> list[NodeBucket]:
    """Per node × model served × bucket: tokens, eligible requests, requests within the SLO."""
    _check(since, until, bucket_s)
    t = REQUESTS.c
    step_us = round(bucket_s * 1e6)
    b = (t.received_at_us // step_us).label("b")
    ok_slo = func.sum(case((slo_condition(slos), 1), else_=0)).label("in_slo")
    timed = and_(t.status == "ok", t.e2e_ms.is_not(None), t.completion_tokens > 0)
    ok_ms = func.sum(case((timed, t.e2e_ms), else_=0.0)).label("ok_ms")
    ok_tokens = func.sum(case((timed, t.completion_tokens), else_=0)).label("ok_tokens")
    queued = func.sum(case((t.queue_wait_ms >= QUEUED_MS, 1), else_=0)).label("queued")
    stmt = (select(t.node, t.model_served, b, func.count().label("n"), func.sum(_tokens()).label("tok"), ok_slo,
                   ok_ms, ok_tokens, queued)
            .where(t.received_at_us >= round(since * 1e6), t.received_at_us < round(until * 1e6),
                   t.node.is_not(None), t.model_served.is_not(None), t.status.not_in(sorted(CLIENT_STATUSES)))
            .group_by(t.node, t.model_served, b)
            .order_by(t.node, t.model_served, b))

    def fetch(conn: Connection) -> list[NodeBucket]:
        return [NodeBucket(r["model_served"], node_gpu.get(r["node"], "unknown"), r["node"], bucket_s,
                           int(r["tok"] or 0), int(r["n"]), int(r["in_slo"] or 0), int(r["b"]) * step_us / 1e6,
                           float(r["ok_ms"] or 0.0), int(r["ok_tokens"] or 0), int(r["queued"] or 0))
                for r in conn.execute(stmt).mappings()]

    return run_query(engine, fetch)
