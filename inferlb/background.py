"""The one background runner: every loop of the gateway is started, stopped and reported by it.

Contract of :class:`Background` (one named asyncio task running ``body``, a coroutine function):

* :meth:`~Background.start` creates the task (while it runs, a second call does nothing);
  it must be called on the running event loop. :attr:`~Background.started` is true from
  ``start`` to ``stop``, :attr:`~Background.running` while the task has not ended.
* :meth:`~Background.stop` signals (:attr:`~Background.stopping` turns true and
  :meth:`~Background.sleep` returns at once), lets the body end by itself for up to ``grace_s``
  (0 by default: no wait), then cancels the task and awaits it. A body may swallow a cancellation
  (cluster/service.py: a cancellation that lands while a Redis call's own timeout fires comes
  back as a Redis ``TimeoutError``, which its loops survive), so it is cancelled again every
  ``cancel_wait_s``, at most ``cancel_tries`` times; a task still running after that is logged
  and left. ``stop`` never raises; a stopped runner may be started again.
* An exception that escapes ``body`` ends the task. It is logged once, with its traceback, on the
  runner's logger, and kept: :attr:`~Background.failed` is true and
  :attr:`~Background.last_error` says what it was (``"Type: message"``) until the next start.
  A body that returns ends the task quietly; a cancelled one too.

Contract of :class:`Periodic` (a :class:`Background` whose body is a loop of turns):

* Before the first turn it waits ``first_s`` (None: one interval); between turns it waits
  ``interval_s`` (a number, or a callable read at every turn: a reload may change it), counted
  from the end of a turn, or with ``rate=True`` from its start (turns start every interval however
  long one takes, never two at once; one that overran is followed at once by the next).
* ``park`` (optional) is awaited before every wait: a loop with nothing to do parks on it instead
  of waking for nothing. ``wait`` (optional) replaces :meth:`~Background.sleep` as the way to wait
  (a revision watch whose notification ends the wait early). ``due`` (optional): when it is false
  the turn is skipped and nothing is counted. ``clock`` (optional) is the time ``rate`` counts
  in; by default the event loop's, the one ``asyncio.sleep`` and :meth:`~Background.sleep` use.
* **Leader gating** (``leader``, optional; a predicate the caller passes: this module knows no
  election): a turn while ``leader()`` is false does not run ``turn`` but ``standby`` (when given)
  and counts in :attr:`~Periodic.standby_turns`.
* :meth:`~Periodic.once` is one turn through the gate, as the loop runs it, with its exception
  propagating (what an owner's ``run_once`` is); :attr:`~Periodic.turns` counts the turns run
  past the gate, counted as they start. :meth:`~Periodic.run_turn` is :meth:`~Periodic.once`
  with the report the loop makes: an exception (never a cancellation) counts in
  :attr:`~Periodic.turn_errors` and :attr:`~Periodic.failing` (failures in a row), is kept in
  :attr:`~Background.last_error` (a good turn clears it), is handed to ``on_error(exc)`` when
  given (the owner's bookkeeping: it should not log), and the loop goes on.
* **A failing loop is quiet and backs off.** A failure is logged as one WARNING line on the
  runner's logger, without a traceback (``"<name> failed: Type: message; retrying in Ns"``):
  the first failure at once, then at most one line every ``log_every_s`` (60 s) while it keeps
  failing (the line counts the failures since the last one); the first good turn after failures
  logs one INFO line (``"<name> recovered after N failed turns"``). While failing, the wait
  before the next turn doubles from one interval (1, 2, 4 … intervals) up to ``backoff_max_s``
  (60 s by default; never below one interval; 0 turns the back-off off); a good turn brings back
  the interval. The time these count in is ``clock``'s (else the event loop's).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from inferlb.types import Clock
from inferlb.wakeup import Wakeup

__all__ = ["Background", "Periodic", "describe_error", "stop_all"]

T = TypeVar("T")

_log = logging.getLogger("inferlb.background")


def describe_error(exc: BaseException) -> str:
    """``"Type: message"``, at most 500 characters: what a status dict shows of a failure."""
    return f"{type(exc).__name__}: {exc}"[:500]


class Background:
    """See the module docstring."""

    def __init__(self, name: str, body: Callable[[], Awaitable[None]] | None = None, *,
                 logger: logging.Logger | None = None, cancel_tries: int = 20, cancel_wait_s: float = 0.1) -> None:
        self.name = name
        self._body = body
        self.log = logger or _log
        self.cancel_tries = cancel_tries
        self.cancel_wait_s = cancel_wait_s
        self.stopping = False
        self.failed = False
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._wakeup = Wakeup()

    @property
    def started(self) -> bool:
        """True from :meth:`start` until :meth:`stop` (also after the body ended by itself)."""
        return self._task is not None

    @property
    def running(self) -> bool:
        """True while the task runs: started, and its body has not ended."""
        return self._task is not None and not self._task.done()

    async def body(self) -> None:
        """What the task runs: the ``body`` given (subclasses define their own)."""
        if self._body is None:
            raise TypeError(f"background task {self.name!r} has no body")
        await self._body()

    def start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        self.stopping = False
        self.failed = False
        self.last_error = None
        self._wakeup = Wakeup()
        task = asyncio.get_running_loop().create_task(self.body(), name=self.name)
        task.add_done_callback(self._ended)
        self._task = task

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()   # retrieved here, so asyncio never reports it again
        if exc is not None:
            self.failed = True
            self.last_error = describe_error(exc)
            self.log.error("background task %s died: %s", self.name, self.last_error, exc_info=exc)

    async def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``, or less when :meth:`stop` is called (then True)."""
        if self.stopping:
            return True
        await self._wakeup.wait(seconds)
        return self.stopping

    async def stop(self, *, grace_s: float = 0.0) -> None:
        """Signal, wait up to ``grace_s`` for the body to end, then cancel and await (module docstring)."""
        task = self._task
        if task is None:
            return
        self.stopping = True
        self._wakeup.set()
        if grace_s > 0 and not task.done():
            await asyncio.wait({task}, timeout=grace_s)
        tries = 0
        while not task.done() and tries < self.cancel_tries:
            task.cancel()
            tries += 1
            await asyncio.wait({task}, timeout=self.cancel_wait_s)
        if not task.done():
            self.log.error("background task %s still runs after %d cancellations; left behind", self.name, tries)
        self._task = None


