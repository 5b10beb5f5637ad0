"""The capacity model: tokens/s ONE replica of a pool (model × GPU type) serves at SLO.

Learned from the audit trail: the store (``autoscale/capacity_query.py``) turns the requests into
**node-buckets**, one per node and time bucket: tokens served (prompt + completion, the unit the
forecasts and the cost ledger use), requests eligible for the SLO and those within it. Then, per
pool, pure and deterministic (:func:`learn_capacity`):

* a bucket **held** the SLO when its attainment ≥ ``slo_target`` (0.99), **broke** it otherwise;
  buckets with fewer than ``min_requests`` eligible requests say nothing and are skipped;
* breaks at a rate below the median held rate are not load's doing (a failing node, a slow
  client) and are ignored; the lowest remaining break rate is where the pool saturates;
* **learned**: the highest held rate below that saturation rate, when the pool has saturated;
* otherwise the pool never ran out of capacity in the window, so the highest held rate is only a
  **lower bound**: the configured prior (``pools[].tokens_per_s``) is used when larger, and the
  source says which (``prior`` / ``lower-bound``);
* no data and no prior: unknown (None): the planner leaves that pool alone and says why.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["Capacity", "NodeBucket", "learn_capacity"]


@dataclass(frozen=True)
class NodeBucket:
    """What one node of a pool did in one time bucket."""

    model: str
    gpu: str
    node: str
    bucket_s: float          # the bucket's length in seconds
    tokens: int
    eligible: int            # requests that count for the SLO (client errors excluded)
    in_slo: int
    start: float = 0.0       # the bucket's start (epoch s)
    # The measured speed: Σ e2e ms and Σ completion tokens of the bucket's ok requests that have
    # both (ms per output token = ok_ms / ok_tokens), for comparing GPU types at the same load.
    ok_ms: float = 0.0
    ok_tokens: int = 0

    @property
    def rate(self) -> float:
        return self.tokens / self.bucket_s if self.bucket_s > 0 else 0.0

    @property
    def attainment(self) -> float | None:
        return self.in_slo / self.eligible if self.eligible else None


@dataclass(frozen=True)
class Capacity:
    """Tokens/s one replica of ``model`` on ``gpu`` serves at SLO, and where the figure comes from."""

    model: str
    gpu: str
    tokens_per_s: float | None
    source: str              # learned | lower-bound | prior | unknown
    detail: str
    buckets: int = 0

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "gpu": self.gpu, "tokens_per_s": self.tokens_per_s, "source": self.source,
                "detail": self.detail, "buckets": self.buckets}


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def learn_capacity(buckets: Iterable[NodeBucket], priors: Mapping[tuple[str, str], float | None], *,
                   slo_target: float = 0.99, min_requests: int = 10) -> dict[tuple[str, str], Capacity]:
    """One :class:`Capacity` per pool in ``priors`` (model, gpu) and per pool seen in ``buckets``."""
    by_pool: dict[tuple[str, str], list[NodeBucket]] = defaultdict(list)
    for b in buckets:
        if b.eligible >= min_requests and b.bucket_s > 0:
            by_pool[(b.model, b.gpu)].append(b)
    out: dict[tuple[str, str], Capacity] = {}
    for key in sorted(set(priors) | set(by_pool)):
        model, gpu = key
        prior = priors.get(key)
        rows = by_pool.get(key, [])
        held = sorted(b.rate for b in rows if (b.attainment or 0.0) >= slo_target)
        broke = sorted(b.rate for b in rows if (b.attainment or 0.0) < slo_target)
        if held:
            median = statistics.median(held)
            load_breaks = [r for r in broke if r >= median]
            if load_breaks:
                limit = load_breaks[0]
                below = [r for r in held if r < limit]
                if below:
                    out[key] = Capacity(model, gpu, below[-1], "learned",
                                        f"SLO held up to {_fmt(below[-1])} tokens/s per node, broke at "
                                        f"{_fmt(limit)}", len(rows))
                    continue
            top = held[-1]
            if prior is not None and prior > top:
                out[key] = Capacity(model, gpu, prior, "prior",
                                    f"never saturated (SLO held up to {_fmt(top)} tokens/s per node): "
                                    f"configured {_fmt(prior)} used", len(rows))
            else:
                out[key] = Capacity(model, gpu, top, "lower-bound",
                                    f"never saturated: SLO held up to {_fmt(top)} tokens/s per node "
                                    f"(a lower bound)", len(rows))
        elif prior is not None:
            why = (f"SLO never held in {len(rows)} bucket(s)" if rows else "no traffic observed")
            out[key] = Capacity(model, gpu, prior, "prior", f"{why}: configured {_fmt(prior)} used", len(rows))
        else:
            out[key] = Capacity(model, gpu, None, "unknown",
                                "no bucket held the SLO and no tokens_per_s is configured", len(rows))
    return out
