"""Off-policy evaluation against policies whose true value is computable."""

from __future__ import annotations

import json
import math
import random

import pytest

from inferlb.engine.routing import NodeView, RouteRequest, build_router
from inferlb.engine.routing.explain import context_of
from inferlb.engine.routing.learned import SoftmaxBandit, SoftmaxBanditParams
from inferlb.engine.routing.ope import Round, estimate
from inferlb.engine.routing.ope_replay import LoggedDecision, evaluate, target_probabilities


def _synthetic(n: int, seed: int) -> tuple[list[Round], float]:
    """K arms; arm a's mean cost in context x is known; logging: ε-softmax bandit over a noisy
    score; target: greedy on the true cost. True value = mean over contexts of Σ π · cost."""
    rng = random.Random(seed)
    logging = SoftmaxBandit(SoftmaxBanditParams(epsilon=0.3, temperature=0.2))
    nodes = [NodeView(name=f"a{k}", models=frozenset({"m"}), capacity_tokens=1, max_concurrency=1) for k in range(5)]
    rounds = []
    true_total = 0.0
    for _ in range(n):
        x = rng.random()
        mean = [1.0 + k * 0.3 + (2.0 * x if k % 2 else -0.5 * x) for k in range(5)]
        noisy_score = [(nodes[k], 1.0 / (1.0 + mean[k] + rng.gauss(0, 0.3))) for k in range(5)]
        mu = logging.probabilities(None, noisy_score)
        a = rng.choices(range(5), weights=mu)[0]
        cost = mean[a] + rng.gauss(0, 0.5)
        best = min(range(5), key=lambda k: mean[k])
        pi = [1.0 if k == best else 0.0 for k in range(5)]
        true_total += mean[best]
        q = [m + 0.2 for m in mean]   # a biased reward model
        rounds.append(Round(cost, mu[a], pi[a], q[a], sum(p * qq for p, qq in zip(pi, q, strict=True))))
    return rounds, true_total / n


@pytest.mark.parametrize("seed", [1, 2])
def test_estimators_land_within_five_percent_of_the_known_value(seed: int) -> None:
    rounds, truth = _synthetic(20_000, seed)
    est = estimate(rounds, n_boot=200, seed=seed)
    for k in ("ips", "snips", "dr"):
        e = est[k]
        assert abs(e.value - truth) / truth < 0.05, (k, e.value, truth)
        assert e.low <= e.value <= e.high
    assert est["logged"] > truth * 1.05   # the logging policy itself is measurably worse
    assert 0 < est["ess"] <= len(rounds)


def test_estimate_refuses_empty_and_zero_propensities() -> None:
    with pytest.raises(ValueError):
        estimate([])
    with pytest.raises(ValueError):
        estimate([Round(1.0, 0.0, 1.0)])


def _views(rng: random.Random) -> list[NodeView]:
    return [NodeView(name=f"n{k}", models=frozenset({"m"}), capacity_tokens=100_000, max_concurrency=64,
                     inflight_requests=rng.randrange(10), inflight_tokens=rng.randrange(10) * 500,
                     tokens_per_s=rng.uniform(20, 80), ttft_s=rng.uniform(0.05, 0.4)) for k in range(6)]


def test_replay_of_logged_learned_decisions_estimates_a_candidate_profile() -> None:
    """Log decisions of the learned profile (ε = 0.3) from JSON, with a cost law known per node;
    the candidate token-aware profile's true value is computed by running it on each context."""
    rng = random.Random(11)
    logging = build_router("learned", seed=3, predictor={"min_samples": 0},
                           params={"softmax-bandit": {"epsilon": 0.3, "temperature": 0.05}})
    candidate = build_router("token-aware", seed=3)

    def cost(v: NodeView, out: int) -> float:   # the "true" mean cost of a node
        return (v.ttft_s or 0.2) * (1 + v.inflight_requests / 5) + out / (v.tokens_per_s or 20)

    logged: list[LoggedDecision] = []
    truth = 0.0
    for _ in range(3000):
        views = _views(rng)
        req = RouteRequest("m", rng.randrange(50, 500), rng.randrange(10, 100), stream=True)
        d = logging.decide(req, views)
        lj = json.loads(json.dumps(d.to_json()["learned"]))
        picked = next(v for v in views if v.name == d.pick)
        logged.append(LoggedDecision("m", lj, cost(picked, req.output_tokens) * rng.uniform(0.9, 1.1)))
        ctx = context_of(lj, "m")
        pi = target_probabilities(candidate, ctx)
        by = {v.name: v for v in views}
        truth += sum(p * cost(by[n], req.output_tokens) for n, p in pi.items())
    truth /= len(logged)
    out = evaluate(logged, "token-aware", n_boot=100)
    assert out["n"] == 3000 and not out["skipped"]
    for k in ("snips", "dr"):
        assert abs(out[k]["value"] - truth) / truth < 0.05, (k, out[k], truth)
    # evaluating the logging policy itself (same profile and params) gives back what was measured
    same = evaluate(logged, build_router("learned", seed=3, params={"softmax-bandit": {"epsilon": 0.3,
                                                                                      "temperature": 0.05}}),
                    n_boot=50)
    # (not exactly: the logged propensity is rounded to 6 places)
    assert same["snips"]["value"] == pytest.approx(same["logged"], rel=1e-5)
    assert same["ips"]["value"] == pytest.approx(same["logged"], rel=1e-5)
    assert math.isfinite(same["ips"]["value"])


def test_fallback_decisions_are_skipped_and_counted() -> None:
    r = build_router("learned", seed=1, predictor={"min_samples": 100})
    views = _views(random.Random(1))
    d = r.decide(RouteRequest("m", 10, 10), views)
    out = evaluate([LoggedDecision("m", d.to_json()["learned"], 1.0)], "token-aware")
    assert out["skipped"] == {"no propensity (a fallback profile decided)": 1} and "error" in out
