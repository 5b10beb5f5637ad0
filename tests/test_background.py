"""The one background runner (background.py): start, stop (signal, grace, cancel-and-await with a
bound), an escaped exception reported once and kept, and the periodic loop: first wait, fixed
delay or fixed rate, intervals read at every turn, park, due, leader gating, failed turns.

Time never passes for real: the periodic loops take a ``ManualClock`` and a fake ``wait`` that
records what was asked and moves the clock; the loop is driven by yielding to the event loop a
bounded number of times. The one real wait is the runner's own 0 s cancellation retry.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from inferlb.background import Background, Periodic, stop_all
from inferlb.types import ManualClock

HOUR = 3600.0
HANG_GUARD_S = 20.0


async def _until(cond: object, passes: int = 2000) -> None:
    for _ in range(passes):
        if callable(cond) and cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


class FakeTime:
    """A ``wait`` for :class:`Periodic`: records each wait, moves ``clock`` by it, and after
    ``limit`` waits parks until the loop is cancelled (so a test sees a bounded number of turns)."""

    def __init__(self, clock: ManualClock, limit: int) -> None:
        self.clock = clock
        self.limit = limit
        self.waits: list[float] = []

    async def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        if len(self.waits) > self.limit:
            await asyncio.Event().wait()
        self.clock.advance(seconds)

    @property
    def parked(self) -> bool:
        return len(self.waits) > self.limit


# ---------------------------------------------------------------------------------------- Background


async def test_start_runs_the_body_once_and_stop_cancels_and_awaits_it() -> None:
    started: list[str] = []
    ended: list[str] = []

    async def body() -> None:
        started.append("x")
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("x")

    bg = Background("test-body", body)
    bg.start()
    bg.start()                                   # already running: nothing
    await _until(lambda: started)
    assert bg.running and started == ["x"]
    await bg.stop()
    assert ended == ["x"] and not bg.running and not bg.started and not bg.failed and bg.last_error is None
    await bg.stop()                              # stopped: nothing to do


async def test_an_escaped_exception_is_logged_once_and_kept(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        raise ValueError("boom")

    bg = Background("test-dies", body, logger=logging.getLogger("test.background"))
    with caplog.at_level(logging.ERROR, "test.background"):
        bg.start()
        await _until(lambda: bg.failed)
        await bg.stop()
    assert bg.last_error == "ValueError: boom" and not bg.running
    records = [r for r in caplog.records if r.name == "test.background"]
    assert len(records) == 1 and "test-dies" in records[0].getMessage() and records[0].exc_info


async def test_a_restart_clears_the_failure() -> None:
    fail = [True]

    async def body() -> None:
        if fail[0]:
            raise RuntimeError("first start")
        await asyncio.Event().wait()

    bg = Background("test-restart", body, logger=logging.getLogger("test.background.quiet"))
    bg.start()
    await _until(lambda: bg.failed)
    assert bg.started and not bg.running                  # ended by itself: started until stop()
    fail[0] = False
    bg.start()
    assert not bg.failed and bg.last_error is None and bg.running
    await bg.stop()


async def test_stop_signals_first_and_a_body_that_ends_in_its_grace_is_not_cancelled() -> None:
    how: list[str] = []
    bg: Background

    async def body() -> None:
        try:
            while not bg.stopping:
                await bg.sleep(HOUR)             # stop() cuts this short
            how.append("ended by itself")
        except asyncio.CancelledError:
            how.append("cancelled")
            raise

    bg = Background("test-grace", body)
    bg.start()
    await asyncio.sleep(0)
    await asyncio.wait_for(bg.stop(grace_s=HANG_GUARD_S), HANG_GUARD_S)
    assert how == ["ended by itself"]


async def test_a_swallowed_cancellation_is_cancelled_again() -> None:
    swallowed: list[int] = []

    async def body() -> None:
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:      # what a Redis client's own timeout can turn it into
                if len(swallowed) == 2:
                    raise
                swallowed.append(1)

    bg = Background("test-swallow", body, cancel_wait_s=0.0)
    bg.start()
    await asyncio.sleep(0)
    await asyncio.wait_for(bg.stop(), HANG_GUARD_S)
    assert len(swallowed) == 2 and not bg.running


async def test_a_task_that_never_stops_is_reported_and_left_after_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    swallowed: list[int] = []

    async def body() -> None:
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if len(swallowed) == 5:
                    raise
                swallowed.append(1)

    bg = Background("test-stubborn", body, cancel_tries=3, cancel_wait_s=0.0,
                    logger=logging.getLogger("test.background"))
    bg.start()
    await asyncio.sleep(0)
    task = bg._task
    assert task is not None
    with caplog.at_level(logging.ERROR, "test.background"):
        await asyncio.wait_for(bg.stop(), HANG_GUARD_S)
    assert len(swallowed) == 3 and not task.done()
    assert any("after 3 cancellations" in r.getMessage() for r in caplog.records)
    for _ in range(3):                           # the test's own clean-up: it gives in at the sixth
        task.cancel()
        await asyncio.wait({task}, timeout=0)
    assert task.cancelled()


async def test_stop_all_stops_every_runner() -> None:
    runners = [Background(f"test-all-{i}", lambda: asyncio.Event().wait()) for i in range(3)]
    for r in runners:
        r.start()
    await asyncio.sleep(0)
    await stop_all(runners)
    assert not any(r.running for r in runners)


# ---------------------------------------------------------------------------------------- Periodic


def _periodic(clock: ManualClock, fake: FakeTime, *, took_s: float = 0.0,
              **kw: Any) -> tuple[Periodic[None], list[float]]:
    at: list[float] = []

    async def turn() -> None:
        at.append(clock.monotonic() - 1_000.0)
        clock.advance(took_s)

    p: Periodic[None] = Periodic("test-periodic", turn, wait=fake.wait, clock=clock, **kw)
    return p, at


async def test_fixed_delay_counts_the_interval_from_the_end_of_a_turn() -> None:
    clock = ManualClock()
    fake = FakeTime(clock, limit=3)
    p, at = _periodic(clock, fake, took_s=2.0, interval_s=10.0, first_s=0.0)
    p.start()
    await _until(lambda: fake.parked)
    await p.stop()
    assert at == [0.0, 12.0, 24.0] and fake.waits == [0.0, 10.0, 10.0, 10.0] and p.turns == 3


async def test_fixed_rate_starts_turns_every_interval_and_catches_up_after_an_overrun() -> None:
    clock = ManualClock()
    fake = FakeTime(clock, limit=3)
    p, at = _periodic(clock, fake, took_s=2.0, interval_s=10.0, first_s=0.0, rate=True)
    p.start()
    await _until(lambda: fake.parked)
    await p.stop()
    assert at == [0.0, 10.0, 20.0] and fake.waits == [0.0, 8.0, 8.0, 8.0]

    clock = ManualClock()
    fake = FakeTime(clock, limit=3)
    p, at = _periodic(clock, fake, took_s=15.0, interval_s=10.0, first_s=0.0, rate=True)
    p.start()
    await _until(lambda: fake.parked)
    await p.stop()
    assert at == [0.0, 15.0, 30.0] and fake.waits == [0.0, 0.0, 0.0, 0.0]


async def test_the_first_wait_defaults_to_one_interval_and_start_may_override_it() -> None:
    clock = ManualClock()
    fake = FakeTime(clock, limit=1)
    p, at = _periodic(clock, fake, interval_s=7.0)
    p.start()
    await _until(lambda: fake.parked)
    await p.stop()
    assert fake.waits == [7.0, 7.0] and at == [7.0]

    fake2 = FakeTime(clock, limit=1)
    p2, _ = _periodic(clock, fake2, interval_s=7.0)
    p2.start(first_s=0.5)
    await _until(lambda: fake2.parked)
    await p2.stop()
    assert fake2.waits == [0.5, 7.0]


async def test_the_interval_is_read_at_every_turn() -> None:
    clock = ManualClock()
    fake = FakeTime(clock, limit=3)
    every = [5.0]
    p, at = _periodic(clock, fake, interval_s=lambda: every[0], first_s=0.0)

    async def turn() -> None:
        at.append(clock.monotonic() - 1_000.0)
        every[0] *= 2                            # a reload during a turn: the next turn's wait has it

    p._turn = turn
    p.start()
    await _until(lambda: fake.parked)
    await p.stop()
    assert fake.waits == [0.0, 5.0, 10.0, 20.0]   # each read as its turn starts (as health's timer did)


async def test_park_runs_before_every_wait_and_due_skips_turns_uncounted() -> None:
    clock = ManualClock()
    fake = FakeTime(clock, limit=4)
    parks: list[int] = []
    due = iter([True, False, True, False])

    async def park() -> None:
        parks.append(len(fake.waits))

    p, at = _periodic(clock, fake, interval_s=1.0, first_s=0.0, park=park, due=lambda: next(due))
    p.start()
    await _until(lambda: fake.parked)
    await p.stop()
    assert parks == [0, 1, 2, 3, 4] and at == [0.0, 2.0] and p.turns == 2


async def test_leader_gating_runs_standby_instead_and_counts_it() -> None:
    leading = [False]
    ran: list[str] = []

    async def turn() -> str:
        ran.append("turn")
        return "decided"

    async def standby() -> str:
        ran.append("standby")
        return "waited"

    p = Periodic("test-leader", turn, interval_s=HOUR, leader=lambda: leading[0], standby=standby)
    assert await p.once() == "waited" and p.standby_turns == 1 and p.turns == 0
    leading[0] = True
    assert await p.once() == "decided" and p.turns == 1
    no_standby = Periodic("test-leader-2", turn, interval_s=HOUR, leader=lambda: False)
    assert await no_standby.once() is None and no_standby.standby_turns == 1
    assert ran == ["standby", "turn"]


async def test_a_failed_turn_is_counted_kept_reported_once_and_the_loop_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    fake = FakeTime(clock, limit=3)
    outcomes = iter([ValueError("bad turn"), None, KeyError("k")])
    reported: list[str] = []

    async def turn() -> None:
        exc = next(outcomes)
        if exc is not None:
            raise exc

    def on_error(exc: Exception) -> None:
        reported.append(repr(exc))

    p = Periodic("test-errors", turn, interval_s=1.0, first_s=0.0, wait=fake.wait, clock=clock, on_error=on_error)

    p.start()
    await _until(lambda: fake.parked)
    await p.stop()
    assert reported == ["ValueError('bad turn')", "KeyError('k')"] and p.turn_errors == 2 and p.turns == 3
    assert p.last_error == "KeyError: 'k'" and not p.failed

    # The runner logs it itself, on_error or not: one WARNING line, no traceback.
    async def broken() -> None:
        raise RuntimeError("no handler")

    q = Periodic("test-default-report", broken, interval_s=HOUR, logger=logging.getLogger("test.background"))
    with caplog.at_level(logging.WARNING, "test.background"):
        assert await q.run_turn() is False
    recs = [r for r in caplog.records if r.name == "test.background"]
    assert len(recs) == 1 and not recs[0].exc_info and q.last_error == "RuntimeError: no handler"
    assert recs[0].levelno == logging.WARNING and "RuntimeError: no handler" in recs[0].getMessage()

    async def fine() -> None:
        return None

    q._turn = fine
    assert await q.run_turn() is True and q.last_error is None     # a good turn clears it


async def test_a_failing_loop_backs_off_logs_one_line_a_minute_and_one_when_it_recovers(
        caplog: pytest.LogCaptureFixture) -> None:
    """docs/reliability.md: a refresh failing for ten minutes is a handful of WARNING lines
    without traceback, with the waits doubling to the cap, and one INFO line when it is back."""
    clock = ManualClock()
    fake = FakeTime(clock, limit=14)
    failing = [True]

    async def turn() -> None:
        if fake.waits and len(fake.waits) >= 13:
            failing[0] = False
        if failing[0]:
            raise ConnectionError("database\n  away")

    log = logging.getLogger("test.background.backoff")
    p: Periodic[None] = Periodic("test-backoff", turn, interval_s=2.0, first_s=0.0, wait=fake.wait, clock=clock,
                                 logger=log, backoff_max_s=30.0)
    with caplog.at_level(logging.INFO, log.name):
        p.start()
        await _until(lambda: fake.parked)
        await p.stop()
    # One interval after the first failure, then doubling up to the cap; the interval once it recovered.
    assert fake.waits[:8] == [0.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0], fake.waits
    assert fake.waits[-1] == 2.0 and p.failing == 0 and p.last_error is None
    recs = [r for r in caplog.records if r.name == log.name]
    assert all(not r.exc_info for r in recs)
    warnings = [r for r in recs if r.levelno == logging.WARNING]
    # Twelve failures at 0, 2, 6, 14, 30, 60 … 240 s: lines at 0, 60, 120, 180, 240 s only.
    assert len(warnings) == 5, [r.getMessage() for r in warnings]
    first = warnings[0].getMessage()
    assert first == "test-backoff failed: ConnectionError: database away; retrying in 2s", first
    assert "failures since the last report" in warnings[-1].getMessage()
    recovered = [r.getMessage() for r in recs if r.levelno == logging.INFO]
    assert recovered == ["test-backoff recovered after 12 failed turns"]


async def test_a_cancellation_is_never_reported_as_a_failed_turn() -> None:
    async def turn() -> None:
        await asyncio.Event().wait()

    p = Periodic("test-cancel", turn, interval_s=HOUR, first_s=0.0)
    p.start()
    await _until(lambda: p.turns == 1)
    await p.stop()
    assert p.turn_errors == 0 and p.last_error is None and not p.failed


async def test_stop_cuts_the_default_wait_short() -> None:
    async def turn() -> None:
        return None

    p = Periodic("test-wake", turn, interval_s=HOUR, first_s=0.0)
    p.start()
    await _until(lambda: p.turns == 1)
    task = p._task
    assert task is not None
    await asyncio.wait_for(p.stop(grace_s=HANG_GUARD_S), HANG_GUARD_S)
    assert task.done() and not task.cancelled()      # it saw the signal and returned by itself
