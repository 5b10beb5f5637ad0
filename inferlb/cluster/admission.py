"""Admission across replicas: the controller of :mod:`..admission.controller` with its limits
taken from this replica's shares (:mod:`.shares`), which the cluster service keeps in step with
Redis. Only a gateway in a cluster builds these classes; one replica alone keeps the plain
:class:`~inferlb.admission.controller.AdmissionController` (the same code path as before,
at no extra cost).

Contract (on top of the base controller's):

* a model pool admits while its slots in use here are under this replica's quota of
  ``pool:<model>`` *and* under the pool's limit (and the pool is not hot); otherwise the request
  queues as before, and the shortage wakes a sync that registers the demand, so the replica's
  share grows as others give theirs back (max-min fair, :data:`~.lua.SYNC_LUA`);
* a key with ``max_parallel`` admits while its requests here are under this replica's quota of
  ``key:<id>``; a refusal for want of share is the same 429 as the key's own limit;
* while a sync is in flight, the quota of a pool or key is at most what that sync reported in use
  (:class:`~.shares.SlotShares`): a pool's request queues until the answer (then the queue is
  pumped), a key's request is refused for want of share;
* RPM/TPM buckets (:class:`SharedLimiter`): a bucket this replica creates starts with
  ``1 / replicas`` of its capacity until a Redis sync gives it the shared level, so replicas that
  meet a key at the same moment cannot together pass its limit; while Redis is away every bucket
  runs at ``limit / replicas`` (the replica count last seen);
* the retry budget (:class:`SharedRetryBudget`) is one budget per pool for the whole cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from inferlb.admission.buckets import Limiter, TokenBucket
from inferlb.admission.budget import RetryBudget
from inferlb.admission.controller import AdmissionController
from inferlb.admission.state import PoolState, _reject
from inferlb.cluster.shares import SlotShares

if TYPE_CHECKING:
    from inferlb.admission.keys import ApiKey
    from inferlb.admission.state import Hold
    from inferlb.routing.types import NodeView

__all__ = ["SharedAdmission", "SharedLimiter", "SharedRetryBudget"]


class SharedLimiter(Limiter):
    """Per-key RPM/TPM buckets whose rates are divided by :attr:`divisor` (the replica count while
    Redis is away, else 1) and whose new buckets start at this replica's share."""

    def __init__(self, burst_s: float, shares: SlotShares) -> None:
        super().__init__(burst_s)
        self.shares = shares
        self.divisor = 1

    def _bucket(self, key: str, kind: str, limit: float, now: float) -> TokenBucket:
        eff = float(limit) / self.divisor
        b = self.buckets.get((key, kind))
        if b is None or not math.isclose(b.rate, eff / 60.0, rel_tol=1e-9):
            b = TokenBucket(eff, now, self.burst_s)
            if self.divisor == 1 and self.shares.replicas > 1:
                b.level = b.capacity / self.shares.replicas   # until a sync brings the shared level
            self.buckets[(key, kind)] = b
        return b

    def set_divisor(self, divisor: int, now: float) -> None:
        """Rescale every bucket (rate, capacity, level) to ``limit / divisor``."""
        divisor = max(1, divisor)
        if divisor == self.divisor:
            return
        f = self.divisor / divisor
        for b in self.buckets.values():
            b.refill(now)
            b.rate *= f
            b.capacity *= f
            b.level *= f
        self.divisor = divisor


