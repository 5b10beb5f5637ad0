"""The cost ledger (FinOps): what each request cost, computed from the audit records alone.

**Attribution rule.** A node costs its price per hour for every second of the window, busy or not.
Each attempt occupies its node from ``started_at`` to ``ended_at`` (the request's ``last_byte_at``
when an attempt has no end; never before its start). At every instant the node's cost is shared
equally among the attempts in flight on it then: over a stretch where ``k`` attempts overlap,
each is charged ``1/k`` of the elapsed GPU-seconds (the batched requests of a continuous-batching
server share the GPU, so none is charged the whole GPU). Stretches where no attempt is in flight
are the node's **idle** capacity, reported as their own lines. A node is provisioned only from
its **first appearance**, the earliest of its first attempt and its first node event (``node_events``:
a node added by an operator or the autoscaler appears as ``loading``), whatever their age: a node
added on Tuesday is not charged idle for Monday. A node with neither (configured, never routed
to, never changed state) appears with the deployment, its earliest audit row or node event, and
is listed in ``unseen_nodes``: its idle time is an upper bound. So for every node and window,
charged GPU-seconds + idle GPU-seconds = the part of the window the node existed, exactly: the
books balance.
Every attempt is charged for what it occupied, whatever its outcome: streamed, aborted by the
client, failed and retried elsewhere, or answered by a fallback model; a request's cost is the sum
of its attempts' charges. Cost = GPU-seconds × price / 3600.

**Prices** come from the fleet config through :func:`~inferlb.cost.node_prices`: a node's
``price_per_hour``, else the price of its GPU type (``observability.finops.gpu_prices`` keyed by
the node label ``gpu_label``), else 0 (such nodes are listed as ``unpriced_nodes``). Prices are
those configured when the report runs. The rule and the prices are :mod:`inferlb.cost`'s,
the ones the gateway charges each request by (the audit row's ``cost_est``).

**Windows.** Cost accrues when the GPU time is used: an attempt is clipped to ``[since, until)``
and, with a ``bucket``, split across the buckets it spans. Request counts and tokens belong to
the bucket of the request's ``received_at`` (as in the SLA report); over windows much longer than
a request the two agree. Without ``since`` the window starts at the earliest data, without
``until`` it ends ``now``. Attempts that started more than :data:`LOOKBACK_S` before ``since``
are not considered.

Contract: :func:`attribute` is pure (no I/O) and deterministic; :func:`build_ledger` and
:func:`cost_report` read the audit tables through SQLAlchemy Core, identically on SQLite and
PostgreSQL; bad parameters raise :class:`~inferlb.errors.InvalidRequest`, database
failures :class:`~inferlb.errors.StoreError`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection, Engine

from inferlb.cost import Share, cost_of
from inferlb.store.read import run_query
from inferlb.store.report_params import (
    GROUP_BY,
    bucket_of,
    check_buckets,
    group_columns,
    parse_bucket,
    parse_group_by,
    time_window,
)
from inferlb.store.schema import ATTEMPTS, NODE_EVENTS, REQUESTS

__all__ = [
    "COST_COLUMNS",
    "IDLE",
    "LOOKBACK_S",
    "Charge",
    "IdleLine",
    "Ledger",
    "Occupancy",
    "attribute",
    "build_ledger",
    "cost_report",
    "first_appearances",
]

LOOKBACK_S = 86_400
IDLE = "(idle)"
# The keys of every cost_report row after the bucket and group keys, in order (tables and CSV).
COST_COLUMNS = ("kind", "requests", "ok", "prompt_tokens", "completion_tokens", "gpu_seconds", "cost",
                "cost_per_request", "cost_per_1k_tokens")


@dataclass(frozen=True, slots=True)
class Occupancy:
    """One attempt's use of one node, in epoch µs."""

    request_id: str
    attempt: int
    node: str
    start_us: int
    end_us: int


@dataclass(slots=True)
class Charge:
    """A ledger line: what one attempt used in one bucket (``bucket_us`` None: the whole window)."""

    request_id: str
    attempt: int
    node: str
    bucket_us: int | None
    gpu_s: float
    cost: float


@dataclass(slots=True)
class IdleLine:
    """A node's unused capacity in one bucket (or the whole window)."""

    node: str
    bucket_us: int | None
    provisioned_s: float
    idle_s: float
    cost: float


