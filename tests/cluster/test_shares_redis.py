"""Slot shares, the shared retry budget and Redis-away fallback, on real Redis (no loops: each
test drives the replicas' syncs itself, so every step is deterministic)."""

from __future__ import annotations

import random
from typing import Any

from inferlb.admission.keys import ApiKey
from inferlb.cluster.admission import SharedRetryBudget
from inferlb.cluster.service import ClusterService
from tests.cluster.admission_support import _admit, _ctl, _end, _scope
from tests.cluster.conftest import REDIS_URL, small_fleet
from tests.cluster.proxy import TcpProxy


async def _grants(client: Any, prefix: str) -> dict[str, int]:
    raw = await client.hgetall(f"{prefix}cluster:slots:pool:m")
    return {k.decode(): int(v.decode().split("|")[0]) for k, v in raw.items()}


async def test_idle_replicas_split_the_pool_and_a_busy_one_gets_it_back(make_replica: Any,
                                                                        redis_client: tuple[Any, str]) -> None:
    client, prefix = redis_client
    a, b, c = (make_replica(n) for n in ("a", "b", "c"))      # pool m: 2 nodes × 3 slots = 6
    for _ in range(2):
        for svc in (a, b, c):
            assert await svc.sync_once()
            assert sum((await _grants(client, prefix)).values()) <= 6
    assert await _grants(client, prefix) == {"a": 2, "b": 2, "c": 2}     # idle: an even split
    assert all(svc.shares.replicas == 3 for svc in (a, b, c))
    assert [_admit(a, f"r{i}")["admitted"] for i in range(3)] == [True, True, False]   # the 3rd queues
    assert _ctl(a).pools["m"].queue is not None and len(_ctl(a).pools["m"].queue or ()) == 1
    assert await a.sync_once()                  # registers demand 3: target 4, but b and c hold 4
    assert a.shares.grants["pool:m"] == 2 and a.shares.targets["pool:m"] == 4 and a.shares.wants_more()
    for svc in (b, c):
        assert await svc.sync_once()            # each gives back down to its target (1)
    assert await a.sync_once()                  # and a takes it: the queued request gets its slot
    assert await _grants(client, prefix) == {"a": 4, "b": 1, "c": 1}
    assert _ctl(a).pools["m"].admitted == 3 and not len(_ctl(a).pools["m"].queue or ())


async def test_a_killed_replicas_slots_come_back_after_the_lease(make_replica: Any,
                                                                 redis_client: tuple[Any, str]) -> None:
    client, prefix = redis_client
    a = make_replica("a", lease_s=2.0)
    assert await a.sync_once()
    assert [_admit(a, f"r{i}")["admitted"] for i in range(6)] == [True] * 6
    assert await a.sync_once()
    b = make_replica("b", lease_s=2.0)
    assert await b.sync_once()
    assert b.shares.grants["pool:m"] == 0       # a holds all six in flight
    # a is SIGKILLed: it never syncs again and never hands back. On Redis's clock, one lease later
    # (moved by offset_ms, not by sleeping) its entry has expired: its slots are b's to take.
    b.offset_ms = 1_000
    assert await b.sync_once()
    assert b.shares.grants["pool:m"] == 0       # half a lease: still a's
    b.offset_ms = 2_001
    assert await b.sync_once()
    assert b.shares.grants["pool:m"] == 6 and b.shares.replicas == 1
    assert set(await _grants(client, prefix)) == {"b"}


async def test_replicas_never_hold_more_than_the_limit_in_flight(make_replica: Any) -> None:
    reps = [make_replica(n) for n in ("a", "b", "c")]
    rng = random.Random(7)
    live: list[tuple[ClusterService, str]] = []
    worst = 0
    for step in range(300):
        svc = rng.choice(reps)
        roll = rng.random()
        if roll < 0.45:
            _admit(svc, f"s{step}")
            if _ctl(svc).holds[f"s{step}"].admitted_at is not None:
                live.append((svc, f"s{step}"))
        elif roll < 0.75 and live:
            owner, rid = live.pop(rng.randrange(len(live)))
            _end(owner, rid)
        else:
            assert await svc.sync_once()
        for owner in reps:   # queued ones granted by a sync or a release count from then on
            for rid, h in _ctl(owner).holds.items():
                if h.admitted_at is not None and (owner, rid) not in live:
                    live.append((owner, rid))
        inflight = sum(_ctl(s).pools["m"].admitted for s in reps if "m" in _ctl(s).pools)
        worst = max(worst, inflight)
        assert inflight <= 6, f"step {step}: {inflight} in flight"
    assert worst == 6    # and the limit was reached: the shares did not starve the pool


