"""``Wakeup`` (wakeup.py): a set wakes every waiter at once and says so; a set before the
wait wakes the next wait; from another thread too. The timeouts here are an hour, so only a
wake-up gets a waiter out before the hang guard; the one timeout path uses 0 s."""

from __future__ import annotations

import asyncio

from inferlb.wakeup import Wakeup

HOUR = 3600.0
HANG_GUARD_S = 20.0


async def test_set_wakes_every_waiter() -> None:
    w = Wakeup()
    waiters = [asyncio.create_task(w.wait(HOUR)) for _ in range(3)]
    await asyncio.sleep(0)                 # let them start waiting
    w.set()
    assert await asyncio.wait_for(asyncio.gather(*waiters), HANG_GUARD_S) == [True, True, True]
    assert not w.is_set()


async def test_a_set_before_the_wait_wakes_the_next_wait_only() -> None:
    w = Wakeup()
    w.set()
    assert await asyncio.wait_for(w.wait(HOUR), HANG_GUARD_S)
    assert not await w.wait(0.0)           # the timer: not woken


async def test_set_from_another_thread() -> None:
    w = Wakeup()
    waiter = asyncio.create_task(w.wait(HOUR))
    await asyncio.sleep(0)
    await asyncio.to_thread(w.set_threadsafe)
    assert await asyncio.wait_for(waiter, HANG_GUARD_S)
