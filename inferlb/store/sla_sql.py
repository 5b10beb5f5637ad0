"""The SLA report's per-group tallies, computed by PostgreSQL instead of in Python.

Contract: :func:`tally_sql` returns, for each group (the bucket start first when bucketing, then
the group columns' values), the same :class:`Tally` that :mod:`.sla` computes in Python from
the fetched rows, so :func:`~.sla.sla_report` gives the same report either way (a test compares
the two on PostgreSQL). Percentiles come from ``percentile_cont``, which interpolates linearly
between closest ranks exactly as :func:`~.sla.percentile` does (``lo + (hi - lo) · frac`` with
``frac`` from ``q · (n - 1)``, in float8, the same IEEE operations). The SLO of a request is the
one for its model, else ``*`` (:func:`slo_table`, shared with the Python path); its bounds are
computed in Python and bound as parameters, so comparisons see the same doubles.

Only the aggregates travel: a day of a million requests is one scan of that day's partition and
a few hundred result rows, where the Python path fetched every row (see docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, literal, not_, or_, select, true
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection
from sqlalchemy.types import Float

from inferlb.config.settings import SLOConfig
from inferlb.store.schema import REQUESTS

__all__ = ["QUANTILES", "Tally", "slo_table", "tally_sql"]

QUANTILES = (0.5, 0.95, 0.99)


@dataclass
class Tally:
    """One group's counts and latency percentiles (ms; None without values)."""

    count: int
    ok: int
    client: int
    rejected: int      # refused by the tenant's own limits (sla.LIMIT_STATUSES)
    slo_n: int
    slo_good: int
    e2e: tuple[float | None, ...]
    ttft: tuple[float | None, ...]
    ttft_count: int


def slo_table(slos: Sequence[SLOConfig]) -> tuple[dict[str, SLOConfig], SLOConfig | None]:
    """(the first SLO for each exact model name, the first ``*`` SLO)."""
    exact: dict[str, SLOConfig] = {}
    for s in slos:
        if s.model != "*":
            exact.setdefault(s.model, s)
    return exact, next((s for s in slos if s.model == "*"), None)


def _slo_exprs(slo: SLOConfig | None) -> tuple[ColumnElement[bool], ColumnElement[bool]]:
    """(does the SLO count this request, did the request meet it) for one SLO."""
    t = REQUESTS.c
    if slo is None or (slo.e2e_max_s is None and slo.ttft_max_s is None):
        return literal(False), literal(False)
    conds: list[ColumnElement[bool]] = [t.status == "ok"]
    if slo.e2e_max_s is not None:
        conds.append(and_(t.e2e_ms.is_not(None), t.e2e_ms <= literal(slo.e2e_max_s * 1000, Float())))
    if slo.ttft_max_s is not None:
        conds.append(or_(not_(t.stream), and_(t.ttft_ms.is_not(None),
                                               t.ttft_ms <= literal(slo.ttft_max_s * 1000, Float()))))
    return literal(True), and_(*conds)


def _per_model(slos: Sequence[SLOConfig], which: int) -> ColumnElement[bool]:
    exact, star = slo_table(slos)
    default = _slo_exprs(star)[which]
    if not exact:
        return default
    whens = [(REQUESTS.c.model_requested == m, _slo_exprs(s)[which]) for m, s in exact.items()]
    return case(*whens, else_=default)


def _pcts(values: Any) -> tuple[float | None, ...]:
    return tuple(values) if values is not None else (None,) * len(QUANTILES)


def tally_sql(conn: Connection, *, group: Sequence[ColumnElement[Any]], bucket_us: int | None,
              where: Sequence[ColumnElement[bool]], slos: Sequence[SLOConfig],
              client_statuses: Collection[str], limit_statuses: Collection[str]) -> dict[tuple[Any, ...], Tally]:
    """Per-group tallies of the requests matching ``where`` (PostgreSQL); the SLO counts neither
    ``client_statuses`` nor ``limit_statuses``."""
    t = REQUESTS.c
    keys: list[ColumnElement[Any]] = []
    if bucket_us is not None:
        keys.append((t.received_at_us - t.received_at_us % bucket_us).label("g_bucket"))
    keys += [c.label(f"g_{i}") for i, c in enumerate(group)]
    client = t.status.in_(sorted(client_statuses))
    limited = t.status.in_(sorted(limit_statuses))
    admitted = and_(not_(client), not_(limited))
    ok = t.status == "ok"
    quantiles = literal(list(QUANTILES), ARRAY(Float()))
    streamed_ok = and_(ok, t.stream)
    counted, good = _per_model(slos, 0), _per_model(slos, 1)
    stmt = select(
        *keys,
        func.count().label("n"),
        func.count().filter(ok).label("ok"),
        func.count().filter(client).label("client"),
        func.count().filter(limited).label("rejected"),
        func.count().filter(and_(admitted, counted)).label("slo_n"),
        func.count().filter(and_(admitted, counted, good)).label("slo_good"),
        func.percentile_cont(quantiles).within_group(t.e2e_ms).filter(ok).label("e2e"),
        func.percentile_cont(quantiles).within_group(t.ttft_ms).filter(streamed_ok).label("ttft"),
        func.count(t.ttft_ms).filter(streamed_ok).label("ttft_n"),
    ).where(true(), *where).group_by(*keys)
    out: dict[tuple[Any, ...], Tally] = {}
    for r in conn.execute(stmt):
        g = tuple(r[: len(keys)])
        out[g] = Tally(count=r.n, ok=r.ok, client=r.client, rejected=r.rejected, slo_n=r.slo_n,
                       slo_good=r.slo_good, e2e=_pcts(r.e2e), ttft=_pcts(r.ttft), ttft_count=r.ttft_n)
    return out
