"""Token buckets for per-key request and token rates (RPM / TPM), in-process or shared via Redis.

Contract:

* :class:`TokenBucket` is pure arithmetic on an injected time (epoch seconds, so replicas on
  different machines agree): refilled at ``limit / 60`` per second, holding ``burst_s`` seconds
  of that (60 s: a whole minute's quota at once).
  :meth:`TokenBucket.take` succeeds when ``min(amount, capacity)`` is available (a request larger
  than a whole minute's budget still passes once the bucket is full) and may leave the level
  negative; a negative level is debt that later requests wait out. :meth:`TokenBucket.adjust`
  applies a correction (actual usage minus the estimate that was taken): positive takes more,
  negative gives back, never above capacity and never below ``-capacity``.
* :class:`Limiter` keeps one RPM and one TPM bucket per key. Decisions are synchronous and local
  (service tasks never block on I/O); every change is also recorded as a pending *delta*.
* :class:`RedisSync` makes several gateway replicas share the buckets: every ``sync_s`` it sends
  each bucket's pending delta to Redis in one pipeline (an atomic Lua script applies refill and
  delta to the shared bucket) and sets the local level to the shared one, minus whatever was
  taken locally while the round trip was in flight. Between syncs a replica decides on its own
  view, so the shared limit can be overshot by at most what all replicas admit in one sync
  period (50 ms by default) — the trade LiteLLM and Kong's ``sync_rate`` make too. When Redis
  is away, decisions stay local (each replica enforces the limit on its own) and deltas are kept
  to be sent when it returns.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["BUCKET_LUA", "LimitDecision", "Limiter", "RedisSync", "TokenBucket"]

log = logging.getLogger("inferlb.admission")


class TokenBucket:
    """``limit`` units per minute; holds ``burst_s`` seconds of that rate (at least one unit)."""

    __slots__ = ("capacity", "level", "pending", "rate", "ts")

    def __init__(self, limit: float, now: float, burst_s: float = 60.0) -> None:
        self.rate = float(limit) / 60.0
        self.capacity = max(1.0, float(limit) * burst_s / 60.0)   # exact for whole minutes
        self.level = self.capacity
        self.ts = now
        self.pending = 0.0          # taken locally, not yet sent to the shared store

    def refill(self, now: float) -> None:
        if now > self.ts:
            self.level = min(self.capacity, self.level + (now - self.ts) * self.rate)
            self.ts = now

    def retry_after(self, amount: float, now: float) -> float:
        """Seconds until ``min(amount, capacity)`` is available (0 when it is now)."""
        self.refill(now)
        need = min(amount, self.capacity) - self.level
        if need <= 0:
            return 0.0
        return need / self.rate if self.rate > 0 else math.inf

    def take(self, amount: float, now: float) -> bool:
        if self.retry_after(amount, now) > 0:
            return False
        self.adjust(amount, now)
        return True

    def adjust(self, delta: float, now: float) -> None:
        """Take ``delta`` more (negative: give back). Bounded to [-capacity, capacity]."""
        self.refill(now)
        self.level = max(-self.capacity, min(self.capacity, self.level - delta))
        self.pending += delta


@dataclass(frozen=True)
class LimitDecision:
    ok: bool
    which: str | None = None          # "requests" | "tokens" when refused
    retry_after_s: float = 0.0
    limit: float = 0.0


class Limiter:
    """Per-key RPM and TPM buckets. ``now`` is epoch seconds (``clock.time()``)."""

    def __init__(self, burst_s: float = 60.0) -> None:
        self.burst_s = burst_s
        self.buckets: dict[tuple[str, str], TokenBucket] = {}
        # called when a bucket is made: the Redis sync parks while there is none (admission/service.py)
        self.on_new: Callable[[], None] | None = None

    def _bucket(self, key: str, kind: str, limit: float, now: float) -> TokenBucket:
        b = self.buckets.get((key, kind))
        if b is None or b.rate != float(limit) / 60.0:
            b = TokenBucket(limit, now, self.burst_s)
            self.buckets[(key, kind)] = b
            if self.on_new is not None:
                self.on_new()
        return b

    def check_and_take(self, key: str, *, rpm: int | None, tpm: int | None, tokens: int, now: float
                       ) -> LimitDecision:
        """Take one request and ``tokens`` tokens when both fit; otherwise take nothing."""
        rb = self._bucket(key, "rpm", rpm, now) if rpm else None
        tb = self._bucket(key, "tpm", tpm, now) if tpm else None
        if rb is not None:
            wait = rb.retry_after(1, now)
            if wait > 0:
                return LimitDecision(False, "requests", wait, rb.rate * 60)
        if tb is not None:
            wait = tb.retry_after(tokens, now)
            if wait > 0:
                return LimitDecision(False, "tokens", wait, tb.rate * 60)
        if rb is not None:
            rb.adjust(1, now)
        if tb is not None:
            tb.adjust(tokens, now)
        return LimitDecision(True)

    def adjust(self, key: str, kind: str, delta: float, now: float) -> None:
        """Correct a bucket that exists (actual usage vs estimate, or a refund)."""
        b = self.buckets.get((key, kind))
        if b is not None and delta:
            b.adjust(delta, now)

    def level(self, key: str, kind: str, now: float) -> float | None:
        b = self.buckets.get((key, kind))
        if b is None:
            return None
        b.refill(now)
        return b.level

    def forget_idle(self, now: float, *, keep_pending: bool = True) -> None:
        """Drop buckets that are full again (a new one would start full: nothing changes) and, unless
        ``keep_pending`` is false (buckets never shared through Redis), have nothing to send."""
        for k, b in list(self.buckets.items()):
            b.refill(now)
            if b.level >= b.capacity and not (keep_pending and b.pending):
                del self.buckets[k]


# KEYS[1] = bucket hash; ARGV = capacity, rate per second, now (epoch s), delta, ttl ms.
# Returns {level, ts} as strings (Lua numbers would be truncated to integers on the way back).
BUCKET_LUA = """
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local delta = tonumber(ARGV[4])
local s = redis.call('HMGET', KEYS[1], 'level', 'ts', 'cap')
local level = tonumber(s[1])
local ts = tonumber(s[2])
if level == nil or s[3] == false or math.abs(tonumber(s[3]) - cap) > 1e-9 * cap then
  level = cap
  ts = now
