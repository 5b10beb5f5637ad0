"""Retry budget per model pool: retries ≤ ``ratio`` × requests over a sliding window, with a floor.

Contract: :meth:`RetryBudget.request` counts one client request admitted to ``pool``;
:meth:`RetryBudget.try_retry` grants (and counts) one retry when, after it, the retries in the
last ``window_s`` seconds stay ≤ ``max(min_retries, ratio × requests)`` in that window. Over a
total outage with more than ``min_retries / ratio`` requests per window this bounds backend
attempts ÷ client requests by ``1 + ratio`` (B3: 1.1 with the default 10 %).

:meth:`RetryBudget.refund` takes back a granted retry that answered the client: the budget
exists to stop retries from piling load on nodes that fail anyway, and a retry that succeeded
did useful work. In a total outage no retry succeeds, so the bound above is unchanged; a node
flapping faster than ejection notices (its failures retried elsewhere and answered) no longer
spends the budget of the whole pool and fails clients once it is spent.

The window is kept as ``slots`` buckets, so memory is constant and old counts age out one
bucket at a time. Time is injected (monotonic seconds); nothing here sleeps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["RetryBudget", "WindowCounts"]


@dataclass
class WindowCounts:
    """(bucket start, requests, retries) over a sliding window."""

    window_s: float
    slots: int
    buckets: deque[list[float]] = field(default_factory=deque)
    requests: int = 0
    retries: int = 0
    denied: int = 0
    refunded: int = 0

    def _roll(self, now: float) -> list[float]:
        width = self.window_s / self.slots
        start = now - (now % width)
        horizon = now - self.window_s
        while self.buckets and self.buckets[0][0] <= horizon:
            _, req, ret = self.buckets.popleft()
            self.requests -= int(req)
            self.retries -= int(ret)
        if not self.buckets or self.buckets[-1][0] != start:
            self.buckets.append([start, 0, 0])
        return self.buckets[-1]

    def add(self, now: float, *, requests: int = 0, retries: int = 0) -> None:
        b = self._roll(now)
        b[1] += requests
        b[2] += retries
        self.requests += requests
        self.retries += retries

    def counts(self, now: float) -> tuple[int, int]:
        self._roll(now)
        return self.requests, self.retries

    def take_back_retry(self, now: float) -> bool:
        """Uncount the newest retry still in the window; False when there is none."""
        self._roll(now)
        for b in reversed(self.buckets):
            if b[2] > 0:
                b[2] -= 1
                self.retries -= 1
                self.refunded += 1
                return True
        return False


class RetryBudget:
    """One sliding window per pool."""

    def __init__(self, ratio: float, min_retries: int, window_s: float, slots: int = 10) -> None:
        self.ratio = ratio
        self.min_retries = min_retries
        self.window_s = window_s
        self.slots = slots
        self.pools: dict[str, WindowCounts] = {}

    def _w(self, pool: str) -> WindowCounts:
        w = self.pools.get(pool)
        if w is None:
            w = self.pools[pool] = WindowCounts(self.window_s, self.slots)
        return w

    def allowance(self, pool: str, now: float) -> float:
        requests, _ = self._w(pool).counts(now)
        return max(float(self.min_retries), self.ratio * requests)

    def request(self, pool: str, now: float) -> None:
        self._w(pool).add(now, requests=1)

    def try_retry(self, pool: str, now: float) -> bool:
        w = self._w(pool)
        requests, retries = w.counts(now)
        if retries + 1 > max(float(self.min_retries), self.ratio * requests):
            w.denied += 1
            return False
        w.add(now, retries=1)
        return True

    def refund(self, pool: str, now: float) -> bool:
        """A retry granted by :meth:`try_retry` answered the client: it no longer counts (the
        newest retry still in the window is taken back). False when none is left to take back."""
        return self._w(pool).take_back_retry(now)

    def snapshot(self, pool: str, now: float) -> dict[str, float]:
        w = self._w(pool)
        requests, retries = w.counts(now)
        return {"requests": requests, "retries": retries, "denied": w.denied, "refunded": w.refunded,
                "allowance": max(float(self.min_retries), self.ratio * requests)}
