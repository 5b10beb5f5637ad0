"""The admission controller: per-pool concurrency slots, the gateway queue, tenant limits, the retry
budget. One per app (on ``Runtime.admission``); all its state lives on the event loop.

Contract:

* :meth:`AdmissionController.admit` is synchronous and I/O-free (it backs the ``admission/admit``
  service task). For a request it returns one of: *admitted* (it holds one slot of its model
  pool until it ends), *queue* (the pool is saturated: the process parks on ``admission/wait``,
  then calls ``admit`` again), or *rejected* with the HTTP status, OpenAI error and
  ``Retry-After`` the client gets: 429 for the key's RPM/TPM/parallel limits, 429
  ``insufficient_quota`` for a spent budget, 503 when shed or when its queue wait ran out.
* A pool's slots are ``concurrency_headroom`` × Σ ``max_concurrency`` of its healthy nodes; the
  pool is also saturated while all its healthy nodes are hot (see :class:`SaturationConfig`).
  With no healthy node at all nothing queues: routing answers 503 at once.
* Freed slots go to the queue first, best ticket first (:mod:`.queue`), so a queued request is
  never overtaken by a later arrival of the same or lower class. When the queue is full, a new
  request of a higher class evicts the worst queued one; otherwise it is shed. A request whose
  expected wait (requests ahead × mean service time ÷ slots) exceeds its class's
  ``max_queue_wait_s`` or its deadline is shed at once, so rejections are fast (B6 ≤ 50 ms).
* :meth:`charge` and :meth:`release` are steps of the end-of-request hook (``app.request_end``),
  run once for every request whichever way it ended: ``charge`` adds the request's cost to its
  key's spend; ``release`` frees the slot, hands it on, corrects the TPM bucket by the actual
  usage and refunds what a shed request was charged. :meth:`finished` runs both.
* :meth:`retry_allowed` is the retry budget (:mod:`.budget`) plus "no retries for the classes
  with ``retry_under_saturation: false`` while their pool is saturated".
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from inferlb.admission.buckets import Limiter
from inferlb.admission.budget import RetryBudget
from inferlb.admission.keys import ApiKey, KeyCache, MissGuard, hash_key
from inferlb.admission.queue import Ticket
from inferlb.admission.state import Hold, PoolState, _reject
from inferlb.config.admission import AdmissionPolicy, AdmissionSettings
from inferlb.errors import StoreError
from inferlb.store.records import RequestRecord
from inferlb.types import Clock

if TYPE_CHECKING:
    from inferlb.fleet.state import Fleet
    from inferlb.routing.types import NodeView

__all__ = ["AdmissionController"]

log = logging.getLogger("inferlb.admission")

_EWMA = 0.2
_MAX_LOAD_ABOVE = 0.95  # classes above use this share of the slots or more: a wait never ends
_SHED_STATUSES = frozenset({"rejected_overload", "rejected_queue_timeout"})


class AdmissionController:
    """See the module docstring."""

    def __init__(self, policy: AdmissionPolicy, fleet: Fleet, clock: Clock, *, max_inflight: int,
                 env: AdmissionSettings | None = None) -> None:
        self.policy = policy
        self.fleet = fleet
        self.clock = clock
        self.max_inflight = max_inflight
        self.env = env or AdmissionSettings.model_construct(auth=False, admin_key=None, redis_url=None,
                                                           redis_prefix="inferlb:", limits="memory")
        self.auth_on = bool(policy.auth or self.env.auth)
        self.keys = KeyCache()
        self.limiter = Limiter(policy.limit_burst_s)
        self.auth_failures = Limiter()   # failed authentications per client address
        rb = policy.retry_budget
        self.budget = RetryBudget(rb.ratio, rb.min_retries, rb.window_s)
        self.holds: dict[str, Hold] = {}
        self.pools: dict[str, PoolState] = {}
        self.parallel: Counter[str] = Counter()
        self.spend_pending: defaultdict[str, float] = defaultdict(float)   # cost not yet in the database
        self.counters: Counter[str] = Counter()
        self._seq = itertools.count()
        self.on_enqueue: Callable[[], None] | None = None   # the service's tick loop parks until this
        # The database look-up of one key by digest (set by the service when there is a database);
        # None (its answer) when the database has no such key; StoreError when it is away.
        self.key_source: Callable[[str], Awaitable[ApiKey | None]] | None = None
        self.misses = MissGuard(per_s=policy.keys_miss_checks_per_s, ttl_s=policy.keys_miss_ttl_s)

    # ------------------------------------------------------------------ keys

    async def find_key(self, presented: str) -> ApiKey | None:
        """The active key ``presented`` is, from the cache or, for a digest the cache does not
        know at all, from the database (a key created a moment ago on another replica), as
        :attr:`misses` allows (admission/keys.py). A key the cache holds revoked or expired is not
        looked up again (a revocation is final; the reload brings any change); nor while the cache
        is expired (the database is away). A database error answers None (the caller's 401)."""
        now = self.clock.time()
        key = self.keys.lookup(presented, now)
        if key is not None or self.key_source is None or self.keys.expired is not None:
            return key
        digest = hash_key(presented)
        if digest in self.keys.by_hash or not self.misses.allow(digest, self.clock.monotonic()):
            return None
        try:
            found = await self.key_source(digest)
        except StoreError as exc:
            # Debug only: the key refresh loop already reports the database away (once a minute).
            log.debug("API key look-up failed (%s); answering 401", " ".join(str(exc).split())[:200])
            return None
        if found is None:
            self.misses.unknown(digest, self.clock.monotonic())
            return None
        self.keys.put(found)
        return self.keys.lookup(presented, self.clock.time())

    # ------------------------------------------------------------------ pools and saturation

    def _pool(self, name: str) -> PoolState:
        p = self.pools.get(name)
        if p is None:
            p = self.pools[name] = PoolState(name)
        return p

    def _views(self, pool: str) -> list[NodeView]:
        return [v for v in self.fleet.views() if pool in v.models and v.healthy]

    def _limit(self, views: list[NodeView]) -> float:
        return sum(v.max_concurrency for v in views) * self.policy.saturation.concurrency_headroom

    def _hot(self, views: list[NodeView]) -> bool:
        s = self.policy.saturation

        def hot(v: NodeView) -> bool:
            return (v.inflight_requests >= v.max_concurrency
                    or (v.inflight_tokens > 0 and v.inflight_tokens >= v.capacity_tokens)
                    or (s.max_waiting is not None and v.waiting is not None and v.waiting > s.max_waiting)
                    or (s.max_kv_usage is not None and v.kv_usage is not None and v.kv_usage >= s.max_kv_usage))

        return bool(views) and all(hot(v) for v in views)

    def _room(self, ps: PoolState, views: list[NodeView]) -> bool:
        return ps.admitted < self._limit(views) and not self._hot(views)

    def saturated(self, pool: str) -> bool:
        """True while ``pool`` has requests queued or no free slot."""
        ps = self._pool(pool)
        if ps.queue is not None and len(ps.queue):
            return True
        views = self._views(pool)
        return bool(views) and not self._room(ps, views)

    def _queue_cap(self, limit: float, measured: bool = True) -> int:
        """The queue bound; one round of slots at most until a service time is measured."""
        q = self.policy.queue
        factor = q.size_factor if measured else min(q.size_factor, 1.0)
        return int(min(q.max_size, max(q.min_size, math.ceil(limit * factor))))

    def _expected_wait(self, ps: PoolState, rank: int, limit: float, now: float) -> float | None:
        """Requests ahead × mean service time ÷ slots, stretched by the share of the slots that
        higher classes arriving meanwhile take (a priority queue's wait grows as 1 / (1 − ρ_above));
        None until a service time is known."""
        if ps.service_s is None or limit <= 0:
            return None
        base = (ps.q().ahead(rank) + 1) * ps.service_s / limit
        load_above = ps.rate_above(rank, now) * ps.service_s / limit
        return math.inf if load_above >= _MAX_LOAD_ABOVE else base / (1.0 - load_above)

    # ------------------------------------------------------------------ admit (service task)

    def admit(self, scope: Any, evaluation: Mapping[str, Any], request: Mapping[str, Any] | None,
              *, max_inflight: int | None = None) -> dict[str, Any]:
        """The ``admission/admit`` decision for the request of ``scope`` (see module doc)."""
        rec = scope.record
        rid = rec.request_id
        hold = self.holds.get(rid)
        if hold is not None:
            return self._again(scope, hold)
        now = self.clock.monotonic()
        cap = self.max_inflight if max_inflight is None else max_inflight
        cls = self.policy.cls(evaluation.get("priority"))
        rank = self.policy.rank(cls.name) or 0
        pool = str(evaluation.get("model") or scope.model)
        if not self.policy.enabled:
            inflight = self.fleet.inflight_total()
            if inflight >= cap:
                return _reject(503, "rejected_overload", "overloaded", "server_error",
                               f"The gateway is overloaded: {inflight} requests in flight (cap {cap})", 1.0,
                               f"{inflight} requests in flight (cap {cap})")
            return self._admitted(scope, None, "admission control is off")
        total = sum(p.admitted for p in self.pools.values())
        if total >= cap:
            self.counters["rejected_cap"] += 1
            return _reject(503, "rejected_overload", "overloaded", "server_error",
                           f"The gateway is overloaded: {total} requests in flight (cap {cap})", 1.0,
                           f"{total} requests in flight (cap {cap})")
        key_id = (request or {}).get("key_id")
        hold = Hold(request_id=rid, pool=pool, cls=cls, rank=rank, deadline_at=scope.deadline_at)
        if key_id:
            key = self.keys.by_id.get(str(key_id))
            if key is not None:
                refused = self._charge(key, hold, evaluation)
                if refused is not None:
                    return refused
        self.holds[rid] = hold
        ps = self._pool(pool)
        ps.arrive(rank, now)
        views = self._views(pool)
        if not views:
            return self._grant_now(scope, ps, hold, "no healthy node: routing decides")
        if ps.queue is not None and len(ps.queue):
            self._pump(ps, views)
        if not (ps.queue is not None and len(ps.queue)) and self._room(ps, views):
            return self._grant_now(scope, ps, hold, f"{ps.admitted}/{self._limit(views):g} slots in use")
        return self._enqueue(scope, ps, hold, views, now)

    def _charge(self, key: ApiKey, hold: Hold, ev: Mapping[str, Any]) -> dict[str, Any] | None:
        """Key limits: parallel, spend budget, RPM/TPM. Takes what it admits, or nothing."""
        if key.max_parallel is not None and self.parallel[key.id] >= key.max_parallel:
            self.counters["rejected_parallel"] += 1
            return _reject(429, "rejected_rate_limit", "rate_limit_exceeded", "rate_limit_error",
                           f"Too many parallel requests for this key (limit {key.max_parallel})", 1.0,
                           "parallel limit")
        if key.budget is not None and key.spent + self.spend_pending[key.id] >= key.budget:
            self.counters["rejected_quota"] += 1
            return _reject(429, "rejected_quota", "insufficient_quota", "insufficient_quota",
                           "You exceeded your current quota: this key's spend budget is used up", None,
                           "spend budget used up")
        tokens = int(ev.get("prompt_tokens_est") or 0) + int(ev.get("output_budget") or 0)
        d = self.limiter.check_and_take(key.id, rpm=key.rpm, tpm=key.tpm, tokens=tokens, now=self.clock.time())
        if not d.ok:
            self.counters[f"rejected_{d.which}"] += 1
            unit = "requests" if d.which == "requests" else "tokens"
            return _reject(429, "rejected_rate_limit", "rate_limit_exceeded", "rate_limit_error",
                           f"Rate limit reached for {unit} per minute: limit {d.limit:g}. "
                           f"Please try again in {math.ceil(d.retry_after_s)}s.", d.retry_after_s,
                           f"{unit} per minute limit")
        hold.key_id = key.id
        hold.tokens = tokens if key.tpm else 0
        hold.rpm = bool(key.rpm)
        self.parallel[key.id] += 1
        return None

    def _grant_now(self, scope: Any, ps: PoolState, hold: Hold, reason: str) -> dict[str, Any]:
        self._grant(ps, hold, self.clock.monotonic())
        return self._admitted(scope, hold, reason)

    def _grant(self, ps: PoolState, hold: Hold, now: float) -> None:
        ps.admitted += 1
        hold.admitted_at = now
        self.budget.request(ps.name, now)

    def _admitted(self, scope: Any, hold: Hold | None, reason: str) -> dict[str, Any]:
        scope.record.admitted_at = round(self.clock.time(), 6)
        return {"admitted": True, "queue": False, "reason": reason, "status": None, "retry_after_s": None,
                "queue_wait_ms": round(hold.queue_wait_s * 1000, 3) if hold is not None else 0.0}

    def _enqueue(self, scope: Any, ps: PoolState, hold: Hold, views: list[NodeView], now: float
                 ) -> dict[str, Any]:
        limit = self._limit(views)
        q = ps.q()
        max_wait = min(hold.cls.max_queue_wait_s, hold.deadline_at - now)
        if ps.service_s is not None:
            max_wait = min(max_wait, self.policy.queue.wait_factor * ps.service_s)
        expected = self._expected_wait(ps, hold.rank, limit, now)
        retry = max(1.0, min(60.0, expected or ps.service_s or 1.0))
        if max_wait <= 0:
            return self._shed(ps, f"pool {ps.name} is saturated and class {hold.cls.name} does not queue", retry)
        if expected is not None and expected > max_wait * self.policy.queue.admit_margin:
            return self._shed(ps, f"pool {ps.name} is saturated: expected wait {expected:.2f}s is over "
                                  f"{max_wait:.2f}s", retry)
        if len(q) >= self._queue_cap(limit, ps.service_s is not None):
            worst = q.worst()
            if worst is None or worst.rank <= hold.rank:
                return self._shed(ps, f"pool {ps.name} is saturated and its queue is full ({len(q)})", retry)
            q.settle(worst, "shed", now)      # a lower class makes room (counted when it comes back)
        t = Ticket(request_id=hold.request_id, pool=ps.name, rank=hold.rank, deadline_at=hold.deadline_at,
                   wait_until=now + max_wait, enqueued_at=now, seq=next(self._seq))
        q.push(t)
        hold.ticket = t
        self.counters["queued"] += 1
        if self.on_enqueue is not None:
            self.on_enqueue()
        self._shed_overtaken(ps, t, limit, now)
        return {"admitted": False, "queue": True, "reason": f"pool {ps.name} saturated: queued behind "
                f"{q.ahead(hold.rank) - 1} request(s), waiting up to {max_wait:.2f}s",
                "status": None, "retry_after_s": None}

    def _shed_overtaken(self, ps: PoolState, new: Ticket, limit: float, now: float) -> None:
        """Tickets the new one overtook and that can no longer get a slot within their wait are
        shed now rather than at the end of it: a rejection should be quick (B6)."""
        if ps.service_s is None or limit <= 0 or ps.queue is None:
            return
        order = ps.queue.in_order()
        at = order.index(new)
        for pos, t in enumerate(order[at + 1:], start=at + 1):
            if (pos + 1) * ps.service_s / limit > t.wait_until - now:
                ps.queue.settle(t, "shed", now)
                self.counters["shed_overtaken"] += 1

    def _shed(self, ps: PoolState, reason: str, retry_after: float) -> dict[str, Any]:
        ps.shed += 1
        self.counters["shed"] += 1
        return _reject(503, "rejected_overload", "overloaded", "server_error",
                       f"The gateway is overloaded: {reason}", retry_after, reason)

    def _again(self, scope: Any, hold: Hold) -> dict[str, Any]:
        """``admit`` for a request that already went through it (back from the queue)."""
        t = hold.ticket
        if hold.admitted_at is not None:
            return self._admitted(scope, hold, "slot handed over from the queue" if t else "admitted")
        if t is None or t.state == "queued":
            return {"admitted": False, "queue": True, "reason": "still queued", "status": None,
                    "retry_after_s": None}
        ps = self._pool(hold.pool)
        retry = max(1.0, ps.service_s or 1.0)
        if t.state == "expired":
            ps.expired += 1
            self.counters["queue_timeout"] += 1
            return _reject(503, "rejected_queue_timeout", "queue_timeout", "server_error",
                           f"The gateway is overloaded: no capacity freed within {t.waited_s:.2f}s",
                           retry, f"queue wait ended after {t.waited_s:.2f}s")
        return self._shed(ps, f"shed from the queue ({t.state}) for a higher priority class", retry)

    # ------------------------------------------------------------------ the queue wait (external task)

    async def wait(self, scope: Any, call: Any) -> dict[str, Any]:
        """Perform ``admission/wait``: until the ticket settles (slot, expiry, eviction)."""
        hold = self.holds.get(scope.record.request_id)
        t = hold.ticket if hold is not None else None
        if t is not None and t.state == "queued":
            timeout = max(0.0, t.wait_until - self.clock.monotonic()) + self.policy.queue.tick_s
            try:
                await asyncio.wait_for(t.event().wait(), timeout)
            except TimeoutError:
                self._expire(t)
        return self.wait_result(scope)

    def wait_result(self, scope: Any) -> dict[str, Any]:
        """The ``queued`` result for a settled (or absent) ticket; adds the wait to the record."""
        hold = self.holds.get(scope.record.request_id)
        t = hold.ticket if hold is not None else None
        if hold is None or t is None:
            return {"outcome": "none", "waited_ms": 0.0}
        if t.state == "queued":   # the performer gave up waiting: the wait counts as over
            self._expire(t)
        hold.queue_wait_s = t.waited_s
        ms = round(t.waited_s * 1000, 3)
        scope.record.queue_wait_ms = ms
        return {"outcome": t.state, "waited_ms": ms}

    def _expire(self, t: Ticket) -> None:
        ps = self._pool(t.pool)
        if ps.queue is not None:
            ps.queue.settle(t, "expired", self.clock.monotonic())

    def _pump(self, ps: PoolState, views: list[NodeView] | None = None) -> None:
        """Hand free slots to the best queued tickets."""
        q = ps.queue
        if q is None or not len(q):
            return
        views = self._views(ps.name) if views is None else views
        now = self.clock.monotonic()
        q.expire_due(now)     # counted in ``expired`` when each request comes back to admit
        while len(q) and (not views or self._room(ps, views)):
            t = q.pop_best()
            if t is None:
                break
            hold = self.holds.get(t.request_id)
            if hold is None:
                q.settle(t, "cancelled", now)
                continue
            q.settle(t, "granted", now)
            self._grant(ps, hold, now)
            ps.granted_from_queue += 1

    def has_queued(self) -> bool:
        """Whether any request waits in a gateway queue (the tick loop runs only then)."""
        return any(ps.queue is not None and len(ps.queue) for ps in self.pools.values())

    def tick(self) -> None:
        """Expire overdue tickets and re-check saturation (node metrics change between requests)."""
        for ps in list(self.pools.values()):
            if ps.queue is not None and len(ps.queue):
                self._pump(ps)

    # ------------------------------------------------------------------ retries

    def retry_allowed(self, scope: Any, priority: str | None) -> tuple[bool, str]:
        """Whether the request of ``scope`` may make one more attempt (counted when True)."""
        if not self.policy.enabled:
            return True, "admission control is off"
        pool = scope.models_tried[0] if scope.models_tried else scope.model
        cls = self.policy.cls(priority)
        if not cls.retry_under_saturation and self.saturated(pool):
            self.counters["retry_denied_saturated"] += 1
            return False, f"pool {pool} is saturated: class {cls.name} is not retried"
        if not self.budget.try_retry(pool, self.clock.monotonic()):
            self.counters["retry_denied_budget"] += 1
            snap = self.budget.snapshot(pool, self.clock.monotonic())
            return False, (f"retry budget of pool {pool} spent ({snap['retries']:g} retries for "
                           f"{snap['requests']:g} requests in {self.budget.window_s:g}s)")
        return True, "within the retry budget"

    # ------------------------------------------------------------------ request end

    def finished(self, rec: RequestRecord) -> None:
        """:meth:`charge` then :meth:`release` (what the end-of-request hook runs, in that order)."""
        self.charge(rec)
        self.release(rec)

    def charge(self, rec: RequestRecord) -> None:
        """Add the request's cost (``cost_est``, cost.py) to its key's pending spend; once per
        request (nothing once :meth:`release` has run)."""
        hold = self.holds.get(rec.request_id)
        if hold is not None and hold.key_id is not None and rec.cost_est:
            self.spend_pending[str(hold.key_id)] += float(rec.cost_est)

    def release(self, rec: RequestRecord) -> None:
        """Free the request's slot and hand it on, settle its key's parallel and TPM counts; a
        retry that answered the client is refunded to the pool's retry budget."""
        hold = self.holds.pop(rec.request_id, None)
        if hold is None:
            return
        now = self.clock.monotonic()
        ps = self._pool(hold.pool)
        t = hold.ticket
        if t is not None and t.state == "queued" and ps.queue is not None:
            ps.queue.settle(t, "cancelled", now)
        if rec.status == "ok" and len(rec.attempts) > 1 and rec.attempts[-1].outcome == "ok":
            self.budget.refund(hold.pool, now)   # the retry answered the client (budget.py)
        if hold.admitted_at is not None:
            ps.admitted = max(0, ps.admitted - 1)
            if rec.status == "ok":
                took = now - hold.admitted_at
                ps.service_s = took if ps.service_s is None else (1 - _EWMA) * ps.service_s + _EWMA * took
            self._pump(ps)
        if hold.key_id is not None:
            self._settle_key(hold, rec)

    def _settle_key(self, hold: Hold, rec: RequestRecord) -> None:
        key = str(hold.key_id)
        self.parallel[key] = max(0, self.parallel[key] - 1)
        wall = self.clock.time()
        if hold.tokens:
            if rec.attempts:
                prompt = rec.prompt_tokens if rec.prompt_tokens is not None else (rec.prompt_tokens_est or 0)
                actual = int(prompt) + int(rec.completion_tokens or 0)
            else:
                actual = 0                  # never reached a node: nothing was used
            self.limiter.adjust(key, "tpm", actual - hold.tokens, wall)
        if hold.rpm and not rec.attempts and rec.status in _SHED_STATUSES:
            self.limiter.adjust(key, "rpm", -1, wall)   # shed by the gateway: not the tenant's request

    def sweep(self, grace_s: float = 60.0) -> int:
        """Release holds whose request is long past its deadline (a request that never ended
        cleanly must not keep its slot forever); returns how many. Also forgets the failed-
        authentication buckets of client addresses that are within their limit again."""
        now = self.clock.monotonic()
        # One bucket per client address that ever failed to authenticate: without this the map
        # grows with every new address; a full bucket is the same as none.
        self.auth_failures.forget_idle(self.clock.time(), keep_pending=False)
        stale = [h for h in self.holds.values() if now > h.deadline_at + grace_s]
        for h in stale:
            self.finished(RequestRecord(request_id=h.request_id, received_at=0.0, endpoint="", model_requested="",
                                        status="unknown_outcome"))
        return len(stale)

    # ------------------------------------------------------------------ introspection

    def snapshot(self) -> dict[str, Any]:
        now = self.clock.monotonic()
        pools = {}
        for name, ps in self.pools.items():
            views = self._views(name)
            oldest = ps.queue.oldest_enqueued() if ps.queue is not None else None
            pools[name] = {
                "limit": self._limit(views), "admitted": ps.admitted, "hot": self._hot(views),
                "queued": len(ps.queue) if ps.queue is not None else 0,
                "queue_cap": self._queue_cap(self._limit(views)),
                "oldest_wait_s": round(now - oldest, 3) if oldest is not None else None,
                "service_s": ps.service_s, "shed": ps.shed, "expired": ps.expired,
                "granted_from_queue": ps.granted_from_queue,
                "retry_budget": self.budget.snapshot(name, now),
            }
        return {"enabled": self.policy.enabled, "auth": self.auth_on, "keys": len(self.keys),
                "classes": [c.name for c in self.policy.classes], "pools": pools,
                "holds": len(self.holds), "counters": dict(self.counters)}

    def queue_depth(self) -> dict[str, int]:
        """Requests waiting in the gateway queue, per model pool (the metrics read it)."""
        return {name: len(ps.queue) if ps.queue is not None else 0 for name, ps in self.pools.items()}

    def node_priority(self, class_name: str | None) -> int:
        """vLLM's ``priority`` for a class: its rank (lower is served earlier)."""
        r = self.policy.rank(class_name)
        return r if r is not None else self.policy.rank(self.policy.default_class) or 0
