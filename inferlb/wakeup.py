"""A sleep that can be cut short, for the loops an idle gateway runs once a second.

``asyncio.wait_for(event.wait(), t)`` and ``asyncio.timeout(t)`` end a quiet wait by cancelling a
task and raising: a few tens of µs of exception handling at every turn, which an idle gateway paid
on each of its once-a-second loops (docs/benchmarks.md, "Idle CPU: the revision poll made
event-driven"). :class:`Wakeup` resolves a future from a timer instead; nothing raises.

Contract: :meth:`Wakeup.wait` returns after ``timeout_s``, or as soon as :meth:`Wakeup.set` is
called (also when it was called before the wait began: that wakes the next wait only); it returns
True when it was woken that way. :meth:`Wakeup.set` runs on the event loop;
:meth:`Wakeup.set_threadsafe` may run anywhere (another thread, a signal handler). Any number of
tasks may wait at once; one ``set`` wakes them all.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["Wakeup"]


def _resolve(fut: asyncio.Future[bool], woken: bool) -> None:
    if not fut.done():
        fut.set_result(woken)


class Wakeup:
    """See the module docstring."""

    def __init__(self) -> None:
        self._flag = False
        self._waiters: set[asyncio.Future[bool]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        """Wake every waiter now (on the event loop's thread)."""
        self._flag = True
        for fut in self._waiters:
            _resolve(fut, True)

    def set_threadsafe(self) -> None:
        """:meth:`set` from any thread or a signal handler."""
        self._flag = True      # seen by a wait that has not begun yet
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):   # a closed loop has nobody left to wake
                loop.call_soon_threadsafe(self.set)

    async def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s``; True when :meth:`set` ended it (module docstring)."""
        woke = self._flag
        if not woke:
            loop = self._loop = asyncio.get_running_loop()
            fut: asyncio.Future[bool] = loop.create_future()
            self._waiters.add(fut)
            timer = loop.call_later(timeout_s, _resolve, fut, False)
            try:
                woke = await fut
            finally:
                timer.cancel()
                self._waiters.discard(fut)
        self._flag = False
        return woke
