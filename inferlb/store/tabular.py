"""Report rows as tables: the column order of each report, and CSV (shared by the API and the CLI).

Contract: rows are the dicts :func:`~.sla.sla_report` and :func:`~.ledger.cost_report` return.
:func:`report_columns` gives their column order (``bucket`` first when bucketed, then the group
keys, then the report's own columns); :func:`to_csv` writes them with a header line, ``bucket`` as
ISO-8601 UTC (``2026-01-01T00:05:00Z``), missing values empty and booleans ``true``/``false``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from inferlb.store.ledger import COST_COLUMNS
from inferlb.store.sla import SLA_COLUMNS

__all__ = ["iso_utc", "report_columns", "to_csv"]


def iso_utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report_columns(kind: Literal["sla", "cost"], keys: Sequence[str], bucketed: bool) -> list[str]:
    own = SLA_COLUMNS if kind == "sla" else COST_COLUMNS
    return [*(["bucket"] if bucketed else []), *keys, *own]


def _csv_cell(column: str, value: Any) -> Any:
    if value is None:
        return ""
    if column == "bucket" and isinstance(value, int | float):
        return iso_utc(float(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def to_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([_csv_cell(c, r.get(c)) for c in columns])
    return buf.getvalue()
