"""The capacity report's numbers and words (pure): over- / under-provisioning per model and GPU
type, and vertical advice (cost per million tokens at SLO per GPU type).

Input: per pool (model × GPU type) the nodes, the node-buckets of the window
(:class:`~.capacity.NodeBucket`, one per node × hour by default, and per node × minute for the
speed), the node-seconds its nodes existed in the window (each from its first appearance, as the
cost ledger counts them), their provisioned cost (price × those seconds, shared between a node's
models by tokens), and its capacity at SLO per replica (:func:`~.capacity.learn_capacity`).
``window_s`` is the window **observed**: from the later of the asked start and the deployment's
first record, not the look-back asked for. Rules:

* **too little data**: a window observed shorter than ``min_window_s`` (one bucket by default),
  or a pool whose nodes did not exist in it, gets no remove / add advice but an ``insufficient``
  line saying so.
* **token utilisation** = tokens served / (capacity × node-seconds). Below ``low`` (0.3) with
  the SLO held over the window → **remove** the nodes the busiest bucket did not need at
  ``target_utilisation`` (at least one stays): "remove 2 × l4: utilisation 18 % over 2 days, SLO
  held".
* **add**: consecutive buckets whose SLO attainment is below ``slo_target`` form a window; the
  nodes the window's peak needed at ``target_utilisation``, minus those there: "add 1 × h100
  14:00–18:00: SLO 91 % in that window" (times in UTC).
* **vertical**: per model served on several GPU types, each type's measured speed, ms per output
  token (Σ e2e ms / Σ completion tokens of its ok requests), over its node-minutes at **comparable
  load**: per-node tokens/s inside the range every type was seen at (the highest of their lowest
  loads to the lowest of their highest). The cost per million tokens at that speed (price × ms
  per token, for one stream) ranks the types: the cheapest is preferred, whatever traffic each
  happened to get. With no common load, or fewer than ``min_speed_buckets`` node-minutes of one
  type in it, it says so and prefers none. A model on one type gets its cost per million tokens
  at capacity (price / capacity), no preference. Each row also has the cost per million tokens at
  capacity and as observed (provisioned cost / tokens served within the SLO).
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
    node_seconds: float = 0.0    # Σ over its nodes of the time each existed in the window observed
    speed_buckets: tuple[NodeBucket, ...] = ()   # per node × minute: load and measured speed


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


def _rates(bs: Sequence[NodeBucket]) -> str:
    return f"{_num(min(b.rate for b in bs))}–{_num(max(b.rate for b in bs))}"


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _speeds(pools: Sequence[PoolUsage], min_buckets: int
            ) -> tuple[dict[str, float] | None, tuple[float, float] | None, str]:
    """(ms per output token per GPU type at comparable load, that load range, why not)."""
    timed = {p.gpu: [b for b in p.speed_buckets if b.ok_tokens > 0 and b.bucket_s > 0] for p in pools}
    missing = sorted(g for g, bs in timed.items() if not bs)
    if missing:
        return None, None, f"no timed answer on {', '.join(missing)}"
    lo = max(min(b.rate for b in bs) for bs in timed.values())
    hi = min(max(b.rate for b in bs) for bs in timed.values())
    if lo > hi:
        seen = ", ".join(f"{g} {_rates(bs)}" for g, bs in sorted(timed.items()))
        return None, None, f"no load in common (tokens/s per node: {seen})"
    out: dict[str, float] = {}
    for g, bs in sorted(timed.items()):
        inside = [b for b in bs if lo <= b.rate <= hi]
        if len(inside) < min_buckets:
            return None, (lo, hi), (f"{len(inside)} node-minute(s) of {g} at {_num(lo)}–{_num(hi)} tokens/s per "
                                    f"node, {min_buckets} needed")
        out[g] = sum(b.ok_ms for b in inside) / sum(b.ok_tokens for b in inside)
    return out, (lo, hi), ""


def advise(pools: Sequence[PoolUsage], *, window_s: float, bucket_s: float, slo_target: float = 0.99,
           target_utilisation: float = 0.7, low: float = 0.3, currency: str = "USD",
           min_window_s: float | None = None, min_speed_buckets: int = 10) -> dict[str, object]:
    """Rows, advice and vertical advice for ``pools`` (module docstring); ``window_s`` is the
    window observed, ``min_window_s`` (default ``bucket_s``) the least that is advised on."""
    least = bucket_s if min_window_s is None else min_window_s
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
        util = tokens / (cap * p.node_seconds) if cap and n and p.node_seconds > 0 else None
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
            "cost_per_mtok_observed": None if mtok_obs is None else round(mtok_obs, 6),
            "ms_per_token": None, "cost_per_mtok_at_speed": None}   # set by the vertical comparison
        rows.append(row)
        by_model.setdefault(p.model, []).append(row)
        if window_s < least or p.node_seconds <= 0:
            seen = "nothing observed" if window_s <= 0 else f"{eligible} request(s) over {_span(window_s)}"
            advice.append({"kind": "insufficient", "model": p.model, "gpu": p.gpu, "count": 0,
                           "text": f"{p.model} on {p.gpu}: too little data to advise ({seen}; "
                                   f"{_span(least)} needed)"})
            continue
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
        mine = [p for p in pools if p.model == model]
        if len(mine) > 1:
            vertical.append(_compare(model, mine, rs, min_speed_buckets, currency))
            continue
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


def _compare(model: str, pools: Sequence[PoolUsage], rows: Sequence[dict[str, object]], min_buckets: int,
             currency: str) -> dict[str, object]:
    """The vertical advice of a model on several GPU types: by measured speed at comparable load."""
    speeds, load, why = _speeds(pools, min_buckets)
    gpus = ", ".join(sorted(p.gpu for p in pools))
    load_json = None if load is None else [round(load[0], 3), round(load[1], 3)]
    if speeds is None or load is None:
        return {"model": model, "gpu": None, "basis": "insufficient", "load_tokens_s": load_json,
                "ms_per_token": None, "cost_per_mtok": None,
                "text": f"{model}: too little data to compare {gpus} at comparable load ({why}): no preference"}
    price = {p.gpu: p.price_per_hour for p in pools}
    cost = {g: price[g] * ms / 3.6 for g, ms in speeds.items()}   # USD/h ÷ 3600 × ms/1000 × 1e6 tokens
    for r in rows:
        g = str(r["gpu"])
        r["ms_per_token"] = round(speeds[g], 6)
        r["cost_per_mtok_at_speed"] = round(cost[g], 6)
    best = min(sorted(cost), key=lambda g: cost[g])
    others = ", ".join(f"{speeds[g]:.3g} ms on {g}" for g in sorted(speeds) if g != best)
    prices = ", ".join(f"{cost[g]:.4g} on {g}" for g in sorted(cost) if g != best)
    text = (f"{model}: at comparable load ({_num(load[0])}–{_num(load[1])} tokens/s per node) {best} takes "
            f"{speeds[best]:.3g} ms per token vs {others}: {cost[best]:.4g} {currency} per million tokens at that "
            f"speed vs {prices}: prefer {best}")
    return {"model": model, "gpu": best, "basis": "speed", "load_tokens_s": load_json,
            "ms_per_token": {g: round(v, 6) for g, v in speeds.items()},
            "cost_per_mtok": {g: round(v, 6) for g, v in cost.items()}, "text": text}


def pool_prices(nodes: Sequence[str], prices: Mapping[str, float]) -> float:
    """The mean price per hour of ``nodes``."""
    return sum(prices.get(n, 0.0) for n in nodes) / len(nodes) if nodes else 0.0
