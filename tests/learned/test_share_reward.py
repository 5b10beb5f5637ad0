"""The reward bandit shared by a cluster (learned/share_reward.py over learned/share.py), on an
in-process Redis (fakeredis, with Lua): a follower's outcomes wait in a bounded outbox and reach the
trainer, which replays them; the follower installs its snapshot (the same posteriors, its own
pulls); a new trainer starts from the newest snapshot; a bandit replaced by a reload gets the
outbox; other params are ignored; with Redis away a follower learns alone. Channel messages are
handed to ``notify`` by hand (tests/server/test_workers_shared.py runs the whole path)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest

from inferlb.learned.share import MAX_BATCHES, StateShare
from inferlb.learned.share_reward import RewardState
from inferlb.routing.reward import RewardBandit, RewardParams
from inferlb.types import ManualClock

PREFIX = "t:"
ARMS = ["learned", "token-aware", "power-of-two"]


class Replica:
    def __init__(self, name: str, server: fakeredis.FakeServer, leads: list[str], clock: ManualClock,
                 **params: Any) -> None:
        self.redis = fakeredis.aioredis.FakeRedis(server=server)
        self.bandit: RewardBandit | None = RewardBandit(RewardParams(enabled=True, arms=ARMS, **params))
        self.part = RewardState(lambda: self.bandit)
        self.share = StateShare(self.part, redis=self.redis, key=lambda *p: PREFIX + "cluster:" + ":".join(p),
                                channel=PREFIX + "cluster:events", me=name, leader=lambda: leads[0] == name,
                                clock=clock)

    def serve(self, n: int, seed: int) -> list[tuple[str, float]]:
        """``n`` requests: an arm chosen and its cost observed, as the gateway does; what was observed."""
        assert self.bandit is not None
        rng, out = random.Random(seed), []
        for _ in range(n):
            arm = self.bandit.choose(rng)
            cost = {"learned": 1.0, "token-aware": 2.0, "power-of-two": 3.0}[arm] + rng.random()
            assert self.bandit.observe(arm, cost)
            out.append((arm, cost))
        return out


@pytest.fixture
def cluster() -> Callable[..., Replica]:
    server = fakeredis.FakeServer()
    return lambda name, leads, clock, **kw: Replica(name, server, leads, clock, **kw)


def _stats(b: RewardBandit | None) -> list[tuple[float, ...]]:
    assert b is not None
    return [(a.n, a.s, a.ss, a.observed) for a in b.arms]


async def test_a_followers_outcomes_are_replayed_by_the_trainer_and_the_follower_installs_its_snapshot(
        cluster: Callable[..., Replica]) -> None:
    clock, leads = ManualClock(), ["a"]
    a, b = cluster("a", leads, clock), cluster("b", leads, clock)
    await a.share.start()
    await b.share.start()
    b_seen = b.serve(80, seed=1)           # on the request path: one append each, nothing learned
    assert b.bandit is not None and b.bandit.learned() == 0 and len(b.part.outbox) == 80
    assert await b.share.turn() == 0 and b.share.sent == 80 and not b.part.outbox
    a_seen = a.serve(20, seed=2)
    a.share.notify({"t": "reward-obs", "from": "b"})
    assert await a.share.turn() == 20      # its own; b's 80 absorbed first, from the list
    assert a.share.received == 80 and a.bandit is not None and a.bandit.learned() == 100
    # the trainer's bandit is the one a single process would have after these outcomes in this order
    alone = RewardBandit(RewardParams(enabled=True, arms=ARMS))
    for arm, cost in b_seen + a_seen:
        alone.learn(arm, cost)
    assert _stats(a.bandit) == _stats(alone)
    b.share.notify({"t": "reward", "from": "a", "seq": a.share.installed_seq})
    await b.share.turn()
    assert b.share.installs == 1 and _stats(b.bandit) == _stats(a.bandit)
    assert [b.bandit.posterior(i) for i in range(3)] == [a.bandit.posterior(i) for i in range(3)]
    assert [x.pulls for x in b.bandit.arms] != [x.pulls for x in a.bandit.arms]   # pulls stay its own
    assert sum(x.pulls for x in b.bandit.arms) == 80
    # Nothing new: no snapshot however often the trainer turns.
    clock.advance(5.0)
    await a.share.turn()
    await b.share.turn()
    assert a.share.publishes == 1 and b.share.sent == 80


async def test_a_new_trainer_takes_the_newest_snapshot_and_a_reloaded_bandit_gets_the_outbox(
        cluster: Callable[..., Replica]) -> None:
    clock, leads = ManualClock(), ["a"]
    a, b = cluster("a", leads, clock), cluster("b", leads, clock)
    a.serve(50, seed=1)
    await a.share.turn()
    assert a.bandit is not None
    snap = a.bandit.state()
    a.serve(5, seed=2)                    # after its last snapshot: lost with it
    clock.advance(0.1)
    await a.share.turn()
    assert a.share.publishes == 1
    leads[0] = "nobody"                   # the trainer is gone: b keeps what it runs and sends
    b_seen = b.serve(10, seed=3)
    await b.share.turn()
    assert b.bandit is not None and b.bandit.learned() == 0 and b.share.sent == 10
    leads[0] = "b"
    await b.share.turn()                  # installs the newest snapshot, then replays the list (its 10)
    assert b.bandit.learned() == 60 and b.share.installs == 1
    expected = RewardBandit(RewardParams(enabled=True, arms=ARMS))
    expected.load(snap)
    for arm, cost in b_seen:
        expected.learn(arm, cost)
    assert _stats(b.bandit) == _stats(expected)
    # A reload that replaced the bandit (same params): the new one gets the outbox at the next turn.
    b.bandit = RewardBandit(RewardParams(enabled=True, arms=ARMS))
    b.part.bandit()
    b.serve(3, seed=4)
    assert len(b.part.outbox) == 3 and b.bandit.learned() == 0
    assert await b.share.turn() == 3
    # No bandit in force (a reload turned it off): the turn does nothing.
    b.bandit = None
    assert await b.share.turn() == 0


async def test_other_params_damaged_batches_and_bounds(cluster: Callable[..., Replica]) -> None:
    clock, leads = ManualClock(), ["nobody"]
    b = cluster("b", leads, clock)
    for i in range(MAX_BATCHES + 10):
        b.serve(1, seed=i)
        await b.share.turn()
    key = PREFIX + "cluster:reward:obs"
    assert await b.redis.llen(key) == MAX_BATCHES
    fit = b.part.fit()
    await b.redis.rpush(key, b"not json", json.dumps({"obs": [["learned", 1.0]], "fit": "other"}),
                        json.dumps({"fit": fit, "obs": [["nope", 1.0, 1.0], ["learned", "x", 1.0],
                                                        ["learned", None, 1.0], ["learned", 1.0, "x"],
                                                        ["learned", 1.0], "junk", ["learned", 2.5, 3.0]]}))
    leads[0] = "a"
    a = cluster("a", leads, clock)
    await a.share.turn()
    assert a.share.received == MAX_BATCHES + 1
    assert a.bandit is not None and a.bandit.learned() == MAX_BATCHES + 1
    other = cluster("o", leads, clock, objective="slo")
    await other.share.start()              # a snapshot under another objective: ignored
    assert other.share.installs == 0 and other.bandit is not None and other.bandit.learned() == 0
    small = RewardBandit(RewardParams(enabled=True, arms=ARMS))
    part = RewardState(lambda: small, max_outbox=4)
    for i in range(9):
        small.observe("learned", float(i))
    assert [c for _, c, _ in part.outbox] == [5.0, 6.0, 7.0, 8.0]   # bounded: the oldest dropped


async def test_with_redis_away_a_follower_learns_its_own_outcomes() -> None:
    server = fakeredis.FakeServer()
    clock = ManualClock()
    b = Replica("b", server, ["a"], clock)
    server.connected = False
    b.serve(30, seed=1)
    assert await b.share.turn() == 30
    assert b.bandit is not None and b.bandit.learned() == 30 and b.share.errors >= 1 and b.share.sent == 0
    server.connected = True
    b.serve(2, seed=2)
    assert await b.share.turn() == 0 and b.share.sent == 2
    b.serve(1, seed=3)
    b.part.detach()
    assert b.bandit.outbox is None and b.bandit.learned() == 31
