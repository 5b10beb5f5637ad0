"""The reward bandit over routing profiles (routing/reward.py) and its place in the learned profile."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from inferlb.errors import ConfigError
from inferlb.routing.guarded import GuardedRouter
from inferlb.routing.profiles import build_router
from inferlb.routing.reward import RewardBandit, RewardParams, observe_reward
from inferlb.routing.types import NodeView, RouteRequest


def _bandit(**kw: Any) -> RewardBandit:
    return RewardBandit(RewardParams(enabled=True, arms=["learned", "token-aware"], min_pulls=5, **kw))


def _play(b: RewardBandit, means: dict[str, float], rounds: int, rng: random.Random) -> list[str]:
    picks = []
    for _ in range(rounds):
        arm = b.choose(rng)
        picks.append(arm)
        b.observe(arm, max(0.0, rng.gauss(means[arm], 0.5)))
    return picks


def test_thompson_sampling_settles_on_the_cheaper_arm_and_explores_less_as_it_learns() -> None:
    early = late = 0.0
    for seed in range(8):
        rng = random.Random(seed)
        b = _bandit(discount=1.0)        # no forgetting: exploration shrinks towards none
        picks = _play(b, {"learned": 1.0, "token-aware": 1.2}, 3000, rng)
        early += picks[:300].count("token-aware") / 300 / 8
        late += picks[-500:].count("token-aware") / 500 / 8
    assert late < 0.02 and late < early / 4, (early, late)
    # with the default forgetting it still settles, keeping a little exploration to follow change
    b = _bandit()
    picks = _play(b, {"learned": 1.0, "token-aware": 1.2}, 3000, random.Random(1))
    assert picks[-500:].count("token-aware") / 500 < 0.1
    st = b.status()
    assert st["arms"][0]["mean_cost"] == pytest.approx(1.0, abs=0.1)
    assert st["arms"][1]["sd_of_mean"] > st["arms"][0]["sd_of_mean"]   # the arm tried less is less certain


def test_every_arm_is_tried_min_pulls_times_first() -> None:
    b = _bandit()
    first = [b.choose(random.Random(0)) for _ in range(10)]
    assert first.count("learned") == first.count("token-aware") == 5


def test_discounting_follows_a_fleet_whose_best_profile_changes() -> None:
    rng = random.Random(5)
    b = _bandit(discount=0.99)
    _play(b, {"learned": 1.0, "token-aware": 2.0}, 1000, rng)
    picks = _play(b, {"learned": 2.0, "token-aware": 1.0}, 1500, rng)
    assert picks[-300:].count("token-aware") / 300 > 0.9
    # without forgetting, the old evidence holds the bandit on the arm that is now worse for longer
    rng = random.Random(5)
    stuck = _bandit(discount=1.0)
    _play(stuck, {"learned": 1.0, "token-aware": 2.0}, 1000, rng)
    slow = _play(stuck, {"learned": 2.0, "token-aware": 1.0}, 1500, rng)
    assert slow[:300].count("token-aware") < picks[:300].count("token-aware")


def test_cost_is_the_objective_the_operator_chose() -> None:
    e2e = _bandit()
    assert e2e.cost(ok=True, stream=True, ttft_s=0.2, e2e_s=3.0, tokens=100) == 3.0
    assert e2e.cost(ok=False, stream=True, ttft_s=None, e2e_s=None, tokens=0) == 60.0
    slo = _bandit(objective="slo", slo_ttft_s=1.0, slo_e2e_s=10.0)
    assert slo.cost(ok=True, stream=True, ttft_s=0.5, e2e_s=5.0, tokens=10) == 0.0
    assert slo.cost(ok=True, stream=True, ttft_s=1.5, e2e_s=5.0, tokens=10) == 1.0    # first token late
    assert slo.cost(ok=True, stream=False, ttft_s=None, e2e_s=5.0, tokens=10) == 0.0  # no TTFT for a non-stream
    assert slo.cost(ok=True, stream=False, ttft_s=None, e2e_s=11.0, tokens=10) == 1.0
    assert slo.cost(ok=False, stream=False, ttft_s=None, e2e_s=None, tokens=0) == 1.0
    per = _bandit(objective="e2e-per-token")
    assert per.cost(ok=True, stream=False, ttft_s=None, e2e_s=2.0, tokens=100) == pytest.approx(0.02)
    assert not e2e.observe("no-such-arm", 1.0) and not e2e.observe("learned", float("nan"))


def test_reward_params_are_checked_where_the_fleet_file_sets_them() -> None:
    with pytest.raises(ConfigError) as e:
        build_router("learned", reward={"enabled": True, "arms": ["learned", "learned"]})
    assert e.value.path == "routing.reward"
    with pytest.raises(ConfigError):
        build_router("learned", reward={"enabled": True, "arms": ["token-aware", "learned"]})
    with pytest.raises(ConfigError):
        build_router("learned", reward={"enabled": True, "objective": "joy"})
    with pytest.raises(ConfigError) as e:
        build_router("learned", reward={"enabled": True, "arms": ["learned", "no-such-profile"]})
    assert "no-such-profile" in str(e.value)
    with pytest.raises(ConfigError) as e:
        build_router("learned", reward={"enabled": True, "arms": ["learned", "learned-2"]})
    assert build_router("learned").reward is None          # type: ignore[attr-defined]   # off by default


def _node(name: str, inflight: int) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=100_000, max_concurrency=64,
                    inflight_requests=inflight, inflight_tokens=inflight * 500, tokens_per_s=50.0, ttft_s=0.1,
                    healthy=True, unhealthy_reason=None)


def test_the_learned_profile_routes_by_the_arm_it_drew_and_records_it() -> None:
    r = build_router("learned", seed=2, predictor={"min_samples": 0},
                     reward={"enabled": True, "arms": ["learned", "token-aware"], "min_pulls": 1})
    assert isinstance(r, GuardedRouter) and r.reward is not None
    nodes = [_node("a", 3), _node("b", 9)]
    arms: dict[str, int] = {}
    for _ in range(40):
        d = r.decide(RouteRequest("m", 400, 100, stream=True), nodes)
        info = d.learned
        assert info is not None and info.arm in ("learned", "token-aware")
        arms[info.arm] = arms.get(info.arm, 0) + 1
        j = json.loads(json.dumps(d.to_json()))["learned"]
        assert j["arm"] == info.arm and "fallback" not in j
        if info.arm == "token-aware":
            # not a fallback: the guard's count stays, the why says which arm, and the pick's prediction
            # is kept so the answer still trains the latency model
            assert info.propensity is None and info.pick_pred is not None and "token-aware picked" in j["why"]
        assert observe_reward(r, d, ok=True, stream=True, ttft_s=0.1, e2e_s=1.0 if info.arm == "learned" else 3.0,
                              tokens=50) == info.arm
    assert set(arms) == {"learned", "token-aware"}
    assert r.lifecycle.fallbacks_total == 0
    assert r.reward.status()["arms"][0]["mean_cost"] < r.reward.status()["arms"][1]["mean_cost"]
    # a router without a bandit, or a decision no arm made, is not observed
    assert observe_reward(build_router("token-aware"), d, ok=True, stream=True, ttft_s=0.1, e2e_s=1.0,
                          tokens=5) is None


def test_state_round_trips_and_other_params_or_a_damaged_state_change_nothing() -> None:
    from collections import deque

    from inferlb.routing.predictor_state import IncompatibleState

    a, rng = _bandit(), random.Random(2)
    for _ in range(60):
        arm = a.choose(rng)
        a.observe(arm, 1.0 if arm == "learned" else 2.0 + rng.random())
    b = _bandit()
    b.load(json.loads(json.dumps(a.state())))
    assert [b.posterior(i) for i in range(2)] == [a.posterior(i) for i in range(2)]
    assert b.learned() == 60 and [x.pulls for x in b.arms] == [0, 0]   # pulls stay this process's
    for bad in (_bandit(objective="slo").state(), {**a.state(), "arms": a.state()["arms"][:1]},
                {**a.state(), "arms": [["learned", float("nan"), 0, 0, 1, 0, 0, 0], a.state()["arms"][1]]},
                {**a.state(), "arms": [["learned", 1.0, 0, 0, 1], a.state()["arms"][1]]}):   # the old rows
        with pytest.raises((IncompatibleState, ValueError, TypeError, KeyError)):
            b.load(bad)
        assert b.learned() == 60
    b.outbox = deque(maxlen=3)
    assert b.observe("learned", 5.0) and not b.observe("nope", 1.0) and not b.observe("learned", float("inf"))
    assert list(b.outbox) == [("learned", 5.0, 0.0)] and b.learned() == 60   # queued, not learned
    assert not b.observe("learned", 1.0, float("nan")) and len(b.outbox) == 1


def _play_lengths(b: RewardBandit, rounds: int, rng: random.Random) -> list[str]:
    """Answers whose length (lognormal, median 150 tokens) makes most of the cost, 20 ms a token;
    ``learned`` is 0.25 s cheaper per request, whatever the length. The arm is chosen first, the
    length drawn after, as in a gateway."""
    picks = []
    for _ in range(rounds):
        arm = b.choose(rng)
        tokens = int(rng.lognormvariate(5.0, 0.9))
        cost = 0.02 * tokens + rng.gauss(1.0 if arm == "learned" else 1.25, 0.1)
        picks.append(arm)
        b.observe(arm, cost, float(tokens))
    return picks


def test_the_length_adjustment_finds_the_cheaper_arm_sooner() -> None:
    raw = adj = 0
    for seed in range(6):
        raw += _play_lengths(_bandit(adjust="none", discount=1.0), 600, random.Random(seed)).count("token-aware")
        adj += _play_lengths(_bandit(discount=1.0), 600, random.Random(seed)).count("token-aware")
    # the weaker arm is tried far less when the spread of lengths is regressed out
    assert adj < raw / 3, (adj, raw)


def test_the_length_adjustment_keeps_the_arms_difference_and_removes_the_spread() -> None:
    rng = random.Random(3)
    a, b = _bandit(adjust="none", discount=1.0), _bandit(discount=1.0)
    for i in range(800):          # both arms observed alike, lengths drawn apart from the arm
        arm = "learned" if i % 2 else "token-aware"
        tokens = int(rng.lognormvariate(5.0, 0.9))
        cost = 0.02 * tokens + rng.gauss(1.0 if arm == "learned" else 1.25, 0.1)
        a.learn(arm, cost, float(tokens))
        b.learn(arm, cost, float(tokens))
    (ml, sl), (mt, _) = b.posterior(0), b.posterior(1)
    assert abs((mt - ml) - 0.25) < 0.03, (ml, mt)            # the arms' difference, unbiased
    assert sl < a.posterior(0)[1] / 5, (sl, a.posterior(0))  # the lengths' spread is gone
    assert b.status()["beta"] == pytest.approx(0.02, rel=0.05)


def test_without_the_covariate_varying_the_adjustment_is_the_raw_mean() -> None:
    a, b = _bandit(adjust="none"), _bandit()
    for i in range(50):
        for x in (a, b):
            x.learn("learned" if i % 3 else "token-aware", 1.0 + (i % 7) * 0.1, 42.0)
    assert [v for i in range(2) for v in b.posterior(i)] == pytest.approx([v for i in range(2) for v in a.posterior(i)])
    assert b.fit() != a.fit()       # another adjustment is another fit: its states do not mix

