"""Off-policy replay is faithful to the policy that logged: replaying a ``learned`` policy on its
own logged decisions gives back, for every decision, the propensity it logged, with the tail
reservation's adaptive cut (state no single decision holds) and the interference terms on.

The log is kept as the audit trail keeps it: in completion order (not decision order), as JSON,
and only part of the decisions (fallbacks, decisions whose answers never came)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from inferlb.routing.explain import context_of
from inferlb.routing.learned import PredictedLatency
from inferlb.routing.ope_replay import LoggedDecision, evaluate, target_probabilities
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeView, RouteRequest

ADAPTIVE = {"reserve": 0.9, "reserve_quantile": 0.985, "reserve_window": 4096, "reserve_min_output": 800,
            "reserve_fast": 0.1, "interference": 1.25, "interference_max_output": 64, "prefill_interference": 1.0}
BANDIT = {"epsilon": 0.3, "temperature": 0.05}


def _params(**over: Any) -> dict[str, dict[str, Any]]:
    return {"predicted-latency": {**ADAPTIVE, **over}, "softmax-bandit": dict(BANDIT)}


def _views(rng: random.Random) -> list[NodeView]:
    # Two fast nodes, filled to various depths of their reserve, and slower ones.
    out = []
    for k in range(6):
        cap = 40_000
        out.append(NodeView(name=f"n{k}", models=frozenset({"m"}), capacity_tokens=cap, max_concurrency=64,
                            inflight_requests=rng.randrange(12), inflight_tokens=rng.randrange(cap * 9 // 10),
                            tokens_per_s=rng.uniform(60, 80) if k < 2 else rng.uniform(20, 50),
                            ttft_s=rng.uniform(0.05, 0.4)))
    return out


def _log(params: dict[str, dict[str, Any]], n: int, seed: int = 5) -> list[LoggedDecision]:
    """``n`` decisions of ``learned`` with ``params``; about 70 % of them logged, in a shuffled
    (completion) order."""
    rng = random.Random(seed)
    r = build_router("learned", seed=3, predictor={"min_samples": 0}, params=params)
    done: list[LoggedDecision] = []
    for _ in range(n):
        out = int(rng.paretovariate(1.2) * 40)   # heavy-tailed output budgets: the cut moves
        d = r.decide(RouteRequest("m", rng.randrange(50, 2000), out, stream=rng.random() < 0.5), _views(rng))
        lj = json.loads(json.dumps(d.to_json()["learned"]))
        if rng.random() < 0.7:
            done.append(LoggedDecision("m", lj, 1.0 + rng.random()))
    rng.shuffle(done)
    return done


@pytest.mark.parametrize("over", [{}, {"reserve_quantile": None}, {"reserve_window": 50}],
                         ids=["adaptive", "fixed-cut", "short-window"])
def test_a_policy_replayed_on_its_own_log_gives_back_every_logged_propensity(over: dict[str, Any]) -> None:
    params = _params(**over)
    logged = _log(params, 600)
    replay = build_router("learned", seed=3, params=params)
    for dec in logged:
        lj = dec.learned
        pi = target_probabilities(replay, context_of(lj, "m"))
        assert pi[lj["pick"]["node"]] == pytest.approx(lj["propensity"], abs=1e-6), lj
    est = evaluate(logged, replay, n_boot=20)
    assert est["snips"]["value"] == pytest.approx(est["logged"], rel=1e-5)


def test_the_logged_cut_is_the_one_the_decision_used_and_a_replay_leaves_the_window_alone() -> None:
    params = _params()
    r = build_router("learned", seed=3, predictor={"min_samples": 0}, params=params)
    rng = random.Random(2)
    sc = next(s for s, _ in r.scorers if isinstance(s, PredictedLatency))
    for i in range(150):
        cut = sc.reserve_cut()
        d = r.decide(RouteRequest("m", 100, 10 + i), _views(rng))
        assert d.to_json()["learned"]["reserve"]["cut"] == cut
    assert d.to_json()["learned"]["reserve"]["cut"] == 10 + int(0.985 * 149)   # the quantile, not 800
    replay = build_router("learned", seed=3, params=params)
    rs = next(s for s, _ in replay.scorers if isinstance(s, PredictedLatency))
    target_probabilities(replay, context_of(json.loads(json.dumps(d.to_json()["learned"])), "m"))
    assert rs._lengths is not None and len(rs._lengths) == 0 and rs.reserve_cut() == 800


def test_another_rule_is_not_given_the_logged_cut() -> None:
    """A candidate whose cut rule differs (another quantile) keeps its own; one with a fixed cut
    uses its fixed cut (it needs no state)."""
    logged = _log(_params(), 300)
    lj = next(d.learned for d in logged if d.learned["reserve"]["cut"] != 800)
    fixed = build_router("learned", seed=3, params=_params(reserve_quantile=None, reserve_min_output=5))
    other = build_router("learned", seed=3, params=_params(reserve_quantile=0.5))
    for r, cut in ((fixed, 5), (other, 800)):   # ``other`` has seen no budgets: its fixed cut
        target_probabilities(r, context_of(lj, "m"))
        sc = next(s for s, _ in r.scorers if isinstance(s, PredictedLatency))
        assert sc.last is not None and sc.last.reserve_cut == cut


def test_predicted_tpot_is_logged_in_ns_and_older_records_in_us_still_read() -> None:
    r = build_router("learned", seed=3, predictor={"min_samples": 0}, params=_params())
    d = r.decide(RouteRequest("m", 300, 40), _views(random.Random(4)))
    lj = json.loads(json.dumps(d.to_json()["learned"]))
    ctx = lj["ctx"]
    assert "pred_tpot_us" not in ctx and all(isinstance(x, int) for x in ctx["pred_tpot_ns"])
    scorer = r.scorers[0][0]
    assert isinstance(scorer, PredictedLatency) and scorer.last is not None
    names = [n.name for n in scorer.last.nodes]
    for name, ns in zip(ctx["node"], ctx["pred_tpot_ns"], strict=True):
        assert ns == int(scorer.last.preds[names.index(name)][1] * 1e9)
    old = {**lj, "ctx": {**{k: v for k, v in ctx.items() if k != "pred_tpot_ns"},
                         "pred_tpot_us": [ns // 1000 for ns in ctx["pred_tpot_ns"]]}}
    got = context_of(old, "m").preds
    for name, ns in zip(ctx["node"], ctx["pred_tpot_ns"], strict=True):
        p = got[name]
        assert p is not None and p[1] == (ns // 1000) / 1e6


def test_the_audit_copy_of_a_shipped_learned_decision_stays_bounded_at_1000_nodes() -> None:
    rng = random.Random(1)
    nodes = [NodeView(name=f"node{i:04d}", models=frozenset({"m"}), capacity_tokens=40_000, max_concurrency=64,
                      inflight_requests=rng.randrange(12), inflight_tokens=rng.randrange(30_000),
                      tokens_per_s=rng.uniform(20, 80), ttft_s=rng.uniform(0.05, 0.4), labels=(("gpu", "h100"),))
             for i in range(1000)]
    # the shipped terms plus the tail reservation (off as shipped): its cut makes the largest copy
    r = build_router("learned", seed=1, predictor={"min_samples": 0}, params={"predicted-latency": {"reserve": 0.9}})
    for out in (30, 2000):   # short (charged) and long
        j = r.decide(RouteRequest("m", 500, out, stream=True), nodes).to_json()
        assert "reserve" in j["learned"] and len(j["learned"]["ctx"]["node"]) == 16
        assert len(json.dumps(j)) < 4500