class SharedRetryBudget(RetryBudget):
    """The retry budget of :mod:`..admission.budget`, counted over every replica (see
    :class:`~.shares.RetryShare`); the local window still answers while Redis is away, with the
    ``min_retries`` floor divided by the replica count."""

    def __init__(self, ratio: float, min_retries: int, window_s: float, shares: SlotShares) -> None:
        super().__init__(ratio, min_retries, window_s)
        self.shares = shares

    def request(self, pool: str, now: float) -> None:
        super().request(pool, now)
        sh = self.shares
        sh.retry_of(pool).d_requests += 1
        if sh.idle:
            sh.busy()

    def try_retry(self, pool: str, now: float) -> bool:
        sh = self.shares
        rs = sh.retry_of(pool)
        w = self._w(pool)
        if sh.degraded or not rs.synced:
            requests, retries = w.counts(now)
            if retries + 1 > max(self.min_retries / max(1, sh.replicas), self.ratio * requests):
                w.denied += 1
                return False
            rs.d_extra += 1
        elif rs.spent + 1 > rs.part:
            w.denied += 1
            rs.denied += 1
            if sh.on_short is not None:
                sh.on_short()     # the claim was used up: the next sync claims more
            return False
        else:
            rs.spent += 1
            if rs.part - rs.spent <= 1 and sh.on_short is not None:
                sh.on_short()     # running low: claim more before the next failure needs it
        w.add(now, retries=1)
        return True

    def refund(self, pool: str, now: float) -> bool:
        """:meth:`RetryBudget.refund`, and the retry goes back to this replica's claim (or, made
        while Redis was away, is not reported): the next sync gives it back to the cluster."""
        if not super().refund(pool, now):
            return False
        rs = self.shares.retry_of(pool)
        if rs.spent > 0:
            rs.spent -= 1
        elif rs.d_extra > 0:
            rs.d_extra -= 1
        return True

    def snapshot(self, pool: str, now: float) -> dict[str, float]:
        snap = super().snapshot(pool, now)
        rs = self.shares.retry_of(pool)
        if rs.synced and not self.shares.degraded:
            snap["cluster_requests"] = rs.requests + rs.d_requests
            snap["cluster_retries_claimed"] = rs.retries   # claims count as spent until given back
            snap["cluster_allowance"] = max(float(self.min_retries), self.ratio * (rs.requests + rs.d_requests))
        return snap


class SharedAdmission(AdmissionController):
    """The admission controller of a gateway in a cluster (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shares = SlotShares()
        self.shared_limiter = SharedLimiter(self.policy.limit_burst_s, self.shares)
        self.limiter = self.shared_limiter
        rb = self.policy.retry_budget
        self.budget = SharedRetryBudget(rb.ratio, rb.min_retries, rb.window_s, self.shares)

    def _room(self, ps: PoolState, views: list[NodeView]) -> bool:
        limit = self._limit(views)
        if ps.admitted >= limit or self._hot(views):
            return False
        resource = "pool:" + ps.name
        if ps.admitted < self.shares.quota(resource, limit):
            return True
        self.shares.short(resource, ps.admitted + (len(ps.queue) if ps.queue is not None else 0) + 1)
        return False

    def _charge(self, key: ApiKey, hold: Hold, ev: Mapping[str, Any]) -> dict[str, Any] | None:
        mp = key.max_parallel
        if mp is not None:
            held = self.parallel[key.id]
            resource = "key:" + key.id
            if held < mp and held >= self.shares.quota(resource, mp):
                self.shares.short(resource, held + 1)
                self.counters["rejected_parallel"] += 1
                self.counters["rejected_parallel_share"] += 1
                return _reject(429, "rejected_rate_limit", "rate_limit_exceeded", "rate_limit_error",
                               f"Too many parallel requests for this key (limit {mp})", 1.0, "parallel limit")
        return super()._charge(key, hold, ev)

    # ------------------------------------------------------------------ what a sync reports

    def demands(self) -> list[tuple[str, float, int, int]]:
        """``(resource, cluster-wide limit, in use here, demand here)`` for every pool of the fleet
        and every active key with ``max_parallel``; the shortfall counts are consumed."""
        out: list[tuple[str, float, int, int]] = []
        short = self.shares.shortfall
        for pool in self.fleet.serving:
            ps = self._pool(pool)
            limit = self._limit(self._views(pool))
            queued = len(ps.queue) if ps.queue is not None else 0
            r = "pool:" + pool
            out.append((r, limit, ps.admitted, ps.admitted + queued))
        now = self.clock.time()
        for key in self.keys.by_id.values():
            if key.max_parallel is None or not key.active(now):
                continue
            r = "key:" + key.id
            held = self.parallel[key.id]
            out.append((r, float(key.max_parallel), held, held + short.get(r, 0)))
        short.clear()
        return out

    def snapshot(self) -> dict[str, Any]:
        snap = super().snapshot()
        sh = self.shares
        snap["cluster"] = {"replicas": sh.replicas, "degraded": sh.degraded,
                           "grants": dict(sorted(sh.grants.items())), "targets": dict(sorted(sh.targets.items()))}
        return snap