async def test_a_keys_max_parallel_holds_across_replicas(make_replica: Any) -> None:
    a, b = make_replica("a"), make_replica("b")
    key = ApiKey(id="key_1", tenant="t", key_hash="0" * 64, hint="h", max_parallel=2)
    for svc in (a, b):
        _ctl(svc).keys.put(key)
    for _ in range(2):
        for svc in (a, b):
            assert await svc.sync_once()
    assert a.shares.grants["key:key_1"] == 1 and b.shares.grants["key:key_1"] == 1
    assert _admit(a, "k1", "key_1")["admitted"]
    refused = _admit(a, "k2", "key_1")
    assert refused["status"] == 429 and "parallel" in refused["message"]
    assert await a.sync_once() and await b.sync_once() and await a.sync_once()   # b gives its idle one back
    assert a.shares.grants["key:key_1"] == 2
    assert _admit(a, "k3", "key_1")["admitted"]
    assert _admit(b, "k4", "key_1")["status"] == 429        # two in flight in total: the key's limit


async def test_the_retry_budget_is_one_budget(make_replica: Any) -> None:
    a, b = make_replica("a"), make_replica("b")
    for svc in (a, b):
        assert await svc.sync_once()
    for svc in (a, b):
        assert await svc.sync_once()       # both know there are two replicas
    scope = _scope("x")

    def retries(svc: ClusterService) -> int:
        n = 0
        while _ctl(svc).retry_allowed(scope, "standard")[0]:
            n += 1
        return n

    # min_retries 10 (the default) and few requests: 10 retries for the whole cluster per window,
    # however the replicas' syncs and retries interleave.
    total = 0
    for _ in range(6):
        for svc in (a, b):
            assert await svc.sync_once()
            total += retries(svc)
            assert total <= 10
    assert total == 10
    snap = _ctl(a).budget.snapshot("m", _ctl(a).clock.monotonic())
    assert snap["cluster_retries_claimed"] == 10


async def test_a_refunded_retry_goes_back_to_the_replicas_claim(make_replica: Any) -> None:
    a = make_replica("a")
    assert await a.sync_once() and await a.sync_once()
    scope = _scope("x")
    ctl = _ctl(a)
    budget = ctl.budget
    assert isinstance(budget, SharedRetryBudget)
    granted = 0
    while ctl.retry_allowed(scope, "standard")[0]:
        granted += 1
    assert granted > 0 and budget.shares.retry_of("m").spent == granted
    # A retry that answered the client (admission/budget.py, refund): one more, and only one.
    assert budget.refund("m", ctl.clock.monotonic())
    assert budget.shares.retry_of("m").spent == granted - 1
    assert ctl.retry_allowed(scope, "standard")[0] and not ctl.retry_allowed(scope, "standard")[0]


