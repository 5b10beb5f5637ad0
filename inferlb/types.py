"""Shared vocabulary: clocks and small value types used across the engine.

Time is always injected: production code takes a :class:`Clock`; tests pass a :class:`ManualClock`
and never sleep.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """``monotonic()`` for durations and deadlines, ``time()`` for wall-clock timestamps (epoch s)."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    """The real clock: ``time.monotonic`` and ``time.time`` themselves (no Python frame of its
    own per reading: the request path reads the clock about twenty times)."""

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start: float = 1_000.0, wall: float = 1_767_225_600.0) -> None:
        self._mono = start
        self._wall = wall

    def monotonic(self) -> float:
        return self._mono

    def time(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        self._mono += seconds
        self._wall += seconds
