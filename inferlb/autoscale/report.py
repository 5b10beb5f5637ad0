"""``GET /reports/capacity`` and ``inferlb report capacity``: the audit trail and the cost ledger
→ per model and GPU type, over / under-provisioning in words and numbers, and vertical advice.

Nodes and their GPU types (``observability.finops.gpu_label``) come from the fleet config; the
capacity per replica at SLO is learned from the window's per-minute node-buckets
(:func:`~.capacity.learn_capacity`, the autoscaler's rule), with ``autoscale.pools[].tokens_per_s``
as priors; each node's provisioned cost is the cost ledger's (price × window), shared between the
models it served by tokens. The window is the one **observed**: ``since`` (default 7 days back)
or the deployment's first audit row or node event, whichever is later; each node counts from its
own first appearance (:func:`~inferlb.store.ledger.first_appearances`, the cost ledger's rule).
The rules and words are :mod:`.advice`'s. Bad parameters raise
:class:`~inferlb.errors.InvalidRequest`; database errors StoreError.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from sqlalchemy.engine import Engine

from inferlb.autoscale.advice import PoolUsage, advise, pool_prices
from inferlb.autoscale.capacity import learn_capacity
from inferlb.autoscale.capacity_query import node_buckets
from inferlb.config.settings import FleetConfig
from inferlb.cost import node_prices
from inferlb.errors import InvalidRequest
from inferlb.store.ledger import first_appearances
from inferlb.store.read import run_query
from inferlb.store.report_params import parse_bucket

__all__ = ["capacity_report"]


def capacity_report(engine: Engine, fleet: FleetConfig, *, since: float | None = None, until: float | None = None,
                    bucket: str | None = None, now: float | None = None) -> dict[str, Any]:
    end = (time.time() if now is None else now) if until is None else until
    start = end - 7 * 86_400 if since is None else since
    if not end > start:
        raise InvalidRequest("'since' must be before 'until'", param="since")
    bucket_us = parse_bucket(bucket or "1h")
    bucket_s = (bucket_us or 3_600_000_000) / 1e6
    auto = fleet.autoscale
    slo_target = auto.slo_target if auto is not None else 0.99
    target_util = auto.target_utilisation if auto is not None else 0.7
    label = fleet.observability.finops.gpu_label
    node_gpu = {n.name: n.labels.get(label, "unknown") for n in fleet.nodes}
    prices = node_prices(fleet.nodes, fleet.observability.finops)
    priors: dict[tuple[str, str], float | None] = {}
    for n in fleet.nodes:
        for m in n.models:
            priors.setdefault((m, node_gpu[n.name]), None)
    for p in auto.pools if auto is not None else ():
        priors[(p.model, p.gpu)] = p.tokens_per_s
    end_us = round(end * 1e6)
    seen, deployed = run_query(engine, lambda conn: first_appearances(conn, node_gpu, until_us=end_us))
    # nothing ever recorded: nothing observed (an empty window, too little data to advise)
    observed = end if deployed is None else max(start, deployed / 1e6)
    # a node never seen was there, as far as the trail can tell, from the deployment's first record
    born = {n: min(end, max(observed, seen.get(n, round(observed * 1e6)) / 1e6)) for n in node_gpu}
    minute = node_buckets(engine, since=start, until=end, bucket_s=60.0, node_gpu=node_gpu, slos=fleet.slos)
    caps = learn_capacity(minute, priors, slo_target=slo_target)
    coarse = node_buckets(engine, since=start, until=end, bucket_s=bucket_s, node_gpu=node_gpu, slos=fleet.slos)
    window_s = end - observed
    node_tokens: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for b in coarse:
        node_tokens[b.node][b.model] += b.tokens
    usages: list[PoolUsage] = []
    for (model, gpu) in sorted(priors):
        nodes = tuple(n.name for n in fleet.nodes if model in n.models and node_gpu[n.name] == gpu)
        if not nodes:
            continue
        cost = 0.0
        node_s = sum(end - born[name] for name in nodes)
        for name in nodes:
            total = sum(node_tokens[name].values())
            share = node_tokens[name][model] / total if total else 1.0 / max(1, sum(
                1 for n in fleet.nodes if n.name == name for _ in n.models))
            cost += prices.get(name, 0.0) * (end - born[name]) / 3600.0 * share
        usages.append(PoolUsage(model, gpu, nodes, tuple(b for b in coarse if b.model == model and b.gpu == gpu),
                                cost, pool_prices(nodes, prices), caps.get((model, gpu)), node_s,
                                tuple(b for b in minute if b.model == model and b.gpu == gpu)))
    out = advise(usages, window_s=window_s, bucket_s=bucket_s, slo_target=slo_target,
                 target_utilisation=target_util, currency=fleet.observability.finops.currency)
    out["summary"] = {"since": start, "until": end, "observed_since": observed, "window_s": window_s,
                      "bucket_s": bucket_s, "slo_target": slo_target,
                      "target_utilisation": target_util, "currency": fleet.observability.finops.currency,
                      "capacity": [c.to_json() for c in caps.values()]}
    return out
