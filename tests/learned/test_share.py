"""One latency predictor for a cluster (learned/share.py), on real Redis: followers send their
answers to the trainer (the elected replica), which trains and publishes snapshots that the others
install; a new trainer starts from the newest snapshot; a replica that starts takes it; a snapshot
that does not fit is ignored; with Redis away a follower learns alone. The channel's messages are
handed to :meth:`PredictorShare.notify` by hand here (the cluster listener does it in a gateway:
tests/server/test_workers_shared.py runs the whole path between processes)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from inferlb.learned.share import MAX_BATCHES, PredictorShare
from inferlb.routing.features import features
from inferlb.routing.lifecycle import LifecycleParams, PredictorLifecycle
from inferlb.routing.predictor import Observed
from inferlb.types import ManualClock
from tests.admission.conftest import REDIS_URL, redis_client
from tests.learned.test_persistence import _data, _probe

__all__ = ["redis_client"]

PARAMS = LifecycleParams(min_samples=20)


class Replica:
    def __init__(self, name: str, redis: Any, prefix: str, leads: list[str], clock: ManualClock,
                 params: LifecycleParams = PARAMS) -> None:
        self.lc = PredictorLifecycle(params, clock=clock.time)
        self.share = PredictorShare(self.lc, redis=redis, key=lambda *p: prefix + "cluster:" + ":".join(p),
                                    channel=prefix + "cluster:events", me=name, leader=lambda: leads[0] == name,
                                    clock=clock, publish_every_s=1.0)

    def answer(self, n: int, seed: int) -> None:
        for req, node, obs in _data(n, seed=seed):
            self.lc.observe(features(req, node), obs)


@pytest.fixture
async def cluster(redis_client: tuple[Any, str]) -> AsyncIterator[Callable[..., Replica]]:
    """``make(name)``: a replica on the test's Redis prefix; ``leads[0]`` names the trainer."""
    import redis.asyncio as aioredis

    _, prefix = redis_client
    clients: list[Any] = []

    def make(name: str, leads: list[str], clock: ManualClock, **kw: Any) -> Replica:
        c = aioredis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        clients.append(c)
        return Replica(name, c, prefix, leads, clock, **kw)

    yield make
    for c in clients:
        await c.aclose()


def _same_predictions(a: PredictorLifecycle, b: PredictorLifecycle) -> bool:
    assert a.model is not None and b.model is not None
    return all(np.array_equal(a.model.predict_nodes(req, nodes), b.model.predict_nodes(req, nodes))
               for req, nodes in _probe())


async def _deliver(msgs: list[dict[str, Any]], *to: Replica) -> None:
    for r in to:
        for m in msgs:
            r.share.notify(m)


async def test_followers_answers_train_the_one_predictor_that_every_replica_runs(
        cluster: Callable[..., Replica]) -> None:
    clock, leads = ManualClock(), ["a"]
    a, b = cluster("a", leads, clock), cluster("b", leads, clock)
    await a.share.start()
    await b.share.start()
    b.lc.take_events()                    # its own start ("configured")
    b.answer(60, seed=1)                  # b served these; it does not learn them itself
    assert await b.share.turn() == 0
    assert b.share.sent == 60 and not b.lc.pending and b.lc.learned == 0
    a.answer(40, seed=2)
    a.share.notify({"t": "learned-obs", "from": "b"})
    assert await a.share.turn() == 100     # its own 40 and b's 60
    assert a.lc.learned == 100 and a.share.received == 60 and a.share.publishes == 1
    assert a.lc.state == "active"
    b.share.notify({"t": "learned", "from": "a", "seq": a.share.installed_seq})
    await b.share.turn()
    assert b.share.installs == 1 and b.lc.version == a.lc.version and b.lc.learned == 100
    assert b.lc.state == "active" and b.lc.take_events() == []   # the trainer records the events
    assert _same_predictions(a.lc, b.lc)
    # Nothing new learned: no snapshot, however often the trainer turns; idle followers send nothing.
    clock.advance(5.0)
    await a.share.turn()
    await b.share.turn()
    assert a.share.publishes == 1 and b.share.sent == 60
    # More answers: a snapshot at most every publish_every_s.
    a.answer(10, seed=3)
    await a.share.turn()
    assert a.share.publishes == 2
    a.answer(10, seed=4)
    clock.advance(0.5)
    await a.share.turn()
    assert a.share.publishes == 2
    clock.advance(0.6)
    await a.share.turn()
    assert a.share.publishes == 3 and a.lc.learned == 120


