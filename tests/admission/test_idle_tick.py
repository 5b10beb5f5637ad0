"""The queue tick runs only while something waits: an idle gateway does not wake every ``tick_s``.

The ticks are counted (``AdmissionService.ticks``); the loop is driven by yielding to the event
loop a bounded number of times, never by sleeping for time to pass. With ``tick_s`` at 1 µs a
loop that did not park would tick on nearly every pass.
"""

from __future__ import annotations

import asyncio

from inferlb.admission.service import AdmissionService
from tests.admission.rig import make_rig

_TINY_TICK = {"queue": {"tick_s": 1e-6}}


async def _spin(passes: int = 200) -> None:
    for _ in range(passes):
        await asyncio.sleep(0)


async def test_the_tick_loop_parks_while_nothing_is_queued() -> None:
    r = make_rig(_TINY_TICK)
    svc = AdmissionService(r.ctl, None)
    await svc.start()
    try:
        held = [r.admit(f"r{i}") for i in range(4)]           # every slot taken, nothing queued
        assert all(a["admitted"] for _, a in held)
        await _spin()
        assert svc.ticks == 0 and not r.ctl.has_queued()
    finally:
        await svc.stop()


async def test_a_queued_request_wakes_the_tick_loop_until_the_queue_is_empty() -> None:
    r = make_rig(_TINY_TICK)
    svc = AdmissionService(r.ctl, None)
    await svc.start()
    try:
        held = [r.admit(f"r{i}")[0] for i in range(4)]
        s, a = r.admit("q")
        assert a["queue"] is True and r.ctl.has_queued()
        for _ in range(10_000):                                  # bounded: the loop must tick soon
            if svc.ticks:
                break
            await asyncio.sleep(0)
        assert svc.ticks > 0
        r.clock.advance(2.5)                                     # past the standard class's 2 s wait
        for _ in range(10_000):
            if not r.ctl.has_queued():
                break
            await asyncio.sleep(0)
        assert r.ctl.wait_result(s)["outcome"] == "expired"     # the tick expired it
        await _spin(5)
        parked_at = svc.ticks
        await _spin()
        assert svc.ticks == parked_at                            # queue empty again: parked
        for h in held:
            r.end(h)
    finally:
        await svc.stop()


async def test_the_redis_sync_parks_until_a_bucket_exists() -> None:
    """With a Redis URL the bucket sync runs every ``redis_sync_s`` only while some RPM/TPM bucket
    exists (1 µs here: a loop that did not park would turn on nearly every pass)."""
    from tests.admission.conftest import REDIS_URL

    r = make_rig({"redis_sync_s": 1e-6})
    r.ctl.env = r.ctl.env.model_copy(update={"redis_url": REDIS_URL, "limits": "auto"})
    svc = AdmissionService(r.ctl, None)
    await svc.start()
    try:
        assert svc.sync is not None
        loop = next(x for x in svc._loops if x.name == "inferlb-admission-redis-sync")
        await _spin()
        assert loop.turns == 0 and not r.ctl.limiter.buckets
        r.add_key(rpm=600)
        s, a = r.admit("k", key="key_1")                       # makes the key's RPM bucket
        assert a["admitted"] and r.ctl.limiter.buckets
        for _ in range(10_000):                                 # bounded: it must sync soon (real Redis)
            if svc.sync.syncs or svc.sync.failures:
                break
            await asyncio.sleep(0.001)
        assert loop.turns > 0 and (svc.sync.syncs or svc.sync.failures)
        r.end(s)
    finally:
        await svc.stop()
