"""Shared node health on real Redis: an ejection, a hardware ejection or a 429 cool-down seen by
one replica is the state of every replica after one publish (bounded polls, never sleeps for
time: the fleets run on manual clocks; only the propagation through Redis is awaited, with a hang
guard, not a latency bound: a loaded machine may take longer than the design's 1 s)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from inferlb.cluster.service import ClusterService
from inferlb.types import ManualClock


async def _until(pred: Callable[[], bool], deadline_s: float = 15.0) -> None:
    """Poll ``pred`` until it holds; fail after ``deadline_s`` (a hang guard, not a timing check)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not pred():
        if loop.time() > end:
            raise AssertionError(f"not within {deadline_s}s")
        await asyncio.sleep(0.005)


async def _started(make_replica: Any, *names: str) -> list[ClusterService]:
    reps = [make_replica(n) for n in names]
    for svc in reps:
        await svc.start()
    await _until(lambda: all(s.health_received >= 0 and s.started for s in reps))
    # Every listener has subscribed (a publish before that would wait for the next sync's version
    # check, which the manual clocks never bring).
    channel, redis = reps[0].channel, reps[0].redis
    for _ in range(3000):   # bounded: at most ~15 s
        (_, subscribers), = await redis.pubsub_numsub(channel)
        if subscribers >= len(reps):
            break
        await asyncio.sleep(0.005)
    else:
        raise AssertionError("the replicas' listeners never subscribed")
    return reps


async def test_an_ejection_by_one_replica_is_every_replicas_state(make_replica: Any) -> None:
    a, b, c = await _started(make_replica, "a", "b", "c")
    for _ in range(5):
        a.fleet.report_failure("n0")        # Envoy's 5 consecutive failures, seen by a only
    assert a.fleet.nodes["n0"].state == "ejected"
    await _until(lambda: all(s.fleet.nodes["n0"].state == "ejected" for s in (b, c)))
    for s in (a, b, c):
        st = s.fleet.nodes["n0"]
        assert st.ejections == 1 and st.backoff == 1
        left = st.ejected_until - s.clock.monotonic()
        assert 29.0 < left <= 30.0             # base_ejection_s, on every replica
    ev = b.fleet.queued_events()[-1]
    assert ev.to_state == "ejected" and ev.evidence["shared_from"] == "a"
    assert not b.fleet.views().by_model["m"][0].healthy


async def test_two_replicas_ejecting_at_once_make_one_ejection(make_replica: Any) -> None:
    a, b = await _started(make_replica, "a", "b")
    for _ in range(5):
        a.fleet.report_failure("n1")
        b.fleet.report_failure("n1")
    await _until(lambda: a.health.pending == {} and b.health.pending == {})
    await _until(lambda: a.fleet.nodes["n1"].ejected_until == pytest.approx(b.fleet.nodes["n1"].ejected_until,
                                                                            abs=0.1))
    rec = await _record(a, "n1")
    assert rec["ejections"] == 1 and rec["backoff"] == 1


async def test_a_cooldown_and_a_hardware_fault_are_shared(make_replica: Any) -> None:
    a, b = await _started(make_replica, "a", "b")
    a.fleet.cool_down("n0", 7.0)                        # a 429 with Retry-After: 7
    await _until(lambda: b.fleet.nodes["n0"].state == "cooldown")
    assert b.fleet.nodes["n0"].cooldown_until - b.clock.monotonic() == pytest.approx(7.0, abs=0.2)
    b.fleet.eject("n1", "hardware: GPU 0: new Xid 79", {"rule": "hardware"}, hardware=True, seconds=120)
    await _until(lambda: a.fleet.nodes["n1"].state == "ejected")
    st = a.fleet.nodes["n1"]
    assert st.hardware_fault and st.ejected_until - a.clock.monotonic() == pytest.approx(120.0, abs=0.2)


async def test_a_replica_that_was_away_catches_up_from_the_shared_record(make_replica: Any) -> None:
    (a,) = await _started(make_replica, "a")
    for _ in range(5):
        a.fleet.report_failure("n0")
    await _until(lambda: not a.health.pending)
    late = make_replica("late", clock=ManualClock())
    assert await late.sync_once()       # the version moved: the full read applies the record
    assert late.fleet.nodes["n0"].state == "ejected" and late.fleet.nodes["n0"].ejections == 1


async def _record(svc: ClusterService, node: str) -> dict[str, Any]:
    import json

    raw = await svc.redis.hget(svc._k("health"), node)
    out: dict[str, Any] = json.loads(raw)
    return out
