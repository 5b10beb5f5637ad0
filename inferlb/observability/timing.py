"""Engine time per request: the CPU time the workflow executor spends on one process instance.

Contract: :class:`TimedExecutor` wraps a :class:`~inferlb.workflow.base.ProcessExecutor`
without changing its behaviour. It times ``start``, every ``advance`` and every ``complete`` of
each instance with ``time.perf_counter`` (I/O and backoff waits happen between those calls, in the
gateway, so they are not counted) and reports the sum once, when ``advance`` returns None (the
instance ended), to ``on_done(mode, seconds)``. An instance that never ends (the client went away
while it was parked, or the engine failed) reports nothing. ``on_done`` must not raise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from inferlb.workflow.base import ExternalCall, Instance, ProcessExecutor

__all__ = ["TimedExecutor", "TimedInstance"]


class TimedInstance:
    """An :class:`Instance` that adds up the time spent inside the wrapped one."""

    __slots__ = ("_done", "_inner", "_mode", "_spent")

    def __init__(self, inner: Instance, mode: str, spent: float, done: Callable[[str, float], None]) -> None:
        self._inner = inner
        self._mode = mode
        self._spent = spent
        self._done = done

    @property
    def data(self) -> dict[str, Any]:
        return self._inner.data

    @data.setter
    def data(self, value: dict[str, Any]) -> None:
        self._inner.data = value

    @property
    def path(self) -> list[str]:
        return self._inner.path

    @path.setter
    def path(self, value: list[str]) -> None:
        self._inner.path = value

    @property
    def finished(self) -> bool:
        return self._inner.finished

    def advance(self) -> ExternalCall | None:
        t0 = time.perf_counter()
        try:
            call = self._inner.advance()
        finally:
            self._spent += time.perf_counter() - t0
        if call is None:
            self._done(self._mode, self._spent)
        return call

    def complete(self, result: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        try:
            self._inner.complete(result)
        finally:
            self._spent += time.perf_counter() - t0


class TimedExecutor:
    """A :class:`ProcessExecutor` whose instances report their engine time when they end."""

    def __init__(self, inner: ProcessExecutor, on_done: Callable[[str, float], None]) -> None:
        self.inner = inner
        self.mode = inner.mode
        self._on_done = on_done

    def start(self, data: dict[str, Any], scope: Any) -> Instance:
        t0 = time.perf_counter()
        inst = self.inner.start(data, scope)
        return TimedInstance(inst, self.mode, time.perf_counter() - t0, self._on_done)
