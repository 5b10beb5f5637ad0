"""The output-length predictor shared by a cluster (learned/share_length.py over learned/share.py),
on an in-process Redis (fakeredis, with Lua): a follower's answers wait in a bounded outbox and reach
the trainer, whose snapshot the follower installs (the same estimates and calibration); a new
trainer starts from the newest snapshot; a replica that starts takes it; a snapshot or batch made
under another window is ignored; with Redis away a follower learns alone. Channel messages are
handed to ``notify`` by hand (tests/server/test_workers_shared.py runs the whole path)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest

from inferlb.learned.share import MAX_BATCHES, SharesLoop, StateShare
from inferlb.learned.share_length import LengthState
from inferlb.routing.length import LengthPredictor
from inferlb.types import ManualClock

PREFIX = "t:"


class Replica:
    def __init__(self, name: str, server: fakeredis.FakeServer, leads: list[str], clock: ManualClock,
                 **params: Any) -> None:
        self.redis = fakeredis.aioredis.FakeRedis(server=server)
        self.lp = LengthPredictor(min_samples=5, **params)
        self.part = LengthState(self.lp)
        self.share = StateShare(self.part, redis=self.redis, key=lambda *p: PREFIX + "cluster:" + ":".join(p),
                                channel=PREFIX + "cluster:events", me=name, leader=lambda: leads[0] == name,
                                clock=clock)

    def answer(self, n: int, *, tokens: int = 100, tenant: str | None = "t1") -> None:
        """``n`` finished requests, as the gateway reports them (an estimate made for each)."""
        for i in range(n):
            est = self.lp.estimate("m", prompt_tokens=50, declared=None, default=256, tenant=tenant)
            self.lp.observe("m", prompt_tokens=50, tokens=tokens + i % 7, tenant=tenant, estimate=est)


@pytest.fixture
def cluster() -> Callable[..., Replica]:
    server = fakeredis.FakeServer()
    return lambda name, leads, clock, **kw: Replica(name, server, leads, clock, **kw)


def _estimates(lp: LengthPredictor) -> list[Any]:
    return [lp.estimate("m", prompt_tokens=p, declared=d, default=256, tenant=t)
            for p in (50, 2000) for d in (None, 64) for t in ("t1", "t2", None)]


async def test_a_followers_answers_reach_the_trainer_and_the_follower_installs_its_snapshot(
        cluster: Callable[..., Replica]) -> None:
    clock, leads = ManualClock(), ["a"]
    a, b = cluster("a", leads, clock), cluster("b", leads, clock)
    await a.share.start()
    await b.share.start()
    b.answer(30)                           # on the request path: one append each, nothing learned
    assert len(b.part.outbox) == 30 and b.lp.learned == 0
    assert await b.share.turn() == 0
    assert b.share.sent == 30 and not b.part.outbox and b.lp.learned == 0
    a.answer(12, tokens=300, tenant="t2")
    a.share.notify({"t": "length-obs", "from": "b"})
    assert await a.share.turn() == 12      # its own; b's 30 were absorbed from the list
    assert a.share.received == 30 and a.lp.learned == 42 and a.share.publishes == 1
    assert a.lp.calibration.n == 42        # every replica's estimates are calibrated on the trainer
    b.share.notify({"t": "length", "from": "a", "seq": a.share.installed_seq})
    await b.share.turn()
    assert b.share.installs == 1 and b.lp.learned == 42
    assert _estimates(b.lp) == _estimates(a.lp)
    assert b.lp.summary() == a.lp.summary()
    assert b.lp.estimate("m", prompt_tokens=50, declared=None, default=256, tenant="t1").level == "band"
    # Nothing new: no snapshot however often the trainer turns; an idle follower sends nothing.
    clock.advance(5.0)
    await a.share.turn()
    await b.share.turn()
    assert a.share.publishes == 1 and b.share.sent == 30
    # More answers: a snapshot at most every publish_every_s.
    a.answer(3)
    await a.share.turn()
    assert a.share.publishes == 2
    a.answer(3)
    clock.advance(0.5)
    await a.share.turn()
    assert a.share.publishes == 2 and a.lp.learned == 48
    clock.advance(0.6)
    await a.share.turn()
    assert a.share.publishes == 3


async def test_a_new_trainer_starts_from_the_newest_snapshot_and_followers_keep_the_last_one(
        cluster: Callable[..., Replica]) -> None:
    clock, leads = ManualClock(), ["a"]
    a, b = cluster("a", leads, clock), cluster("b", leads, clock)
    a.answer(40)
    await a.share.turn()
    assert a.share.publishes == 1
    a.answer(10)                          # learned after its last snapshot: lost with it
    clock.advance(0.1)
    await a.share.turn()
    assert a.lp.learned == 50 and a.share.publishes == 1
    b.share.notify({"t": "length", "from": "a", "seq": a.share.installed_seq})
    await b.share.turn()
    before = _estimates(b.lp)
    leads[0] = "nobody"                   # the trainer is gone and no one leads yet
    b.answer(20)
    for _ in range(3):
        await b.share.turn()              # sends, learns nothing, keeps answering with what it installed
    assert b.lp.learned == 40 and _estimates(b.lp) == before and b.share.sent == 20
    leads[0] = "b"                        # the election made b the trainer
    await b.share.turn()                  # installs the newest snapshot (40), then absorbs its own 20
    assert b.lp.learned == 60 and b.share.received == 20
    c = cluster("c", leads, clock)
    await c.share.start()                 # a replica that starts takes the stored snapshot
    assert c.share.installs == 1 and c.lp.learned == 60 and _estimates(c.lp) == _estimates(b.lp)


async def test_other_settings_damaged_batches_and_bounds(cluster: Callable[..., Replica]) -> None:
    clock, leads = ManualClock(), ["nobody"]
    b = cluster("b", leads, clock)
    for _ in range(MAX_BATCHES + 10):     # one batch a turn: the list keeps the newest MAX_BATCHES
        b.answer(1)
        await b.share.turn()
    key = PREFIX + "cluster:length:obs"
    assert await b.redis.llen(key) == MAX_BATCHES
    fit = b.part.fit()
    await b.redis.rpush(key, b"not json", json.dumps({"obs": [["m", "chat", None, 1, 2, None]], "fit": "window=9"}),
                        json.dumps({"fit": fit, "obs": [["m", "chat", None, -1, 2, None], "junk", [1, 2],
                                                        ["m", "chat", None, 1, 2, ["x"]]]}))
    leads[0] = "a"
    a = cluster("a", leads, clock)
    await a.share.turn()
    # the other window's batch is skipped; of the last, the one item with an unreadable estimate counts
    assert a.share.received == MAX_BATCHES + 1 and a.lp.learned == MAX_BATCHES + 1
    other = cluster("o", leads, clock, window=500)
    await other.share.start()
    assert other.share.installs == 0 and other.lp.learned == 0   # a snapshot of another window: ignored
    small = LengthState(LengthPredictor(), max_outbox=5)
    for i in range(12):
        small.lp.observe("m", prompt_tokens=1, tokens=i)
    assert [x[4] for x in small.outbox] == [7, 8, 9, 10, 11]   # the outbox is bounded: the oldest dropped


async def test_with_redis_away_a_follower_learns_its_own_answers_and_detach_restores_learning() -> None:
    server = fakeredis.FakeServer()
    clock = ManualClock()
    b = Replica("b", server, ["a"], clock)
    server.connected = False
    b.answer(25)
    assert await b.share.turn() == 25
    assert b.lp.learned == 25 and b.share.errors >= 1 and b.share.sent == 0 and not b.part.outbox
    server.connected = True
    b.answer(4)
    assert await b.share.turn() == 0 and b.share.sent == 4
    b.answer(3)
    b.part.detach()                       # the app's shutdown: what waited is learned, then directly
    assert b.lp.outbox is None and b.lp.learned == 28
    b.answer(2)
    assert b.lp.learned == 30


async def test_the_loop_sends_what_waits_when_it_closes(cluster: Callable[..., Replica]) -> None:
    clock, leads = ManualClock(), ["a"]
    b = cluster("b", leads, clock)
    loop = SharesLoop([b.share], interval_s=3600.0)   # no turn of its own within the test
    await loop.start()
    b.answer(7)
    await loop.close()                                # a drain: the outbox goes to the trainer
    assert b.share.sent == 7 and not b.part.outbox
    await loop.close()                                # closing twice does nothing more
    assert b.share.sent == 7
