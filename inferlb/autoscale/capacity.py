"""The capacity model: tokens/s ONE replica of a pool (model × GPU type) serves at SLO.

Learned from the audit trail: the store (``autoscale/capacity_query.py``) turns the requests into
**node-buckets**, one per node and time bucket: tokens served (prompt + completion, the unit the
forecasts and the cost ledger use), requests eligible for the SLO and those within it, and the
node's **saturation signals** in that bucket (requests that waited in a queue; when the source
has them, the peak KV-cache use and the peak in-flight against the node's limit). Then, per pool,
pure and deterministic (:func:`learn_capacity`):

* a bucket **held** the SLO when its attainment ≥ ``slo_target`` (0.99), **broke** it otherwise;
  buckets with fewer than ``min_requests`` eligible requests say nothing and are skipped;
* capacity is learned **only from saturation**: a bucket broke *by load* when it broke AND was
  saturated (:attr:`NodeBucket.saturated`: ≥ ``QUEUED_SHARE`` of its requests queued, KV-cache
  use ≥ ``KV_SATURATED``, or in-flight at the node's limit). A break without saturation (a slow
  client, a failing node, a long prompt on an idle node) never lowers the capacity: it is counted
  and said in ``detail``;
* **learned**: the highest held rate below the lowest load-break rate (or, when none held below
  it, that rate × its attainment: what it served within the SLO);
* otherwise the pool never ran out of capacity in the window, so the highest held rate is only a
  **lower bound**: the configured prior (``pools[].tokens_per_s``) is used when larger, and the
  source says which (``prior`` / ``lower-bound``);
* no data and no prior: unknown (None): the planner leaves that pool alone and says why.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["KV_SATURATED", "QUEUED_SHARE", "Capacity", "NodeBucket", "learn_capacity"]

QUEUED_SHARE = 0.05      # a bucket is saturated when at least this share of its requests queued
KV_SATURATED = 0.95      # ... or its peak KV-cache use reached this (vLLM preempts near a full cache)


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
    # Saturation signals: requests that waited in a queue (the gateway's admission queue, or the
    # node's own waiting queue); peak KV-cache use in [0, 1] and peak in-flight with the node's
    # limit, None where the source does not have them (the audit trail has only the queue).
    queued: int = 0
    kv_peak: float | None = None
    inflight_peak: int | None = None
    inflight_limit: int | None = None

    @property
    def saturated(self) -> bool:
        """The node ran out of room in this bucket (see the module docstring)."""
        if self.eligible and self.queued >= max(1.0, QUEUED_SHARE * self.eligible):
            return True
        if self.kv_peak is not None and self.kv_peak >= KV_SATURATED:
            return True
        return (self.inflight_peak is not None and self.inflight_limit is not None and self.inflight_limit > 0
                and self.inflight_peak >= self.inflight_limit)

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
        broke = [b for b in rows if (b.attainment or 0.0) < slo_target]
        load_breaks = sorted((b.rate, b.attainment or 0.0) for b in broke if b.saturated)
        ignored = len(broke) - len(load_breaks)
        why = (f"; {ignored} SLO break(s) without saturation ignored" if ignored else "")
        if load_breaks:
            limit, att = load_breaks[0]
            below = [r for r in held if r < limit]
            value = below[-1] if below else limit * att
            out[key] = Capacity(model, gpu, value, "learned",
                                f"saturated and broke the SLO at {_fmt(limit)} tokens/s per node; "
                                + (f"held up to {_fmt(value)}" if below else f"{_fmt(value)} of it within the SLO")
                                + why, len(rows))
        elif held:
            top = held[-1]
            if prior is not None and prior > top:
                out[key] = Capacity(model, gpu, prior, "prior",
                                    f"never saturated (SLO held up to {_fmt(top)} tokens/s per node): "
                                    f"configured {_fmt(prior)} used{why}", len(rows))
            else:
                out[key] = Capacity(model, gpu, top, "lower-bound",
                                    f"never saturated: SLO held up to {_fmt(top)} tokens/s per node "
                                    f"(a lower bound){why}", len(rows))
        elif prior is not None:
            seen = (f"SLO never held in {len(rows)} bucket(s), never saturated" if rows else "no traffic observed")
            out[key] = Capacity(model, gpu, prior, "prior", f"{seen}: configured {_fmt(prior)} used", len(rows))
        else:
            out[key] = Capacity(model, gpu, None, "unknown",
                                "no bucket held the SLO or saturated, and no tokens_per_s is configured", len(rows))
    return out