@dataclass
class Ledger:
    since_us: int
    until_us: int
    prices: dict[str, float]
    charges: list[Charge] = field(default_factory=list)
    idle: list[IdleLine] = field(default_factory=list)

    def request_costs(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for c in self.charges:
            out[c.request_id] += c.cost
        return dict(out)


def _boundaries(lo: int, hi: int, bucket_us: int | None) -> list[int]:
    """Bucket starts strictly inside ``(lo, hi)``."""
    if bucket_us is None:
        return []
    return list(range(bucket_of(lo, bucket_us) + bucket_us, hi, bucket_us))


def attribute(occupancies: Iterable[Occupancy], prices: Mapping[str, float], *, since_us: int, until_us: int,
              bucket_us: int | None = None, first_us: Mapping[str, int] | None = None) -> Ledger:
    """Charge every occupancy its fair share of its node over ``[since_us, until_us)``.

    ``first_us``: when each node appeared (epoch µs); a node is provisioned, and idle, only from
    then (clipped to the window); a node not in it, or no mapping, for the whole window. An
    occupancy never starts before its node's appearance (the caller's appearance counts attempts).

    A sweep per node keeps ``S(t)``, the integral of ``1/k`` over the busy time up to ``t``; an
    attempt's GPU time is ``S(end) - S(start)``: O(n log n), however many requests overlap.
    """
    ledger = Ledger(since_us=since_us, until_us=until_us, prices=dict(prices))
    by_node: dict[str, list[Occupancy]] = defaultdict(list)
    for o in occupancies:
        start, end = max(o.start_us, since_us), min(o.end_us, until_us)
        if end > start:
            by_node[o.node].append(Occupancy(o.request_id, o.attempt, o.node, start, end))
    bounds = _boundaries(since_us, until_us, bucket_us)
    for node in sorted(set(prices) | set(by_node)):
        price = prices.get(node, 0.0)
        occ = by_node.get(node, [])
        delta: dict[int, int] = defaultdict(int)
        for o in occ:
            delta[o.start_us] += 1
            delta[o.end_us] -= 1
        born = min(until_us, max(since_us, (first_us or {}).get(node, since_us)))
        if occ:   # an attempt is proof of life, whatever the caller's appearance said
            born = min(born, min(o.start_us for o in occ))
        times = sorted(t for t in set(delta).union(bounds, (born, until_us)) if t >= born)
        integral: dict[int, float] = {}
        idle: dict[int | None, float] = defaultdict(float)
        share, prev = Share(times[0]), times[0]
        for t in times:
            idle_dt = share.advance(t)          # the stretch [prev, t), at the previous count
            if idle_dt:
                idle[bucket_of(prev, bucket_us) if bucket_us else None] += idle_dt
            share.k += delta.get(t, 0)
            integral[t] = share.integral
            prev = t
        for o in occ:
            if bucket_us is None:
                spans: list[tuple[int | None, int, int]] = [(None, o.start_us, o.end_us)]
            else:
                spans = [(b, max(o.start_us, b), min(o.end_us, b + bucket_us))
                         for b in range(bucket_of(o.start_us, bucket_us), o.end_us, bucket_us)]
            for b, lo, hi in spans:
                gpu_s = (integral[hi] - integral[lo]) / 1e6
                ledger.charges.append(Charge(o.request_id, o.attempt, node, b, gpu_s, cost_of(gpu_s, price)))
        if bucket_us is None:
            buckets: list[tuple[int | None, int, int]] = [(None, since_us, until_us)]
        else:
            buckets = [(b, max(b, since_us), min(b + bucket_us, until_us))
                       for b in range(bucket_of(since_us, bucket_us), until_us, bucket_us)]
        for b, lo, hi in buckets:
            lo = max(lo, born)
            if hi <= lo and bucket_us is not None:
                continue   # the node did not exist yet in that bucket: no line
            hi = max(hi, lo)
            idle_s = idle.get(b, 0.0) / 1e6
            ledger.idle.append(IdleLine(node, b, (hi - lo) / 1e6, idle_s, cost_of(idle_s, price)))
    return ledger


_ALL_KEYS = GROUP_BY   # every report groups by the same keys (report_params.GROUP_BY)


@dataclass(frozen=True, slots=True)
class RequestLine:
    """A request received in the window: what counts and tokens are grouped by."""

    request_id: str
    received_us: int
    status: str
    prompt_tokens: int
    completion_tokens: int
    keys: dict[str, Any]


@dataclass
class LedgerData:
    """A ledger plus what its report groups by: each charged request's keys, the window's requests,
    and when each node appeared (epoch µs; ``unseen``: nodes with no attempt and no event)."""

    ledger: Ledger
    keys: dict[str, dict[str, Any]]
    requests: list[RequestLine]
    bucket_us: int | None
    first_us: dict[str, int] = field(default_factory=dict)
    unseen: list[str] = field(default_factory=list)


def first_appearances(conn: Connection, nodes: Iterable[str], *, until_us: int
                      ) -> tuple[dict[str, int], int | None]:
    """(each node's first attempt or node event before ``until_us``, whichever is earlier; the
    deployment's first audit row or node event). One index lookup each (``ix_request_attempts_node``,
    ``ix_node_events_node``, ``ix_requests_received``, ``ix_node_events_at``), so months of records
    cost no scan."""
    a, e, r = ATTEMPTS.c, NODE_EVENTS.c, REQUESTS.c
    out: dict[str, int] = {}
    for node in sorted(set(nodes)):
        seen = [conn.execute(select(func.min(a.started_at_us)).where(a.node == node, a.started_at_us < until_us))
                .scalar(),
                conn.execute(select(func.min(e.at_us)).where(e.node == node, e.at_us < until_us)).scalar()]
        known = [int(v) for v in seen if v is not None]
        if known:
            out[node] = min(known)
    starts = [conn.execute(select(func.min(r.received_at_us)).where(r.received_at_us < until_us)).scalar(),
              conn.execute(select(func.min(e.at_us)).where(e.at_us < until_us)).scalar()]
    known = [int(v) for v in starts if v is not None]
    return out, min(known) if known else None


def build_ledger(engine: Engine, *, prices: Mapping[str, float], since: float | None = None,
                 until: float | None = None, bucket: str | float | None = None,
                 now: float | None = None) -> LedgerData:
    """Read the attempts and requests of the window and attribute the nodes' cost."""
    conds = time_window(since, until)
    bucket_us = parse_bucket(bucket)
    a, r = ATTEMPTS.c, REQUESTS.c
    cols = group_columns()
    since_us = None if since is None else round(since * 1_000_000)
    until_us = round((time.time() if now is None else now) * 1_000_000) if until is None else round(until * 1e6)
    att = (select(a.request_id, a.number, a.node, a.started_at_us, a.ended_at_us, r.last_byte_at_us,
                  *(cols[k].label(k) for k in _ALL_KEYS if k != "node"))
           .select_from(ATTEMPTS.join(REQUESTS, a.request_id == r.request_id))
           .where(a.started_at_us < until_us))
    if since_us is not None:
        att = att.where(a.started_at_us >= since_us - LOOKBACK_S * 1_000_000)
    req = select(r.request_id, r.received_at_us, r.status, r.prompt_tokens, r.completion_tokens,
                 *(cols[k].label(k) for k in _ALL_KEYS)).where(*conds)
    occupancies: list[Occupancy] = []
    keys: dict[str, dict[str, Any]] = {}
    requests: list[RequestLine] = []
    first_us: dict[str, int] = {}
    deployed: list[int | None] = [None]

    def fetch(conn: Connection) -> None:
        for row in conn.execute(att).mappings():
            start = row["started_at_us"]
            end = row["ended_at_us"] if row["ended_at_us"] is not None else row["last_byte_at_us"]
            end = start if end is None else max(start, end)
            if since_us is not None and end <= since_us:
                continue
            occupancies.append(Occupancy(row["request_id"], row["number"], row["node"], start, end))
            keys.setdefault(row["request_id"], {k: row[k] for k in _ALL_KEYS if k != "node"})
        for row in conn.execute(req).mappings():
            requests.append(RequestLine(row["request_id"], row["received_at_us"], row["status"],
                                        row["prompt_tokens"] or 0, row["completion_tokens"] or 0,
                                        {k: row[k] for k in _ALL_KEYS}))
        seen, deployed[0] = first_appearances(conn, set(prices) | {o.node for o in occupancies}, until_us=until_us)
        first_us.update(seen)

    run_query(engine, fetch)
    unseen = sorted(n for n in prices if n not in first_us)
    born = dict(first_us)
    for n in unseen:   # what the ledger can know: the node is configured, the deployment began then
        born[n] = until_us if deployed[0] is None else deployed[0]
    if since_us is None:
        firsts = [o.start_us for o in occupancies] + [q.received_us for q in requests]
        since_us = min(firsts, default=until_us)
    since_us = min(since_us, until_us)
    check_buckets(since_us, until_us, bucket_us)
    ledger = attribute(occupancies, prices, since_us=since_us, until_us=until_us, bucket_us=bucket_us,
                       first_us=born)
    return LedgerData(ledger, keys, requests, bucket_us, first_us, unseen)


def _sig(x: float) -> float:
    """10 significant digits: exact enough for any bill, short enough for a CSV."""
    return float(f"{x:.10g}")


def _per(num: float, den: float, scale: float = 1.0) -> float | None:
    return _sig(num / den * scale) if den else None


def cost_report(engine: Engine, *, prices: Mapping[str, float], since: float | None = None,
                until: float | None = None, group_by: str | Sequence[str] = "tenant",
                bucket: str | float | None = None, now: float | None = None,
                currency: str = "USD") -> dict[str, Any]:
    """``{"data": rows, "summary": {...}}``: usage rows per group (and bucket), then idle rows.

    Usage rows: ``requests``/``ok``/tokens of the requests received in the group and bucket,
    ``gpu_seconds``/``cost`` charged to them, ``cost_per_request`` and ``cost_per_1k_tokens``
    (prompt + completion). Idle rows (``kind`` = ``idle``): per node when grouping by node, else one
    per bucket, with every other key ``(idle)``; ``gpu_seconds`` is the idle time. The summary's
    ``first_seen`` is each node's first appearance (epoch s), ``unseen_nodes`` the priced nodes
    with none (counted from the deployment's first record).
    """
    keys = parse_group_by(group_by, default="tenant")
    data = build_ledger(engine, prices=prices, since=since, until=until, bucket=bucket, now=now)
    led, bucket_us = data.ledger, data.bucket_us
    usage: dict[tuple[Any, ...], dict[str, Any]] = {}

    def row(g: tuple[Any, ...]) -> dict[str, Any]:
        hit = usage.get(g)
        if hit is None:
            hit = usage[g] = {"requests": 0, "ok": 0, "prompt_tokens": 0, "completion_tokens": 0,
                              "gpu_seconds": 0.0, "cost": 0.0}
        return hit

    for c in led.charges:
        info = {**data.keys.get(c.request_id, {}), "node": c.node}
        u = row((c.bucket_us, *(info.get(k) for k in keys)))
        u["gpu_seconds"] += c.gpu_s
        u["cost"] += c.cost
    for q in data.requests:
        b = bucket_of(q.received_us, bucket_us) if bucket_us else None
        u = row((b, *(q.keys[k] for k in keys)))
        u["requests"] += 1
        u["ok"] += q.status == "ok"
        u["prompt_tokens"] += q.prompt_tokens
        u["completion_tokens"] += q.completion_tokens
    idle: dict[tuple[Any, ...], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for line in led.idle:
        g = (line.bucket_us, *(line.node if k == "node" else IDLE for k in keys))
        idle[g][0] += line.idle_s
        idle[g][1] += line.cost

    def head(g: tuple[Any, ...], kind: str) -> dict[str, Any]:
        out: dict[str, Any] = {} if bucket_us is None else {"bucket": g[0] / 1_000_000}
        out.update(zip(keys, g[1:], strict=True))
        out["kind"] = kind
        return out

    rows: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    for g, u in usage.items():
        tokens = u["prompt_tokens"] + u["completion_tokens"]
        rows.append(((g[0] or 0, 0, *((v is None, str(v or "")) for v in g[1:])), {
            **head(g, "usage"), "requests": u["requests"], "ok": u["ok"], "prompt_tokens": u["prompt_tokens"],
            "completion_tokens": u["completion_tokens"], "gpu_seconds": round(u["gpu_seconds"], 6),
            "cost": _sig(u["cost"]), "cost_per_request": _per(u["cost"], u["requests"]),
            "cost_per_1k_tokens": _per(u["cost"], tokens, 1000.0)}))
    for g, (idle_s, idle_cost) in idle.items():
        rows.append(((g[0] or 0, 1, *((False, str(v)) for v in g[1:])), {
            **head(g, "idle"), "requests": 0, "ok": 0, "prompt_tokens": 0, "completion_tokens": 0,
            "gpu_seconds": round(idle_s, 6), "cost": _sig(idle_cost), "cost_per_request": None,
            "cost_per_1k_tokens": None}))
    rows.sort(key=lambda kv: kv[0])
    provisioned_s = sum(line.provisioned_s for line in led.idle)
    idle_s_total = sum(line.idle_s for line in led.idle)
    provisioned_cost = sum(line.provisioned_s * led.prices.get(line.node, 0.0) / 3600.0 for line in led.idle)
    attributed = sum(c.cost for c in led.charges)
    idle_cost = sum(line.cost for line in led.idle)
    nodes = sorted({line.node for line in led.idle})
    return {
        "data": [r for _, r in rows],
        "summary": {
            "since": led.since_us / 1_000_000, "until": led.until_us / 1_000_000, "currency": currency,
            "requests": len(data.requests), "provisioned_seconds": round(provisioned_s, 6),
            "provisioned_cost": _sig(provisioned_cost), "attributed_cost": _sig(attributed),
            "idle_cost": _sig(idle_cost),
            "utilization": round(1 - idle_s_total / provisioned_s, 6) if provisioned_s else None,
            "unpriced_nodes": [n for n in nodes if not led.prices.get(n)],
            "first_seen": {n: data.first_us[n] / 1_000_000 for n in sorted(data.first_us)},
            "unseen_nodes": data.unseen,
        },
    }
