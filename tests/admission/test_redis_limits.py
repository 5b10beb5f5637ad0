"""Shared limits on real Redis: two gateway replicas (two limiters) share one RPM/TPM bucket."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferlb.admission.buckets import Limiter, RedisSync

T0 = 1_767_225_600.0


async def test_two_replicas_share_one_bucket(redis_client: tuple[Any, str]) -> None:
    client, prefix = redis_client
    a, b = Limiter(), Limiter()
    sa, sb = RedisSync(a, client, prefix), RedisSync(b, client, prefix)
    for _ in range(6):
        assert a.check_and_take("key_1", rpm=10, tpm=None, tokens=0, now=T0).ok
    assert await sa.sync(T0)
    # Replica B has not seen the key yet: its first request creates its bucket, the sync then
    # brings it the shared level (10 − 6 − 1).
    assert b.check_and_take("key_1", rpm=10, tpm=None, tokens=0, now=T0).ok
    assert await sb.sync(T0)
    assert b.level("key_1", "rpm", T0) == pytest.approx(3)
    assert [b.check_and_take("key_1", rpm=10, tpm=None, tokens=0, now=T0).ok for _ in range(4)] == \
        [True, True, True, False]
    assert await sb.sync(T0) and await sa.sync(T0)
    assert a.level("key_1", "rpm", T0) == pytest.approx(0)
    assert not a.check_and_take("key_1", rpm=10, tpm=None, tokens=0, now=T0).ok
    # Refill is computed from the shared timestamp: 6 s at 10/min gives one request back.
    assert await sa.sync(T0 + 6)
    assert a.level("key_1", "rpm", T0 + 6) == pytest.approx(1)


async def test_usage_correction_reaches_the_other_replica(redis_client: tuple[Any, str]) -> None:
    client, prefix = redis_client
    a, b = Limiter(), Limiter()
    sa, sb = RedisSync(a, client, prefix), RedisSync(b, client, prefix)
    assert a.check_and_take("k", rpm=None, tpm=1000, tokens=800, now=T0).ok      # the estimate
    assert await sa.sync(T0)
    assert b.check_and_take("k", rpm=None, tpm=1000, tokens=100, now=T0).ok
    assert await sb.sync(T0)
    assert not b.check_and_take("k", rpm=None, tpm=1000, tokens=200, now=T0).ok  # 100 left
    a.adjust("k", "tpm", -700, T0)                                              # actual usage: 100
    assert await sa.sync(T0) and await sb.sync(T0)
    assert b.level("k", "tpm", T0) == pytest.approx(800)
    assert b.check_and_take("k", rpm=None, tpm=1000, tokens=200, now=T0).ok


async def test_taken_during_the_round_trip_stays_taken(redis_client: tuple[Any, str]) -> None:
    client, prefix = redis_client
    a = Limiter()
    sa = RedisSync(a, client, prefix)
    assert a.check_and_take("k", rpm=10, tpm=None, tokens=0, now=T0).ok
    sync = asyncio.create_task(sa.sync(T0))
    await asyncio.sleep(0)                     # the exchange is on the wire: its delta was sent
    assert a.buckets[("k", "rpm")].pending == 0
    assert a.check_and_take("k", rpm=10, tpm=None, tokens=0, now=T0).ok     # lands before Redis answers
    assert await sync
    assert a.level("k", "rpm", T0) == pytest.approx(8)    # Redis said 9; the take in flight is kept
    assert await sa.sync(T0)
    assert a.level("k", "rpm", T0) == pytest.approx(8)
    raw = await client.hgetall(f"{prefix}bucket:rpm:k")
    assert float(raw[b"level"]) == pytest.approx(8)


async def test_redis_away_keeps_limits_local_and_resends_later(redis_client: tuple[Any, str]) -> None:
    import redis.asyncio as aioredis

    client, prefix = redis_client
    dead = aioredis.from_url("redis://127.0.0.1:1/0", socket_timeout=0.2, socket_connect_timeout=0.2)
    a = Limiter()
    try:
        down = RedisSync(a, dead, prefix)
        for _ in range(3):
            assert a.check_and_take("k", rpm=3, tpm=None, tokens=0, now=T0).ok
        assert not await down.sync(T0)
        assert not a.check_and_take("k", rpm=3, tpm=None, tokens=0, now=T0).ok   # still limited, locally
        up = RedisSync(a, client, prefix)
        assert await up.sync(T0)                                                 # the 3 taken reach Redis
        raw = await client.hgetall(f"{prefix}bucket:rpm:k")
        assert float(raw[b"level"]) == pytest.approx(0)
    finally:
        await dead.aclose()