async def test_redis_away_each_replica_keeps_its_share_then_rejoins(make_replica: Any,
                                                                    redis_client: tuple[Any, str]) -> None:
    proxy = TcpProxy(*REDIS_URL.removeprefix("redis://").split("/")[0].split(":"))  # type: ignore[arg-type]
    proxy.target = (proxy.target[0], int(proxy.target[1]))
    await proxy.start()
    try:
        a = make_replica("a", url=proxy.url)
        b, c = make_replica("b"), make_replica("c")
        for _ in range(2):
            for svc in (a, b, c):
                assert await svc.sync_once()
        key = ApiKey(id="key_r", tenant="t", key_hash="1" * 64, hint="h", rpm=30)
        _ctl(a).keys.put(key)
        await proxy.cut()
        granted = a.shares.quota("pool:m", 6)
        assert not await a.sync_once()
        # One failed sync: the last grants still hold while their lease lasts (Redis counts them for
        # this replica until then), so this replica's share is not added to what the others hold.
        assert not a.shares.degraded and not a.redis_up and a.errors == 1
        assert a.shares.quota("pool:m", 6) == granted
        a.clock.advance(2.9)                                     # lease 3 s, counted from the last sync sent
        assert not await a.sync_once() and not a.shares.degraded and a.errors == 2
        a.clock.advance(0.1)
        assert not await a.sync_once()
        assert a.shares.degraded and not a.redis_up and a.errors == 3 and a.outages == 1
        assert a.shares.quota("pool:m", 6) == 2                 # 6 slots / 3 replicas last seen
        assert [_admit(a, f"d{i}")["admitted"] for i in range(3)] == [True, True, False]
        # RPM 30 per key becomes 10 here while Redis is away.
        passed = [_admit(a, f"q{i}", "key_r").get("status") != 429 for i in range(20)]
        assert sum(passed) == 10
        await proxy.restore()
        assert await a.sync_once()
        assert not a.shares.degraded and a.redis_up and a.outages == 1
        assert _ctl(a).shared_limiter.divisor == 1
    finally:
        await proxy.close()


async def test_one_failed_sync_keeps_the_grant_so_the_cluster_stays_within_the_limit(
        make_replica: Any, redis_client: tuple[Any, str]) -> None:
    """A sync that fails once (a slow round trip on a loaded machine) must not put this replica's
    fallback share on top of what the others hold under their grants: until the lease lapses the
    last grant is the quota (the others' grants are still counted for them in Redis)."""
    client, prefix = redis_client
    proxy = TcpProxy(*REDIS_URL.removeprefix("redis://").split("/")[0].split(":"))  # type: ignore[arg-type]
    proxy.target = (proxy.target[0], int(proxy.target[1]))
    await proxy.start()
    try:
        a, b, c = make_replica("a"), make_replica("b"), make_replica("c", url=proxy.url)
        for _ in range(2):
            for svc in (a, b, c):
                assert await svc.sync_once()
        assert [_admit(a, f"r{i}")["admitted"] for i in range(4)] == [True, True, False, False]
        assert await a.sync_once()
        for svc in (b, c):
            assert await svc.sync_once()          # each gives back down to its target
        assert await a.sync_once()                # a takes them: its queued requests are admitted
        grants = await _grants(client, prefix)
        assert sum(grants.values()) <= 6 and grants["a"] >= 4 and _ctl(a).pools["m"].admitted == 4
        await proxy.cut()
        assert not await c.sync_once()
        # c's fallback share would be 6 / 3 = 2, on top of the grants a and b still hold
        admitted = sum(_admit(c, f"c{i}")["admitted"] for i in range(3))
        assert admitted == grants["c"] < 2
        assert grants["a"] + grants["b"] + admitted <= 6
    finally:
        await proxy.close()


async def test_different_config_files_are_reported(make_replica: Any) -> None:
    a = make_replica("a", config_hash="aaaa")
    b = make_replica("b", config_hash="bbbb")
    assert await a.sync_once() and await b.sync_once() and await a.sync_once()
    assert a.conflict == {"aaaa": ["a"], "bbbb": ["b"]}
    assert a.status()["config"]["conflict"] == a.conflict
    metrics = {m.name: m for m in __import__("inferlb.cluster.service", fromlist=["x"]).ClusterCollector(a)
               .collect()}
    assert metrics["inferlb_cluster_config_conflict"].samples[0].value == 1.0


def test_one_replica_alone_runs_the_plain_controller() -> None:
    from inferlb.admission.controller import AdmissionController
    from inferlb.config.settings import Settings
    from inferlb.engine.scope import build_runtime
    from inferlb.types import ManualClock

    cfg = small_fleet()
    s = Settings(fleet=cfg)
    assert not s.cluster_on()
    rt = build_runtime(s, cfg, clock=ManualClock(), end=lambda ctl: ctl.finished)
    assert type(rt.admission) is AdmissionController and rt.fleet.on_transition is None
    assert Settings(fleet=cfg, admission={"redis_url": "redis://x:1/0"}).cluster_on()   # type: ignore[arg-type]
