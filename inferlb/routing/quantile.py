"""A quantile over a sliding window of the last N values: what the ``predicted-latency`` scorer's
adaptive tail reservation reads to tell a long request from a short one (routing/learned.py).

Pure and deterministic: no clock, no I/O, no randomness. ``add`` is O(N) memmove in the worst
case (a sorted list kept with ``bisect``), ``quantile`` O(1); at N = 4096 both are a few µs.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque

__all__ = ["WindowQuantile"]


class WindowQuantile:
    """The ``q``-quantile of the last ``window`` values added (the lower empirical quantile: the
    value at rank ⌊q · n⌋ of the n sorted values, so at least a share 1 − q of them are ≥ it)."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be ≥ 1, got {window}")
        self.window = window
        self._fifo: deque[int] = deque()
        self._sorted: list[int] = []

    def __len__(self) -> int:
        return len(self._fifo)

    def add(self, x: int) -> None:
        """Add ``x``; the oldest value leaves once the window is full."""
        if len(self._fifo) == self.window:
            old = self._fifo.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
        self._fifo.append(x)
        insort(self._sorted, x)

    def quantile(self, q: float) -> int | None:
        """The lower ``q``-quantile (0 ≤ q < 1) of the window, or None when it is empty."""
        n = len(self._sorted)
        if n == 0:
            return None
        return self._sorted[min(n - 1, int(q * n))]
