"""The planner: replicas per pool (model × GPU type) from forecasts, capacity and the current fleet.

Pure: :func:`plan` takes everything as arguments (time included) and returns a :class:`Plan` and
the next :class:`PlannerState`; a backtest calls it exactly as ``autoscale/plan`` does. Per model:

1. **Demand** = the forecast's peak over the steps until a replica started now would be ready AND
   the next round's replicas would be (``cold_start_s + interval_s``: what is removed now cannot
   come back sooner), never below the load observed now (a forecast that undershoots the present
   would be a scale-down on a wrong guess), times ``1 + headroom``.
   **Burst path**: when ``recent`` (the load of the last round alone, queue backlog included)
   is above ``burst_factor`` × what the replicas in place (starting or ready) serve at capacity,
   demand is at least ``recent`` in this round (``reason`` says ``burst``), without waiting for
   the step to close and the forecaster to see it.
   **Rise path** (``rise_ratio``, off by default): when ``recent`` is at least ``rise_ratio`` ×
   the load observed now (the last closed step), the load is rising faster than a step shows,
   and the burst path's threshold is ``target_utilisation`` instead of ``burst_factor`` (the
   plan sizes at the target anyway): a sudden rise that is still within what the replicas in
   place serve at capacity, but beyond them at the target, gets its scale-up in this round.
2. **Needed** = demand / ``target_utilisation`` tokens/s.
3. **Allocation**, when ``routed`` (tokens/s the router sent each pool over
   ``routed_share_s``) has traffic for the model: each pool is sized **for its own share**
   (``needed × routed[pool] / Σ routed``), ``ceil(share / capacity)`` clamped to its
   ``[min, max]`` (the router decides where demand goes; the planner does not move it: a pool the
   router sent nothing is held at its ``min``, so a pool meant to take traffic needs ``min`` ≥ 1
   or the router's share before it grows). Without
   it: every pool starts at its ``min``; the rest is filled on the cheapest pool per token first
   (price / capacity per replica), each up to its ``max``. Pools whose capacity is unknown are
   left as they are (said in ``reason``). A model still short at every ``max`` is flagged
   ``short``.
4. **Scale-down stabilisation** (the Kubernetes HPA's rule): a pool goes down only to the highest
   recommendation of the last ``scale_down_stabilisation_s``; up at once. With ``release`` (per
   pool, the replicas a plan on the forecast's upper band wants, :mod:`.release`) the hold is
   never above the larger of that and this round's recommendation: a replica goes before the
   window ends when the upper band says one fewer serves the whole lead (``released``).
5. **Cost cap**: while the plan costs more per hour than ``cost_cap_per_hour``, one replica is taken
   from the pool with the highest price per token that is above its ``min`` (flagged ``capped``).
   ``min`` wins over the cap (said in the plan's ``notes``).

Every number is clamped to ``[min, max]``: no forecast can take a pool below ``min``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from inferlb.autoscale.capacity import Capacity
from inferlb.autoscale.forecast import Forecast
from inferlb.config.autoscale import AutoscaleConfig, PoolConfig

__all__ = ["Plan", "PlannerState", "PoolDecision", "plan", "pool_price"]

PoolKey = tuple[str, str]


@dataclass(frozen=True)
class PoolDecision:
    model: str
    gpu: str
    current: int
    desired: int             # what the actuator is asked for
    recommended: int         # before stabilisation and the cost cap
    demand_tokens_s: float   # the model's demand (all its pools)
    capacity_tokens_s: float | None   # one replica at SLO
    price_per_hour: float
    reason: str
    share: float | None = None   # the pool's share of the routed demand; None: cheapest-first
    burst: bool = False          # the burst path set the demand this round
    released: bool = False       # the upper band let it below the stabilisation window's hold

    @property
    def key(self) -> PoolKey:
        return (self.model, self.gpu)

    @property
    def delta(self) -> int:
        return self.desired - self.current

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "gpu": self.gpu, "current": self.current, "desired": self.desired,
                "recommended": self.recommended, "demand_tokens_s": round(self.demand_tokens_s, 3),
                "capacity_tokens_s": None if self.capacity_tokens_s is None else round(self.capacity_tokens_s, 3),
                "price_per_hour": self.price_per_hour, "reason": self.reason,
                "share": None if self.share is None else round(self.share, 6), "burst": self.burst}


@dataclass(frozen=True)
class Plan:
    at: float
    pools: tuple[PoolDecision, ...]
    cost_per_hour: float
    notes: tuple[str, ...] = ()

    @property
    def changes(self) -> list[PoolDecision]:
        return [p for p in self.pools if p.delta != 0]

    def desired(self) -> dict[PoolKey, int]:
        return {p.key: p.desired for p in self.pools}

    def to_json(self) -> dict[str, object]:
        return {"at": self.at, "pools": [p.to_json() for p in self.pools],
                "cost_per_hour": round(self.cost_per_hour, 6), "notes": list(self.notes)}


@dataclass(frozen=True)
class PlannerState:
    """The recommendations of the stabilisation window: pool -> ((time, replicas), ...)."""

    recommendations: Mapping[PoolKey, tuple[tuple[float, int], ...]] = field(default_factory=dict)


def pool_price(pool: PoolConfig, gpu_prices: Mapping[str, float]) -> float:
    return pool.price_per_hour if pool.price_per_hour is not None else float(gpu_prices.get(pool.gpu, 0.0))


def _per_token(price: float, cap: float | None) -> float:
    return price / cap if cap else math.inf


def _burst(cfg: AutoscaleConfig, model: str, recent: Mapping[str, float] | None,
           known: list[tuple[PoolConfig, float | None]], current: Mapping[PoolKey, int],
           now_load: float = 0.0, rise_ratio: float | None = None) -> float | None:
    """The last round's load when it is beyond what the replicas in place serve (the burst path;
    at the target utilisation when it rose ``rise_ratio`` × over ``now_load``: the rise path), else None."""
    if cfg.burst_factor is None or recent is None or model not in recent:
        return None
    load = float(recent[model])
    serving = sum(int(current.get((p.model, p.gpu), 0)) * float(c or 0.0) for p, c in known)
    factor = cfg.burst_factor
    if rise_ratio is not None and now_load > 0 and load >= rise_ratio * now_load:
        factor = min(factor, cfg.target_utilisation)
    return load if load > factor * serving else None


def plan(cfg: AutoscaleConfig, *, now: float, forecasts: Mapping[str, Forecast], observed: Mapping[str, float],
         capacity: Mapping[PoolKey, Capacity], current: Mapping[PoolKey, int], step_s: float,
         gpu_prices: Mapping[str, float] | None = None, state: PlannerState | None = None,
         recent: Mapping[str, float] | None = None,
         routed: Mapping[PoolKey, float] | None = None,
         rise_ratio: float | None = None,
         release: Mapping[PoolKey, int] | None = None) -> tuple[Plan, PlannerState]:
    """The plan for every configured pool (see the module docstring) and the state to pass next time."""
    prices = gpu_prices or {}
    state = state or PlannerState()
    by_model: dict[str, list[PoolConfig]] = {}
    for p in cfg.pools:
        by_model.setdefault(p.model, []).append(p)
    notes: list[str] = []
    decisions: dict[PoolKey, PoolDecision] = {}
    for model, pools in by_model.items():
        fc = forecasts.get(model)
        lead_s = max(p.cold_start_s for p in pools) + cfg.interval_s
        steps = max(1, math.ceil(lead_s / step_s))
        now_load = float(observed.get(model, 0.0))
        peak = fc.peak(steps) if fc is not None else now_load
        base = max(peak, now_load)
        known = [(p, capacity[(p.model, p.gpu)].tokens_per_s) for p in pools
                 if capacity.get((p.model, p.gpu)) is not None and capacity[(p.model, p.gpu)].tokens_per_s]
        burst = _burst(cfg, model, recent, known, current, now_load, rise_ratio)
        if burst is not None and burst > base:
            base = burst
        demand = base * (1.0 + cfg.headroom)
        needed = demand / cfg.target_utilisation
        how = "burst: the last round" if burst is not None and burst >= base else (fc.method if fc else "observed")
        alloc: dict[PoolKey, int] = {}
        reasons: dict[PoolKey, str] = {}
        shares: dict[PoolKey, float] = {}
        for p in pools:
            key = (p.model, p.gpu)
            cur = int(current.get(key, 0))
            if key not in {(q.model, q.gpu) for q, _ in known}:
                alloc[key] = min(max(cur, p.min), p.max)
                reasons[key] = "capacity unknown: kept (set pools[].tokens_per_s or let traffic teach it)"
        head = f"demand {demand:,.0f} tokens/s ({how}) / target {cfg.target_utilisation:g} → {needed:,.0f} tokens/s"
        sent = {(p.model, p.gpu): max(0.0, float((routed or {}).get((p.model, p.gpu), 0.0))) for p in pools}
        total_sent = sum(sent.values())
        short = 0.0
        if total_sent > 0:
            for p, c in known:
                key = (p.model, p.gpu)
                shares[key] = sent[key] / total_sent
                want = needed * shares[key]
                n = math.ceil(want / float(c or 1.0) - 1e-9)
                alloc[key] = min(max(n, p.min), p.max)
                short += max(0.0, want - alloc[key] * float(c or 0.0))
                reasons[key] = f"{head}; routed share {shares[key] * 100:.1f} % → {want:,.0f} tokens/s"
            remaining = short
        else:
            remaining = needed - sum(p.min * float(c or 0.0) for p, c in known)
            for p, c in sorted(known, key=lambda pc: (_per_token(pool_price(pc[0], prices), pc[1]), pc[0].gpu)):
                cap = float(c or 0.0)
                extra = 0 if remaining <= 0 else min(p.max - p.min, math.ceil(remaining / cap - 1e-9))
                alloc[(p.model, p.gpu)] = p.min + extra
                remaining -= extra * cap
                reasons[(p.model, p.gpu)] = head
        if remaining > 1e-9 and known:
            notes.append(f"{model}: short by {remaining:,.0f} tokens/s with every pool at max")
            for p, _ in known:
                reasons[(p.model, p.gpu)] += "; short: every pool at max"
        for p in pools:
            key = (p.model, p.gpu)
            cap_obj = capacity.get(key)
            decisions[key] = PoolDecision(
                model, p.gpu, int(current.get(key, 0)), alloc[key], alloc[key], demand,
                cap_obj.tokens_per_s if cap_obj is not None else None, pool_price(p, prices), reasons[key],
                shares.get(key), burst is not None and burst >= base)

    # Scale-down stabilisation (HPA): the highest recommendation inside the window.
    window = cfg.scale_down_stabilisation_s
    recs: dict[PoolKey, tuple[tuple[float, int], ...]] = {}
    for key, d in decisions.items():
        kept = tuple((t, r) for t, r in state.recommendations.get(key, ()) if now - t < window)
        kept = (*kept, (now, d.recommended))
        recs[key] = kept
        if d.recommended < d.current:
            floor = max(r for _, r in kept)
            if release is not None and key in release and floor > max(d.recommended, release[key]):
                floor = max(d.recommended, int(release[key]))
                d = replace(d, released=floor < d.current, reason=d.reason + f"; upper band: {floor} serve the lead "
                            f"(stabilisation {window:g}s released)")
                decisions[key] = d
            if floor > d.recommended:
                held = min(d.current, floor)
                decisions[key] = replace(d, desired=held, reason=d.reason + f"; scale-down held at {held} "
                                         f"(stabilisation {window:g}s)")

    # Cost cap: take replicas from the dearest pools per token, never below min.
    cfg_of = {(p.model, p.gpu): p for p in cfg.pools}
    cost = sum(d.desired * d.price_per_hour for d in decisions.values())
    cap_h = cfg.cost_cap_per_hour
    if cap_h is not None and cost > cap_h + 1e-9:
        order = sorted(decisions, key=lambda k: -_per_token(decisions[k].price_per_hour,
                                                             decisions[k].capacity_tokens_s))
        for key in order:
            d = decisions[key]
            floor = cfg_of[key].min
            while cost > cap_h + 1e-9 and d.desired > floor and d.price_per_hour > 0:
                d = replace(d, desired=d.desired - 1)
                cost -= d.price_per_hour
            if d is not decisions[key]:
                decisions[key] = replace(d, reason=d.reason + f"; capped: cost cap {cap_h:g}/h")
        if cost > cap_h + 1e-9:
            notes.append(f"the pools' min replicas alone cost {cost:.4g}/h, over the cap {cap_h:g}/h: min wins")
    for key, d in decisions.items():   # the invariant, whatever happened above
        p = cfg_of[key]
        if not p.min <= d.desired <= p.max:
            decisions[key] = replace(d, desired=min(max(d.desired, p.min), p.max))
    out = Plan(now, tuple(decisions[(p.model, p.gpu)] for p in cfg.pools),
               sum(d.desired * d.price_per_hour for d in decisions.values()), tuple(notes))
    return out, PlannerState(recs)
