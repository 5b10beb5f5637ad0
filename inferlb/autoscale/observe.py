"""``autoscale/observe`` for a running gateway: the audit trail → load history and capacity model.

:func:`audit_observer` returns the coroutine the runner awaits each round. It reads, off the
event loop (``asyncio.to_thread``), the last ``history_s`` of complete steps (the step in
progress would read low) per model requested (:func:`~inferlb.autoscale.capacity_query.load_series`),
starting at the model's first request in the window (the steps before the audit trail has anything
are not "no load", they are no history: a new gateway forecasts reactively until it has enough),
and relearns each pool's capacity at SLO from the same window's node-buckets (60 s buckets;
:func:`~.capacity.learn_capacity`), the nodes' GPU types read from their ``gpu_label`` label.
The same buckets give the tokens/s the router sent each pool over the last ``routed_share_s``
(``LoadHistory.routed``: each pool is sized for its share), and the last round alone
(``[now - interval_s, now)``) gives ``LoadHistory.recent``, the burst path's input. A request is
in the audit trail once it ended, so ``recent`` undercounts the answers still streaming: the burst
path sees a burst's short requests first.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence

from sqlalchemy.engine import Engine

from inferlb.autoscale.capacity import Capacity, learn_capacity
from inferlb.autoscale.capacity_query import load_series, node_buckets
from inferlb.autoscale.policy import LoadHistory
from inferlb.config.autoscale import AutoscaleConfig
from inferlb.config.settings import SLOConfig

__all__ = ["CAPACITY_BUCKET_S", "Observation", "audit_observer"]

CAPACITY_BUCKET_S = 60.0
Observation = tuple[LoadHistory, dict[tuple[str, str], Capacity]]


def audit_observer(engine: Engine, cfg: AutoscaleConfig, *, node_gpu: Callable[[], Mapping[str, str]],
                   slos: Sequence[SLOConfig]) -> Callable[[float], Awaitable[Observation]]:
    models = sorted({p.model for p in cfg.pools})
    priors = {(p.model, p.gpu): p.tokens_per_s for p in cfg.pools}

    def read(now: float) -> Observation:
        end = math.floor(now / cfg.step_s) * cfg.step_s
        since = end - cfg.history_s
        series = load_series(engine, since=since, until=end, step_s=cfg.step_s, models=models)
        tokens, arrivals = {}, {}
        for m, s in series.items():
            first = next((i for i, v in enumerate(s.arrivals_per_s) if v > 0), len(s.arrivals_per_s))
            tokens[m], arrivals[m] = list(s.tokens_per_s[first:]), list(s.arrivals_per_s[first:])
        buckets = node_buckets(engine, since=since, until=end, bucket_s=CAPACITY_BUCKET_S, node_gpu=node_gpu(),
                               slos=slos)
        routed: dict[tuple[str, str], float] = {}
        if cfg.routed_share_s > 0:
            for b in buckets:
                if b.start >= end - cfg.routed_share_s:
                    routed[(b.model, b.gpu)] = routed.get((b.model, b.gpu), 0.0) + b.tokens / cfg.routed_share_s
        last = load_series(engine, since=now - cfg.interval_s, until=now, step_s=max(1.0, cfg.interval_s),
                           models=models)
        recent = {m: s.tokens_per_s[-1] for m, s in last.items() if s.tokens_per_s}
        history = LoadHistory(cfg.step_s, end, tokens, arrivals, recent, routed)
        return history, learn_capacity(buckets, priors, slo_target=cfg.slo_target)

    async def observe(now: float) -> Observation:
        return await asyncio.to_thread(read, now)

    return observe
