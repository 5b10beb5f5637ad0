"""The idle lease and a dead replica's exit (inferlb/cluster/service.py "Idle lease",
inferlb/cluster/leave.py), on real Redis: each test drives the syncs itself; Redis's clock is
moved with ``offset_ms``, never by sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from inferlb.cluster.leave import forget_replica
from tests.cluster.admission_support import _admit, _end
from tests.cluster.conftest import REDIS_URL


async def _expiry_ms(client: Any, prefix: str, replica: str) -> int:
    raw = await client.hget(f"{prefix}cluster:replicas", replica)
    return int(raw.decode().split("|")[0])


async def _now_ms(client: Any) -> int:
    s, us = await client.time()
    return int(s) * 1000 + int(us) // 1000


async def test_an_idle_replica_renews_with_the_idle_lease_and_stays_counted(make_replica: Any,
                                                                           redis_client: tuple[Any, str]) -> None:
    client, prefix = redis_client
    a = make_replica("a", lease_s=2.0, idle_lease_s=30.0)
    b = make_replica("b", lease_s=2.0)
    assert await a.sync_once()
    assert not a.shares.idle                     # the first sync: not joined yet, the normal lease
    assert await _expiry_ms(client, prefix, "a") - await _now_ms(client) <= 2_000
    assert await a.sync_once()
    assert a.shares.idle                         # nothing in use, wanted or requested
    assert await _expiry_ms(client, prefix, "a") - await _now_ms(client) > 20_000
    assert await b.sync_once()
    grant_a = a.shares.grants["pool:m"]
    assert grant_a >= 1                          # an idle replica keeps a few slots
    # Past b's own 2 s lease: a (idle lease) is still live and its grant still counted.
    b.offset_ms = 2_500
    assert await b.sync_once()
    assert b.shares.replicas == 2 and b.shares.grants["pool:m"] == 6 - grant_a
    b.offset_ms = 30_100                         # past the idle lease too: a is gone
    assert await b.sync_once()
    assert b.shares.replicas == 1


async def test_the_first_request_after_an_idle_sync_rearms_the_sync_without_syncing(make_replica: Any) -> None:
    a = make_replica("a", lease_s=2.0, idle_lease_s=30.0)
    woken: list[str] = []
    a.shares.on_short = lambda: woken.append("short")
    a.shares.on_busy = lambda: woken.append("busy")
    assert await a.sync_once() and await a.sync_once()
    assert a.shares.idle
    assert _admit(a, "r1")["admitted"]
    # once, and not a sync now: one in flight would hold back the retry claim the request may need
    assert woken == ["busy"] and not a.shares.idle
    assert _admit(a, "r2")["admitted"]
    assert woken == ["busy"]
    assert a.shares.retry_of("m").part >= 1     # the claim of the idle sync is still there to retry with
    assert await a.sync_once()
    assert not a.shares.idle                     # something in use: the normal lease
    _end(a, "r1")
    _end(a, "r2")
    assert await a.sync_once()
    assert a.shares.idle                         # both answered: idle again
    assert _admit(a, "r3")["admitted"]
    _end(a, "r3")                                # a request between two syncs, over by the next
    assert await a.sync_once()
    assert not a.shares.idle                     # it counts: requested since the last sync
    assert await a.sync_once()
    assert a.shares.idle


async def test_without_an_idle_lease_a_replica_never_goes_idle(make_replica: Any,
                                                               redis_client: tuple[Any, str]) -> None:
    client, prefix = redis_client
    a = make_replica("a", lease_s=2.0)
    for _ in range(3):
        assert await a.sync_once()
    assert not a.shares.idle
    assert await _expiry_ms(client, prefix, "a") - await _now_ms(client) <= 2_000


async def test_a_forgotten_replica_gives_its_slots_back_at_once_and_says_so(make_replica: Any,
                                                                            redis_client: tuple[Any, str]) -> None:
    client, prefix = redis_client
    a = make_replica("a", lease_s=30.0)
    b = make_replica("b", lease_s=30.0)
    assert await a.sync_once()
    assert [_admit(a, f"r{i}")["admitted"] for i in range(6)] == [True] * 6
    assert await a.sync_once() and await b.sync_once()
    assert b.shares.grants["pool:m"] == 0 and b.shares.replicas == 2     # a holds all six
    ps = client.pubsub(ignore_subscribe_messages=True)
    await ps.subscribe(b.channel)
    # a is SIGKILLed; its supervisor saw it exit (no lease runs out here: 30 s, Redis's clock unmoved).
    assert await asyncio.to_thread(forget_replica, REDIS_URL, prefix, "a")
    msg = None
    for _ in range(50):          # the message is published before forget_replica returns
        msg = await ps.get_message(timeout=0.1)
        if msg is not None:
            break
    await ps.aclose()
    assert msg is not None and json.loads(msg["data"]) == {"t": "left", "from": "supervisor", "replica": "a"}
    b._on_message(msg["data"])
    assert b._wake.is_set() and b.left_received == 1 and b.status()["left_received"] == 1
    assert await b.sync_once()
    assert b.shares.grants["pool:m"] == 6 and b.shares.replicas == 1
    assert await client.hget(f"{prefix}cluster:replicas", "a") is None


async def test_forgetting_with_redis_away_is_reported_not_raised(redis_client: tuple[Any, str]) -> None:
    _, prefix = redis_client
    assert not await asyncio.to_thread(forget_replica, "redis://127.0.0.1:1/0", prefix, "a")


async def test_rearm_only_makes_the_loop_reread_its_wait_and_wake_syncs(make_replica: Any) -> None:
    a = make_replica("a", lease_s=2.0, idle_lease_s=30.0)
    a.rearm()
    assert a._wake.is_set() and not a._sync_now
    a._wake.clear()
    a.wake()
    assert a._wake.is_set() and a._sync_now


async def test_the_loop_renews_on_its_own_without_any_wake(make_replica: Any) -> None:
    # lease 0.3 s: a renewal every 0.1 s. Nothing wakes the loop; it must still sync (a loop that
    # only synced when woken would let the heartbeat expire). The bound is a hang guard.
    a = make_replica("a", lease_s=0.3)
    loop = asyncio.ensure_future(a._sync_loop())
    try:
        for _ in range(600):
            if a.syncs >= 3:
                break
            await asyncio.sleep(0.05)
        assert a.syncs >= 3, a.syncs
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