async def stop_all(runners: list[Background], *, grace_s: float = 0.0) -> None:
    """:meth:`Background.stop` every runner at once (so their bounds are not added up)."""
    await asyncio.gather(*(r.stop(grace_s=grace_s) for r in runners))


class Periodic(Background, Generic[T]):
    """See the module docstring."""

    def __init__(self, name: str, turn: Callable[[], Awaitable[T]], *, interval_s: float | Callable[[], float],
                 first_s: float | Callable[[], float] | None = None, rate: bool = False,
                 leader: Callable[[], bool] | None = None, standby: Callable[[], Awaitable[T]] | None = None,
                 due: Callable[[], bool] | None = None, park: Callable[[], Awaitable[object]] | None = None,
                 wait: Callable[[float], Awaitable[object]] | None = None,
                 on_error: Callable[[Exception], None] | None = None, clock: Clock | None = None,
                 logger: logging.Logger | None = None, cancel_tries: int = 20, cancel_wait_s: float = 0.1,
                 backoff_max_s: float = 60.0, log_every_s: float = 60.0) -> None:
        super().__init__(name, logger=logger, cancel_tries=cancel_tries, cancel_wait_s=cancel_wait_s)
        self._turn = turn
        self._interval = interval_s
        self._first = first_s
        self.rate = rate
        self.leader = leader
        self._standby = standby
        self._due = due
        self._park = park
        self._wait = wait
        self._on_error = on_error
        self._clock = clock
        self._first_once: float | None = None
        self.turns = 0
        self.standby_turns = 0
        self.turn_errors = 0
        self.backoff_max_s = backoff_max_s
        self.log_every_s = log_every_s
        self.failing = 0                        # failed turns in a row (0 while it goes well)
        self._logged_at: float | None = None    # when the last failure line was written
        self._unlogged = 0                      # failures since that line

    def interval(self) -> float:
        return float(self._interval() if callable(self._interval) else self._interval)

    def _first_wait(self) -> float:
        if self._first is None:
            return self.interval()
        return float(self._first() if callable(self._first) else self._first)

    def start(self, first_s: float | None = None) -> None:
        """Start the loop; ``first_s`` overrides the wait before the first turn, for this start."""
        if not self.running:
            self._first_once = first_s
        super().start()

    async def once(self) -> T | None:
        """One turn through the leader gate; its exception propagates (module docstring)."""
        if self.leader is not None and not self.leader():
            self.standby_turns += 1
            return await self._standby() if self._standby is not None else None
        self.turns += 1
        return await self._turn()

    def _now(self) -> float:
        return self._clock.monotonic() if self._clock is not None else asyncio.get_running_loop().time()

    async def run_turn(self) -> bool:
        """:meth:`once` with the loop's report of a failure; True when the turn went well."""
        try:
            await self.once()
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # the loop must outlive one bad turn
            self.turn_errors += 1
            self.failing += 1
            self.last_error = describe_error(exc)
            self.report(exc)
            return False
        if self.failing:
            self.log.info("%s recovered after %d failed turn%s", self.name, self.failing,
                          "" if self.failing == 1 else "s")
        self.failing = 0
        self._logged_at = None
        self._unlogged = 0
        self.last_error = None
        return True

    def label(self) -> str:
        """How the failure line names the loop (its name; a process timer says which round)."""
        return self.name

    def retry_in(self) -> float:
        """The wait before the next turn while :attr:`failing` (module docstring: the back-off)."""
        interval = self.interval()
        if self.failing <= 1 or self.backoff_max_s <= 0:
            return interval
        cap = max(interval, self.backoff_max_s)
        return min(cap, interval * 2.0 ** min(self.failing - 1, 60))

    def report(self, exc: Exception) -> None:
        """Report a failed turn: the owner's ``on_error``, then the rate-limited WARNING line."""
        if self._on_error is not None:
            self._on_error(exc)
        now = self._now()
        self._unlogged += 1
        if self._logged_at is not None and now - self._logged_at < self.log_every_s:
            return
        # One line, no traceback: a loop failing for an hour must not fill the log with stacks.
        what = " ".join(describe_error(exc).split())
        since = f" ({self._unlogged} failures since the last report)" if self._logged_at is not None else ""
        self.log.warning("%s failed: %s; retrying in %.3gs%s", self.label(), what, self.retry_in(), since)
        self._logged_at = now
        self._unlogged = 0

    async def body(self) -> None:
        now = self._clock.monotonic if self._clock is not None else asyncio.get_running_loop().time
        wait = self._wait or self.sleep
        delay = self._first_wait() if self._first_once is None else self._first_once
        self._first_once = None
        while not self.stopping:
            if self._park is not None:
                await self._park()
            await wait(max(0.0, delay))
            if self.stopping:
                return
            interval = self.interval()
            started = now()
            if self._due is None or self._due():
                await self.run_turn()
            delay = interval - (now() - started) if self.rate else interval
            if self.failing:
                delay = max(delay, self.retry_in())
