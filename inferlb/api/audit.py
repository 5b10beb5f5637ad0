"""Audit and report endpoints: ``GET /audit/requests``, ``GET /audit/requests/{id}``, ``GET /reports/sla``,
``GET /reports/cost``.

Contract: thin adapters over :mod:`inferlb.store.queries`. The store (a
:class:`~inferlb.store.StoreHandle`) comes through the ``StoreDep`` dependency (``deps.py``);
nothing is created at import time. Every query parameter is taken as text and validated here or in
the queries, so bad input raises a :class:`~inferlb.errors.ClientError` (400, or
404 for an unknown id) which the application renders as the OpenAI error envelope; never a 422 or
500. The handlers are plain ``def``: FastAPI runs them in its thread pool, so the synchronous
database calls never block the event loop.

Reports take ``since``/``until`` (epoch seconds, ISO-8601 or a look-back like ``24h``), ``group_by``
(``model``, ``version``, ``node``, ``tenant``, ``priority``, ``stream``, comma-separated, or ``none``),
``bucket`` (``5m``, ``1h``, …) and ``format`` (``json``, the default, or ``csv``, served as
``text/csv`` with a header line). Node prices for ``/reports/cost`` come from the app's
observability hub (``ObservabilityDep``: :func:`inferlb.cost.node_prices`, the prices the
gateway charges requests by); without one every node costs 0.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.responses import Response

from inferlb.api.deps import ObservabilityDep, StoreDep
from inferlb.errors import ClientError, InvalidRequest
from inferlb.store.ledger import cost_report
from inferlb.store.queries import MAX_LIMIT, get_request, list_requests
from inferlb.store.report_params import parse_group_by, parse_time
from inferlb.store.sla import sla_report
from inferlb.store.tabular import report_columns, to_csv

__all__ = ["AuditRecordNotFound", "router"]

router = APIRouter()


class AuditRecordNotFound(ClientError):
    """404: no audit record has this request id."""

    status = 404

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"No audit record for request '{request_id[:200]}'", param="request_id", code="request_not_found"
        )



def _limit(value: str | None) -> int:
    if value is None or not value.strip():
        return 100
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {MAX_LIMIT}", param="limit")
    return n


@router.get("/audit/requests")
def audit_requests(
    store: StoreDep,
    since: str | None = None,
    until: str | None = None,
    model: str | None = None,
    node: str | None = None,
    status: str | None = None,
    tenant: str | None = None,
    limit: str | None = None,
    cursor: str | None = None,
) -> dict[str, Any]:
    """Requests newest first, filtered; ``next_cursor`` fetches the next page (null on the last)."""
    rows, next_cursor = list_requests(
        store.engine,
        since=parse_time(since, param="since"),
        until=parse_time(until, param="until"),
        model=model or None,
        node=node or None,
        status=status or None,
        tenant=tenant or None,
        limit=_limit(limit),
        cursor=cursor or None,
    )
    return {"data": rows, "next_cursor": next_cursor}


@router.get("/audit/requests/{request_id}")
def audit_request(store: StoreDep, request_id: str) -> dict[str, Any]:
    """One request's whole audit record, attempts included."""
    record = get_request(store.engine, request_id)
    if record is None:
        raise AuditRecordNotFound(request_id)
    return record


def _format(value: str | None) -> str:
    fmt = (value or "json").strip().lower()
    if fmt not in ("json", "csv"):
        raise InvalidRequest("'format' must be json or csv", param="format")
    return fmt


def _csv(name: str, text: str) -> Response:
    return Response(text, media_type="text/csv; charset=utf-8",
                    headers={"content-disposition": f'attachment; filename="{name}.csv"'})


@router.get("/reports/sla", response_model=None)
def report_sla(
    store: StoreDep,
    since: str | None = None,
    until: str | None = None,
    group_by: str = "model",
    bucket: str | None = None,
    format: str | None = None,
) -> dict[str, Any] | Response:
    """Per group (and time bucket): counts, error rate, latency percentiles, SLO attainment."""
    fmt = _format(format)
    keys = parse_group_by(group_by)
    rows = sla_report(
        store.engine,
        since=parse_time(since, param="since"),
        until=parse_time(until, param="until"),
        group_by=keys,
        bucket=bucket,
        slos=store.slos,
    )
    if fmt == "csv":
        return _csv("sla-report", to_csv(rows, report_columns("sla", keys, bool(bucket and bucket.strip()))))
    return {"data": rows}


@router.get("/reports/cost", response_model=None)
def report_cost(
    store: StoreDep,
    obs: ObservabilityDep,
    since: str | None = None,
    until: str | None = None,
    group_by: str = "tenant",
    bucket: str | None = None,
    format: str | None = None,
) -> dict[str, Any] | Response:
    """The cost ledger per group (and time bucket): GPU-seconds, cost per request and per 1k tokens,
    idle capacity as its own lines, and a summary that balances (attributed + idle = provisioned)."""
    fmt = _format(format)
    keys = parse_group_by(group_by, default="tenant")
    prices: dict[str, float] = dict(getattr(obs, "prices", None) or {})
    currency = str(obs.cfg.finops.currency) if obs is not None else "USD"
    report = cost_report(
        store.engine,
        prices=prices,
        since=parse_time(since, param="since"),
        until=parse_time(until, param="until"),
        group_by=keys,
        bucket=bucket,
        currency=currency,
    )
    if fmt == "csv":
        return _csv("cost-report", to_csv(report["data"], report_columns("cost", keys,
                                                                          bool(bucket and bucket.strip()))))
    return report
