"""Shared vocabulary: clocks and small value types used across the engine.

Time is always injected: production code takes a :class:`Clock`; tests pass a :class:`ManualClock`
and never sleep.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """``monotonic()`` for durations and deadlines, ``time()`` for wall-clock timestamps (epoch s)."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    """The real clock: ``time.monotonic`` and ``time.time`` themselves, as the module has them when
    the clock is made (no Python frame of its own per reading: the request path reads the clock
    about twenty times; a test that patches them first still sees every reading)."""

    __slots__ = ("monotonic", "time")

    def __init__(self) -> None:
        self.monotonic: Callable[[], float] = time.monotonic
        self.time: Callable[[], float] = time.time


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
