"""The capacity report's numbers and words (pure): over- / under-provisioning per model and GPU
type, and vertical advice (cost per million tokens at SLO per GPU type).

Input: per pool (model × GPU type) the nodes, the node-buckets of the window
(:class:`~.capacity.NodeBucket`, one per node × hour by default), the provisioned cost of its
nodes (the cost ledger's: price × window, shared between a node's models by tokens), and its
capacity at SLO per replica (:func:`~.capacity.learn_capacity`). Rules:

* **token utilisation** = tokens served / (nodes × capacity × window). Below ``low`` (0.3) with
  the SLO held over the window → **remove** the nodes the busiest bucket did not need at
  ``target_utilisation`` (at least one stays): "remove 2 × l4: utilisation 18 % over 7 days, SLO
  held".
* **add**: consecutive buckets whose SLO attainment is below ``slo_target`` form a window; the
  nodes the window's peak needed at ``target_utilisation``, minus those there: "add 1 × h100
  14:00–18:00: SLO 91 % in that window" (times in UTC).
* **vertical**: per model, each GPU type's cost per million tokens at SLO, at capacity (price /
  capacity) and as observed (provisioned cost / tokens served within the SLO); the cheapest at
  capacity is recommended.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from inferlb.autoscale.capacity import Capacity, NodeBucket

__all__ = ["PoolUsage", "advise", "pool_prices"]


@dataclass(frozen=True)
class PoolUsage:
    model: str
    gpu: str
    nodes: tuple[str, ...]
    buckets: tuple[NodeBucket, ...]
    provisioned_cost: float
    price_per_hour: float        # per node (the mean of its nodes' prices)
    capacity: Capacity | None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.0f} %"


def _span(seconds: float) -> str:
    days = seconds / 86_400
    if days >= 1:
        return f"{days:.3g} day" + ("s" if days >= 2 else "")
    hours = seconds / 3600
    return f"{hours:.3g} h"


def _hhmm(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")


def advise(pools: Sequence[PoolUsage], *, window_s: float, bucket_s: float, slo_target: float = 0.99,
           target_utilisation: float = 0.7, low: float = 0.3, currency: str = "USD") -> dict[str, object]:
    rows: list[dict[str, object]] = []
    advice: list[dict[str, object]] = []
    by_model: dict[str, list[dict[str, object]]] = {}
    for p in pools:
        n = len(p.nodes)
        tokens = sum(b.tokens for b in p.buckets)
        eligible = sum(b.eligible for b in p.buckets)
        in_slo = sum(b.in_slo for b in p.buckets)
        in_slo_tokens = sum(b.tokens * (b.in_slo / b.eligible) for b in p.buckets if b.eligible)
        att = in_slo / eligible if eligible else None
        cap = p.capacity.tokens_per_s if p.capacity is not None else None
        util = tokens / (n * cap * window_s) if cap and n and window_s > 0 else None
        per_bucket: dict[float, list[NodeBucket]] = {}
        for b in p.buckets:
            per_bucket.setdefault(b.start, []).append(b)
        peak = max((sum(b.tokens for b in bs) / bucket_s for bs in per_bucket.values()), default=0.0)
        mtok_cap = (p.price_per_hour / (cap * 3600) * 1e6) if cap else None
        mtok_obs = (p.provisioned_cost / in_slo_tokens * 1e6) if in_slo_tokens else None
        row: dict[str, object] = {
            "model": p.model, "gpu": p.gpu, "nodes": n, "requests": eligible, "tokens": tokens,
            "slo_attainment": None if att is None else round(att, 6),
            "capacity_tokens_s": cap, "capacity_source": p.capacity.source if p.capacity else "unknown",
            "token_utilisation": None if util is None else round(util, 6),
            "peak_tokens_s": round(peak, 3), "provisioned_cost": round(p.provisioned_cost, 6),
            "cost_per_mtok_at_capacity": None if mtok_cap is None else round(mtok_cap, 6),
            "cost_per_mtok_observed": None if mtok_obs is None else round(mtok_obs, 6)}
        rows.append(row)
        by_model.setdefault(p.model, []).append(row)
        # over-provisioned: low utilisation, SLO held
        if util is not None and cap and n > 1 and util < low and (att is None or att >= slo_target):
            need = max(1, math.ceil(peak / (cap * target_utilisation) - 1e-9))
            k = n - need
            if k > 0:
                why = (f"utilisation {_pct(util)} over {_span(window_s)}, SLO held ({_pct(att)})" if att is not None
                       else f"no traffic over {_span(window_s)}")
                advice.append({"kind": "remove", "model": p.model, "gpu": p.gpu, "count": k,
                               "utilisation": round(util, 6), "slo_attainment": att,
                               "text": f"remove {k} × {p.gpu} ({p.model}): {why}"})
        # under-provisioned windows
        bad = sorted(t for t, bs in per_bucket.items()
                     if sum(b.eligible for b in bs) and
                     sum(b.in_slo for b in bs) / sum(b.eligible for b in bs) < slo_target)
        windows: list[list[float]] = []
        for t in bad:
            if windows and t - windows[-1][-1] <= bucket_s + 1e-6:
                windows[-1].append(t)
            else:
                windows.append([t])
        for w in windows:
            bs = [b for t in w for b in per_bucket[t]]
            w_att = sum(b.in_slo for b in bs) / max(1, sum(b.eligible for b in bs))
            w_peak = max(sum(b.tokens for b in per_bucket[t]) / bucket_s for t in w)
            k = max(1, math.ceil(w_peak / (cap * target_utilisation) - 1e-9) - n) if cap else 1
            advice.append({"kind": "add", "model": p.model, "gpu": p.gpu, "count": k, "from": w[0],
                           "until": w[-1] + bucket_s, "slo_attainment": round(w_att, 6),
                           "text": f"add {k} × {p.gpu} ({p.model}) {_hhmm(w[0])}–{_hhmm(w[-1] + bucket_s)[-5:]} UTC: "
                                   f"SLO {_pct(w_att)} in that window"})
    vertical: list[dict[str, object]] = []
    for model, rs in sorted(by_model.items()):
        priced = [r for r in rs if isinstance(r["cost_per_mtok_at_capacity"], float)]
        if len(priced) < 1:
            continue
        best = min(priced, key=lambda r: float(r["cost_per_mtok_at_capacity"]))  # type: ignore[arg-type]
        others = [r for r in priced if r is not best]
        text = (f"{model}: {best['gpu']} serves it at {best['cost_per_mtok_at_capacity']:.4g} {currency} per million "
                f"tokens at SLO")
        if others:
            text += " vs " + ", ".join(f"{r['cost_per_mtok_at_capacity']:.4g} on {r['gpu']}" for r in others)
            text += f": prefer {best['gpu']}"
        vertical.append({"model": model, "gpu": best["gpu"], "text": text,
                         "cost_per_mtok": {str(r["gpu"]): r["cost_per_mtok_at_capacity"] for r in priced}})
    return {"data": rows, "advice": advice, "vertical": vertical}


def pool_prices(nodes: Sequence[str], prices: Mapping[str, float]) -> float:
    """The mean price per hour of ``nodes``."""
    return sum(prices.get(n, 0.0) for n in nodes) / len(nodes) if nodes else 0.0
