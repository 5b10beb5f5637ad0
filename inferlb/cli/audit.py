"""What the ``inferlb`` CLI calls for the audit store: migrate, and print the SLA and cost reports.

Contract: each function opens its own engine from ``url`` and disposes it before returning; errors
are :class:`~inferlb.errors.StoreError` (database) or
:class:`~inferlb.errors.InvalidRequest` (a bad ``since``/``until``/``group_by``/``bucket``/
``fmt``), both with a message fit for the terminal. ``report_sla`` / ``report_cost`` return the
report rendered as ``fmt`` (a rich table as plain text, JSON, or CSV) and, given ``csv_path``, also
write the CSV there (the same bytes ``fmt="csv"`` prints).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from inferlb.config.settings import SLOConfig
from inferlb.errors import InvalidRequest
from inferlb.store.db import make_engine, upgrade
from inferlb.store.ledger import cost_report
from inferlb.store.report_params import parse_bucket, parse_group_by, parse_time
from inferlb.store.sla import sla_report
from inferlb.store.tabular import iso_utc, report_columns, to_csv

__all__ = ["REPORT_FORMATS", "db_upgrade", "render_report", "render_sla", "report_cost", "report_sla"]

REPORT_FORMATS = ("table", "json", "csv")
# Short headers for the terminal table (JSON and CSV keep the report's keys).
_LABELS = {
    "client_errors": "client err", "error_rate": "err rate",
    "e2e_p50_ms": "e2e p50", "e2e_p95_ms": "e2e p95", "e2e_p99_ms": "e2e p99",
    "ttft_p50_ms": "ttft p50", "ttft_p95_ms": "ttft p95", "ttft_p99_ms": "ttft p99",
    "slo_attainment": "in SLO", "slo_p95_met": "p95 met",
    "prompt_tokens": "prompt tok", "completion_tokens": "compl tok", "gpu_seconds": "GPU s",
    "cost_per_request": "per req", "cost_per_1k_tokens": "per 1k tok",
}
_COST_DIGITS = {"cost": 6, "cost_per_request": 6, "cost_per_1k_tokens": 6}


def db_upgrade(url: str) -> None:
    """Apply every Alembic migration to ``url`` (``inferlb db upgrade``)."""
    upgrade(url)


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if column == "bucket" and isinstance(value, int | float):
        return iso_utc(float(value))
    if isinstance(value, float):
        return f"{value:.{_COST_DIGITS.get(column, 3)}f}"
    return str(value)


def render_report(rows: Sequence[dict[str, Any]], *, columns: Sequence[str], fmt: str, title: str,
                  caption: str | None = None, extra: Mapping[str, Any] | None = None) -> str:
    """Rows as a rich table (plain text), JSON (``{"data": [...], **extra}``) or CSV."""
    if fmt == "json":
        return json.dumps({"data": list(rows), **(extra or {})}, indent=2)
    if fmt == "csv":
        return to_csv(rows, columns)
    if fmt != "table":
        raise InvalidRequest(f"format must be one of {', '.join(REPORT_FORMATS)}", param="fmt")
    table = Table(title=title, caption=caption if rows else "no requests in the window")
    for i, c in enumerate(columns):
        table.add_column(_LABELS.get(c, c), justify="left" if i == 0 or c in ("kind",) else "right")
    for r in rows:
        table.add_row(*(_cell(c, r.get(c)) for c in columns))
    buf = io.StringIO()
    # No colour codes and a fixed width: the string goes to files and pipes as well as terminals.
    Console(file=buf, width=220, color_system=None, force_terminal=False).print(table)
    return buf.getvalue()


def render_sla(rows: Sequence[dict[str, Any]], *, group_by: str | Sequence[str], fmt: str,
               bucketed: bool = False) -> str:
    """The SLA report's rows rendered as ``fmt``."""
    keys = parse_group_by(group_by)
    return render_report(rows, columns=report_columns("sla", keys, bucketed), fmt=fmt,
                         title=f"SLA report by {', '.join(keys) or 'none'} (latencies in ms)")


def _check_fmt(fmt: str) -> None:
    if fmt not in REPORT_FORMATS:
        raise InvalidRequest(f"format must be one of {', '.join(REPORT_FORMATS)}", param="fmt")


def _write_csv(csv_path: Path | str | None, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    if csv_path is not None:
        Path(csv_path).write_text(to_csv(rows, columns), encoding="utf-8")


def report_sla(
    url: str,
    *,
    since: str | float | None = None,
    until: str | float | None = None,
    group_by: str | Sequence[str] = "model",
    bucket: str | None = None,
    slos: Sequence[SLOConfig] = (),
    fmt: Literal["table", "json", "csv"] | str = "table",
    csv_path: Path | str | None = None,
) -> str:
    """The SLA report over ``[since, until)`` from the database at ``url``, rendered as ``fmt``.

    ``since``/``until`` take epoch seconds, ISO-8601 or a look-back such as ``24h``.
    """
    _check_fmt(fmt)
    t0 = parse_time(since, param="since")
    t1 = parse_time(until, param="until")
    keys = parse_group_by(group_by)
    bucketed = parse_bucket(bucket) is not None
    engine = make_engine(url)
    try:
        rows = sla_report(engine, since=t0, until=t1, group_by=keys, bucket=bucket, slos=slos)
    finally:
        engine.dispose()
    _write_csv(csv_path, rows, report_columns("sla", keys, bucketed))
    return render_sla(rows, group_by=keys, fmt=fmt, bucketed=bucketed)


def report_cost(
    url: str,
    *,
    prices: Mapping[str, float],
    since: str | float | None = None,
    until: str | float | None = None,
    group_by: str | Sequence[str] = "tenant",
    bucket: str | None = None,
    currency: str = "USD",
    fmt: Literal["table", "json", "csv"] | str = "table",
    csv_path: Path | str | None = None,
    now: float | None = None,
) -> str:
    """The cost report (see :mod:`.ledger`) from the database at ``url``, rendered as ``fmt``.

    The table's caption is the summary: provisioned, attributed and idle cost, and utilization.
    """
    _check_fmt(fmt)
    t0 = parse_time(since, param="since")
    t1 = parse_time(until, param="until")
    keys = parse_group_by(group_by, default="tenant")
    bucketed = parse_bucket(bucket) is not None
    engine = make_engine(url)
    try:
        report = cost_report(engine, prices=prices, since=t0, until=t1, group_by=keys, bucket=bucket,
                             currency=currency, now=now)
    finally:
        engine.dispose()
    columns = report_columns("cost", keys, bucketed)
    _write_csv(csv_path, report["data"], columns)
    s = report["summary"]
    caption = (f"{iso_utc(s['since'])} → {iso_utc(s['until'])}: provisioned {s['provisioned_cost']:.4f} "
               f"{currency} = attributed {s['attributed_cost']:.4f} + idle {s['idle_cost']:.4f}; utilization "
               + ("-" if s["utilization"] is None else f"{s['utilization'] * 100:.1f}%")
               + (f"; unpriced nodes: {', '.join(s['unpriced_nodes'])}" if s["unpriced_nodes"] else ""))
    return render_report(report["data"], columns=columns, fmt=fmt, caption=caption,
                         title=f"Cost report by {', '.join(keys) or 'none'} ({currency})",
                         extra={"summary": s})
