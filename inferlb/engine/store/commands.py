"""What the ``inferlb`` CLI calls for the audit store: migrate, and print the SLA report.

Contract: each function opens its own engine from ``url`` and disposes it before returning; errors
are :class:`~inferlb.engine.errors.StoreError` (database) or
:class:`~inferlb.engine.errors.InvalidRequest` (a bad ``since``/``until``/``group_by``/``fmt``),
both with a message fit for the terminal.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from ..errors import InvalidRequest
from ..settings import SLOConfig
from .db import make_engine, upgrade
from .queries import SLA_COLUMNS, parse_time, sla_report

__all__ = ["REPORT_FORMATS", "db_upgrade", "render_sla", "report_sla"]

REPORT_FORMATS = ("table", "json", "csv")
# Short headers for the terminal table (JSON and CSV keep the report's keys).
_LABELS = {
    "client_errors": "client err", "error_rate": "err rate",
    "e2e_p50_ms": "e2e p50", "e2e_p95_ms": "e2e p95", "e2e_p99_ms": "e2e p99",
    "ttft_p50_ms": "ttft p50", "ttft_p95_ms": "ttft p95", "ttft_p99_ms": "ttft p99",
    "slo_attainment": "in SLO", "slo_p95_met": "p95 met",
}


def db_upgrade(url: str) -> None:
    """Apply every Alembic migration to ``url`` (``inferlb db upgrade``)."""
    upgrade(url)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def render_sla(rows: Sequence[dict[str, Any]], *, group_by: str, fmt: str) -> str:
    """Render report rows as a rich table (plain text), JSON (``{"data": [...]}``) or CSV."""
    if fmt == "json":
        return json.dumps({"data": list(rows)}, indent=2)
    columns = [group_by, *SLA_COLUMNS]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return buf.getvalue()
    if fmt != "table":
        raise InvalidRequest(f"format must be one of {', '.join(REPORT_FORMATS)}", param="fmt")
    table = Table(title=f"SLA report by {group_by} (latencies in ms)",
                  caption=None if rows else "no requests in the window")
    for c in columns:
        table.add_column(_LABELS.get(c, c), justify="left" if c == group_by else "right")
    for r in rows:
        table.add_row(*(_cell(r.get(c)) for c in columns))
    buf = io.StringIO()
    # No colour codes and a fixed width: the string goes to files and pipes as well as terminals.
    Console(file=buf, width=200, color_system=None, force_terminal=False).print(table)
    return buf.getvalue()


def report_sla(
    url: str,
    *,
    since: str | float | None = None,
    until: str | float | None = None,
    group_by: str = "model",
    slos: Sequence[SLOConfig] = (),
    fmt: Literal["table", "json", "csv"] | str = "table",
) -> str:
    """The SLA report over ``[since, until)`` from the database at ``url``, rendered as ``fmt``.

    ``since``/``until`` take epoch seconds, ISO-8601 or a look-back such as ``24h``.
    """
    if fmt not in REPORT_FORMATS:
        raise InvalidRequest(f"format must be one of {', '.join(REPORT_FORMATS)}", param="fmt")
    t0 = parse_time(since, param="since")
    t1 = parse_time(until, param="until")
    engine = make_engine(url)
    try:
        rows = sla_report(engine, since=t0, until=t1, group_by=group_by, slos=slos)
    finally:
        engine.dispose()
    return render_sla(rows, group_by=group_by, fmt=fmt)
