"""Admissions that land while a replica's sync is on its way to Redis and back, on real Redis.

A sync reports what this replica holds *now*; the script may answer with a smaller grant and
record it for the others to count. A request admitted between the report and the answer on the
old, larger grant would be held outside every recorded grant, and the others could then be
granted the same slots. These tests put admissions exactly there: the sync runs as a task that
has taken its report (its first step) and waits for Redis, while the test admits on the same
event loop, before the answer can be read. No sleeping, no timing: the order is the loop's.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from inferlb.admission.keys import ApiKey
from inferlb.cluster.service import ClusterService
from tests.cluster.admission_support import _admit, _ctl, _end

LIMIT = 6    # small_fleet(): pool m on 2 nodes × 3 slots


def _held(reps: list[ClusterService]) -> int:
    return sum(_ctl(s).pools["m"].admitted for s in reps if "m" in _ctl(s).pools)


async def _sync_started(svc: ClusterService) -> asyncio.Task[bool]:
    """A sync of ``svc`` that has sent its report and not yet read the answer."""
    task = asyncio.create_task(svc.sync_once())
    await asyncio.sleep(0)      # one turn of the loop: the task's first step takes the report
    assert not task.done()      # the answer needs Redis's reply, which this step has not read
    return task


async def test_admitted_while_the_sync_is_in_flight_stays_inside_the_recorded_grants(make_replica: Any) -> None:
    a, b, c = reps = [make_replica(n) for n in ("a", "b", "c")]
    for _ in range(2):
        for svc in reps:
            assert await svc.sync_once()
    assert [s.shares.grants["pool:m"] for s in reps] == [2, 2, 2]     # idle: an even split
    for svc in (b, c):      # b and c are busy: two in flight each, four queued each
        assert [_admit(svc, f"{svc.id}{i}")["admitted"] for i in range(6)] == [True] * 2 + [False] * 4
    for svc in (b, c, b, c):
        assert await svc.sync_once()    # their demand (6 each) is registered; a still holds its 2
    # a was idle when its sync took the report (0 in use): the answer lowers its grant to its
    # target (0), and b and c are then granted the rest. Two requests reach a meanwhile.
    task = await _sync_started(a)
    for i in range(2):
        _admit(a, f"a{i}")
    assert await task
    for svc in (b, c, b, c):
        assert await svc.sync_once()
    held = [_ctl(s).pools["m"].admitted for s in reps]
    assert sum(held) <= LIMIT, held
    assert sum(held) == LIMIT, held     # and the pool is used: nobody waits for a slot that is free


async def test_a_keys_share_holds_while_a_sync_is_in_flight(make_replica: Any) -> None:
    a, b = reps = [make_replica("a"), make_replica("b")]
    key = ApiKey(id="key_1", tenant="t", key_hash="0" * 64, hint="h", max_parallel=2)
    for svc in reps:
        _ctl(svc).keys.put(key)
    for _ in range(2):
        for svc in reps:
            assert await svc.sync_once()
    assert _admit(b, "b0", "key_1")["admitted"]
    assert _admit(b, "b1", "key_1")["status"] == 429       # b's share is one: its demand is two
    assert await b.sync_once()
    task = await _sync_started(a)                           # a reports 0 in use of the key
    # Its grant of one may be lowered to 0 by this very sync: a request now is refused for want
    # of share (taken, it would be held outside the grants the script records).
    assert _admit(a, "a0", "key_1")["status"] == 429
    assert await task
    for rid in ("b2", "b3"):       # b asks again (a refusal registers its demand), then syncs
        _admit(b, rid, "key_1")
        assert await b.sync_once()
    parallel = _ctl(a).parallel["key_1"] + _ctl(b).parallel["key_1"]
    assert parallel == 2, (_ctl(a).parallel, _ctl(b).parallel)    # the key's limit, and all of it used


async def test_random_interleavings_with_syncs_in_flight_never_pass_the_limit(make_replica: Any) -> None:
    reps = [make_replica(n) for n in ("a", "b", "c")]
    for svc in reps:
        assert await svc.sync_once()
    rng = random.Random(1)
    live: list[tuple[ClusterService, str]] = []
    seq = 0

    def step() -> None:
        nonlocal seq
        svc = rng.choice(reps)
        if rng.random() < 0.5 or not live:
            seq += 1
            _admit(svc, f"s{seq}")
        else:
            owner, rid = live.pop(rng.randrange(len(live)))
            _end(owner, rid)

    worst = 0
    for _ in range(400):
        for _ in range(rng.randrange(3)):       # requests that come and go between syncs
            step()
        task = await _sync_started(rng.choice(reps))
        for _ in range(rng.randrange(5)):       # and while one is in flight
            step()
        assert await task
        for owner in reps:
            for rid, h in _ctl(owner).holds.items():
                if h.admitted_at is not None and (owner, rid) not in live:
                    live.append((owner, rid))
        worst = max(worst, _held(reps))
        assert _held(reps) <= LIMIT, [_ctl(s).pools["m"].admitted for s in reps]
    assert worst == LIMIT