async def test_a_new_trainer_starts_from_the_newest_snapshot_and_a_new_replica_takes_it(
        cluster: Callable[..., Replica]) -> None:
    clock, leads = ManualClock(), ["a"]
    a, b = cluster("a", leads, clock), cluster("b", leads, clock)
    a.answer(80, seed=1)
    await a.share.turn()
    assert a.share.publishes == 1
    a.answer(30, seed=2)                  # learned after its last snapshot: lost with it
    clock.advance(0.1)
    await a.share.turn()
    assert a.lc.learned == 110 and a.share.publishes == 1
    leads[0] = "b"                        # a died; the election made b the leader
    b.answer(5, seed=3)
    await b.share.turn()                  # installs the newest snapshot (80), then learns its own 5
    assert b.share.installs == 1 and b.lc.learned == 85
    c = cluster("c", leads, clock)
    await c.share.start()
    assert c.share.installs == 1 and c.lc.learned == 85 and _same_predictions(b.lc, c.lc)


async def test_a_snapshot_that_does_not_fit_is_ignored(cluster: Callable[..., Replica]) -> None:
    clock, leads = ManualClock(), ["a"]
    a = cluster("a", leads, clock)
    other = cluster("b", leads, clock, params=LifecycleParams(min_samples=20, params={"ridge": 5.0}))
    a.answer(50, seed=1)
    await a.share.turn()
    await other.share.start()
    assert other.share.installs == 0 and other.lc.learned == 0
    other.share.notify({"t": "learned", "from": "a", "seq": a.share.installed_seq})
    await other.share.turn()
    assert other.share.installs == 0


async def test_the_followers_queue_is_bounded_and_damaged_batches_are_skipped(
        cluster: Callable[..., Replica], redis_client: tuple[Any, str]) -> None:
    client, prefix = redis_client
    clock, leads = ManualClock(), ["nobody"]
    b = cluster("b", leads, clock)
    for i in range(MAX_BATCHES + 10):
        b.answer(1, seed=i)
        await b.share.turn()
    key = prefix + "cluster:learned:obs"
    assert await client.llen(key) == MAX_BATCHES
    await client.rpush(key, b"not json", json.dumps({"obs": [[[1.0], "x", None], "junk"]}))
    leads[0] = "a"
    a = cluster("a", leads, clock)
    await a.share.turn()
    assert a.share.received == MAX_BATCHES and a.lc.learned == MAX_BATCHES


async def test_with_redis_away_a_follower_learns_its_own_answers() -> None:
    import redis.asyncio as aioredis

    from tests.support import free_port

    clock = ManualClock()
    lc = PredictorLifecycle(PARAMS, clock=clock.time)
    client = aioredis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5)
    share = PredictorShare(lc, redis=client, key=lambda *p: "x:" + ":".join(p), channel="x:events", me="b",
                           leader=lambda: False, clock=clock)
    try:
        for req, node, obs in _data(30):
            lc.observe(features(req, node), obs)
        assert await share.turn() == 30
        assert lc.learned == 30 and share.errors >= 1 and share.sent == 0
        lc.observe(features(*_data(1)[0][:2]), Observed(0.1, 0.01))
        assert await share.turn() == 1
    finally:
        await client.aclose()