end
if now > ts then
  level = math.min(cap, level + (now - ts) * rate)
  ts = now
end
level = level - delta
if level > cap then level = cap end
if level < -cap then level = -cap end
redis.call('HSET', KEYS[1], 'level', tostring(level), 'ts', tostring(ts), 'cap', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {tostring(level), tostring(ts)}
"""


class RedisSync:
    """Exchanges a :class:`Limiter`'s deltas with Redis (redis-py asyncio client)."""

    def __init__(self, limiter: Limiter, client: Any, prefix: str) -> None:
        self.limiter = limiter
        self.client = client
        self.prefix = prefix
        self._script = client.register_script(BUCKET_LUA)
        self.failures = 0
        self.syncs = 0

    def _key(self, key: str, kind: str) -> str:
        return f"{self.prefix}bucket:{kind}:{key}"

    async def sync(self, now: float, keys: Iterable[tuple[str, str]] | None = None) -> bool:
        """One exchange for every bucket (or ``keys``); False when Redis failed (state kept)."""
        from redis.exceptions import RedisError

        only = None if keys is None else set(keys)
        items = [(k, b) for k, b in self.limiter.buckets.items() if only is None or k in only]
        if not items:
            return True
        sent = [b.pending for _, b in items]
        for _, b in items:
            b.pending = 0.0
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for ((key, kind), b), delta in zip(items, sent, strict=True):
                    ttl_ms = int(max(1.0, b.capacity / max(b.rate, 1e-9)) * 2000)  # two refill periods
                    await self._script(keys=[self._key(key, kind)],
                                       args=[repr(b.capacity), repr(b.rate), repr(now), repr(delta), ttl_ms],
                                       client=pipe)
                results = await pipe.execute()
        except (RedisError, OSError) as exc:
            for (_, b), delta in zip(items, sent, strict=True):
                b.pending += delta          # resend next time
            self.failures += 1
            if self.failures in (1, 10) or self.failures % 1000 == 0:
                log.warning("rate-limit sync with Redis failed (%s); limits are per replica until it returns",
                            type(exc).__name__)
            return False
        self.syncs += 1
        self.failures = 0
        for (_, b), res in zip(items, results, strict=True):
            level, ts = float(res[0]), float(res[1])
            # What was taken here during the round trip is not in Redis yet: keep it applied.
            b.level = max(-b.capacity, min(b.capacity, level - b.pending))
            b.ts = ts
        return True
