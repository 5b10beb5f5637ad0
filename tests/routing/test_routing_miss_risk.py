"""The SLO-miss risk: its estimator (prior, update, forgetting, bands), the predicted-latency
scorer's charge, the feedback path that teaches it and the audit a replay reads. Pure, no clock:
every outcome is injected."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from pydantic import ValidationError

from inferlb.routing.explain import context_of
from inferlb.routing.learned import PredictedLatency, PredictedLatencyParams
from inferlb.routing.lifecycle import observe_decision, observe_failure
from inferlb.routing.miss_risk import MissRisk, class_of
from inferlb.routing.ope_replay import target_probabilities
from inferlb.routing.profiles import LEARNED_LATENCY, build_router
from inferlb.routing.types import NodeView, RouteRequest
from inferlb.simulator.des.feedback import Finished, LearnedFeedback
from tests.routing.table_predictor import TablePredictor

CAP = 100_000


def _node(name: str, inflight_tokens: int = 0, cap: int = CAP,
          labels: tuple[tuple[str, str], ...] = ()) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=cap, max_concurrency=256,
                    inflight_tokens=inflight_tokens, labels=labels)


# ------------------------------------------------------------------ the estimator


def test_bands_count_the_edges_at_or_below_the_load() -> None:
    r = MissRisk((0.8, 0.9, 0.95))
    assert [r.band(t, 1000) for t in (0, 799, 800, 899, 900, 949, 950, 5000)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert r.band(-5, 1000) == 0            # a negative count is no load
    assert r.band(10, 0) is None            # no capacity: no band


def test_an_unseen_key_is_the_prior_and_a_node_unseen_in_a_band_is_the_bands_pool() -> None:
    r = MissRisk(half_life=1e9, prior_rate=0.01, prior_n=20.0)
    assert r.probability("a", 3, True) == pytest.approx(0.01)
    r.observe("a", 960, 1000, True, True)   # one miss of "a" in band 3
    pool = (1.0 + 0.01 * 20) / (1.0 + 20)
    assert r.probability("b", 3, True) == pytest.approx(pool)
    assert r.probability("a", 3, True) == pytest.approx((1.0 + 20 * pool) / (1.0 + 20))
    assert r.probability("a", 3, False) == pytest.approx(0.01)   # streams and the rest apart
    assert r.probability("a", 0, True) == pytest.approx(0.01)    # other bands untouched
    assert r.observed == 1


def test_misses_raise_it_and_answers_that_meet_the_slo_lower_it() -> None:
    r = MissRisk(half_life=1e9)
    for _ in range(50):
        r.observe("a", 970, 1000, True, True)
        r.observe("b", 970, 1000, True, False)
    # the band's pool is 1/2 (50 misses of 100): each node pulled from it by its own answers
    assert r.probability("a", 3, True) == pytest.approx((50 + 20 * (50 + 0.2) / 120) / 70)
    assert r.probability("b", 3, True) == pytest.approx((0 + 20 * (50 + 0.2) / 120) / 70)
    assert r.probability("a", 3, True) > 0.8 > 0.2 > r.probability("b", 3, True)


def test_forgetting_halves_a_keys_counts_each_half_life() -> None:
    r = MissRisk(half_life=1.0)             # γ = 0.5 per update of the key
    r.observe("a", 0, 1000, True, True)
    r.observe("a", 0, 1000, True, False)
    assert r.counts("a", 0, True) == pytest.approx([0.5, 1.5])
    assert r.counts(None, 0, True) == pytest.approx([0.5, 1.5])
    for _ in range(40):                     # a run of answers that met the SLO: the old miss fades
        r.observe("a", 0, 1000, True, False)
    c = r.counts("a", 0, True)
    assert c is not None and c[0] < 1e-9


def test_a_node_without_capacity_teaches_nothing_and_is_charged_nothing() -> None:
    r = MissRisk()
    r.observe("a", 10, 0, True, True)
    assert r.tables == {} and r.observed == 0
    assert r.probabilities([_node("a", 10, cap=0)], True) == [0.0]


def test_the_candidates_probabilities_are_band_and_probability_float_for_float() -> None:
    rng = random.Random(3)
    r = MissRisk(half_life=30.0)
    for _ in range(2000):
        r.observe(f"n{rng.randrange(8)}", rng.randrange(1200), 1000, rng.randrange(4), rng.random() < 0.2)
    nodes = [_node(f"n{rng.randrange(10)}", rng.randrange(120_000), cap=rng.choice([0, CAP])) for _ in range(300)]
    for kind in range(5):
        want = []
        for n in nodes:
            k = r.band(n.inflight_tokens, n.capacity_tokens)
            want.append(0.0 if k is None else r.probability(n.name, k, kind))
        assert r.probabilities(nodes, kind) == want


@pytest.mark.parametrize("bad", [{"edges": (0.9, 0.8)}, {"edges": (0.0, 0.5)}, {"half_life": 0.0},
                                 {"prior_rate": 1.5}, {"prior_n": 0.0}])
def test_bad_settings_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        MissRisk(**bad)


@pytest.mark.parametrize("bad", [{"risk_weight": -1.0}, {"risk_half_life": 0.0}, {"risk_prior": 2.0},
                                 {"risk_bands": []}, {"risk_bands": [0.9, 0.8]}, {"risk_prompt_bands": [0]},
                                 {"risk_prompt_bands": [2048, 1024]}, {"risk_judge": "e2e"},
                                 {"risk_key": "gpu"}, {"risk_failures": "maybe"},
                                 {"risk_wieght": 1.0}])
def test_scorer_params_refuse_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        PredictedLatencyParams.model_validate(bad)


# ------------------------------------------------------------------ the charge


def _scorer(**params: Any) -> PredictedLatency:
    s = PredictedLatency(PredictedLatencyParams.model_validate({"ttft_slo_s": 2.0, **params}))
    s.bind(TablePredictor({n: (0.2, 0.01) for n in ("a", "b", "h1", "h2", "l1")}))
    return s


STREAM = RouteRequest("m", 500, 50, stream=True)


def test_off_by_default_no_estimator_no_charge() -> None:
    s = _scorer()
    assert s.risk is None
    s.score_all(STREAM, [_node("a", 96_000), _node("b", 10_000)])
    assert s.last is not None and s.last.risk is None
    s.observe_outcome(STREAM, _node("a", 96_000), ttfb_s=9.0, e2e_s=10.0)   # nothing to teach
    s.observe_outcome(STREAM, _node("a", 96_000), ttfb_s=None, e2e_s=None, failed=True)
    assert s.risk is None


def test_a_node_with_a_high_miss_probability_loses_to_an_otherwise_equal_one() -> None:
    s = _scorer(risk_weight=1.0)
    a, b = _node("a", 96_000), _node("b", 96_000)
    assert s.score_all(STREAM, [a, b])[0] == s.score_all(STREAM, [a, b])[1]   # the prior: equal
    for _ in range(30):   # "a" at 96 % of its tokens misses its TTFT, "b" at the same load meets it
        s.observe_outcome(STREAM, a, ttfb_s=4.0, e2e_s=5.0)
        s.observe_outcome(STREAM, b, ttfb_s=0.3, e2e_s=1.0)
    sa, sb = s.score_all(STREAM, [a, b])
    assert sa < sb
    assert s.last is not None and s.last.risk is not None
    pa, pb = s.last.risk
    base = (2.0 - 0.2) / 2.0                # the TTFT slack both have before the charge
    assert s.last.slack == [pytest.approx(base - pa), pytest.approx(base - pb)]
    assert pa > pb


def test_the_charge_is_the_weight_times_the_probability_and_outcomes_are_judged_like_with_like() -> None:
    s = _scorer(risk_weight=2.0, miss_ttft_s=1.0, miss_e2e_s=10.0, risk_half_life=1e9)
    full = _node("a", 99_000)
    s.observe_outcome(STREAM, full, ttfb_s=1.5, e2e_s=3.0)                          # TTFT > 1 s: a miss
    s.observe_outcome(RouteRequest("m", 500, 50), full, ttfb_s=1.5, e2e_s=9.0)       # e2e ≤ 10 s: met
    s.observe_outcome(RouteRequest("m", 500, 50, deadline_s=5.0), full, ttfb_s=6.0, e2e_s=6.0)  # > deadline
    assert s.risk is not None
    assert s.risk.counts("a", 3, True) == [1.0, 1.0]
    assert s.risk.counts("a", 3, False) == pytest.approx([1.0, 2.0])
    s.observe_outcome(STREAM, full, ttfb_s=None, e2e_s=3.0)                           # no first token: nothing
    assert s.risk.observed == 3
    p = s.risk.probability("a", 3, True)
    s.score_all(STREAM, [full])
    assert s.last is not None and s.last.risk == [p]
    assert s.last.slack == [pytest.approx((2.0 - 0.2) / 2.0 - 2.0 * p)]


def test_judged_on_the_slo_a_streams_e2e_past_its_budget_is_a_miss_too() -> None:
    full = _node("a", 99_000)
    late = {"ttfb_s": 0.5, "e2e_s": 25.0}           # first token in time, the answer past 20 s
    ttft = _scorer(risk_weight=1.0, miss_ttft_s=2.0, miss_e2e_s=20.0, risk_half_life=1e9)
    slo = _scorer(risk_weight=1.0, miss_ttft_s=2.0, miss_e2e_s=20.0, risk_judge="slo", risk_half_life=1e9)
    for s in (ttft, slo):
        s.observe_outcome(STREAM, full, **late)
        s.observe_outcome(STREAM, full, ttfb_s=3.0, e2e_s=5.0)      # a TTFT miss: a miss either way
        s.observe_outcome(STREAM, full, ttfb_s=0.5, e2e_s=None)     # no e2e: only the TTFT judge counts it
    assert ttft.risk is not None and slo.risk is not None
    assert ttft.risk.counts("a", 3, 1) == pytest.approx([1.0, 3.0])
    assert slo.risk.counts("a", 3, 1) == pytest.approx([2.0, 2.0])


def test_prompt_bands_count_long_and_short_prompts_apart() -> None:
    s = _scorer(risk_weight=1.0, miss_ttft_s=2.0, risk_prompt_bands=[1024])
    full = _node("a", 99_000)
    long = RouteRequest("m", 3000, 50, stream=True)
    for _ in range(20):
        s.observe_outcome(long, full, ttfb_s=5.0, e2e_s=9.0)        # long prompts miss there
        s.observe_outcome(STREAM, full, ttfb_s=0.3, e2e_s=1.0)      # short ones (500 tokens) do not
    assert s.risk is not None
    assert all(set(t) == {"a", None} for t in s.risk.tables.values())
    assert set(s.risk.tables) == {(3, 1), (3, 3)}
    s.score_all(long, [full])
    assert s.last is not None and s.last.risk is not None
    p_long = s.last.risk[0]
    s.score_all(STREAM, [full])
    assert s.last is not None and s.last.risk is not None
    assert p_long > 0.5 > 0.1 > s.last.risk[0]


def test_pinned_probabilities_replace_the_counts_until_unpinned() -> None:
    s = _scorer(risk_weight=1.0)
    a, b = _node("a", 96_000), _node("b", 10_000)
    s.pin_risk({"a": 0.5})
    s.score_all(STREAM, [a, b])
    assert s.last is not None and s.last.risk == [0.5, 0.0]
    s.pin_risk(None)
    s.score_all(STREAM, [a, b])
    assert s.last is not None and s.last.risk == [pytest.approx(0.01), pytest.approx(0.01)]


# ------------------------------------------------------------------ the feedback path and the audit


def _learned(**latency: Any) -> Any:
    params = {"predicted-latency": {**LEARNED_LATENCY, "ttft_slo_s": 2.0, **latency},
              "softmax-bandit": {"epsilon": 0.3}}
    return build_router("learned", seed=4, predictor={"min_samples": 0}, params=params)


def _views(rng: random.Random) -> list[NodeView]:
    return [NodeView(name=f"n{k}", models=frozenset({"m"}), capacity_tokens=40_000, max_concurrency=64,
                     inflight_requests=rng.randrange(12), inflight_tokens=rng.randrange(40_000),
                     tokens_per_s=rng.uniform(20, 80), ttft_s=rng.uniform(0.05, 0.4)) for k in range(6)]


def _scorer_of(router: Any) -> PredictedLatency:
    return next(s for s, _ in router.scorers if isinstance(s, PredictedLatency))


def test_off_registers_no_hook() -> None:
    assert _learned().lifecycle.outcome_hooks == []


def test_the_gateways_hook_teaches_the_risk_what_the_pick_measured() -> None:
    r = _learned(risk_weight=1.0)
    sc = _scorer_of(r)
    d = r.decide(STREAM, _views(random.Random(1)))
    assert d.learned is not None and d.learned.pick is not None
    view = d.learned.pick
    observe_decision(r.lifecycle, d, stream=True, completion_tokens=50, ttfb_s=3.0, e2e_s=4.0)
    assert sc.risk is not None and sc.risk.observed == 1
    k = sc.risk.band(view.inflight_tokens, view.capacity_tokens)
    assert k is not None
    assert sc.risk.counts(view.name, k, True) == [1.0, 1.0]


def test_the_simulators_feedback_teaches_it_the_same_way() -> None:
    r = _learned(risk_weight=1.0)
    sc = _scorer_of(r)
    fb = LearnedFeedback(r)
    d = r.decide(STREAM, _views(random.Random(2)))
    assert d.learned is not None and d.learned.pick is not None
    fb.on_finish(Finished(0, None, "m", d, d.pick, "ok", True, 50, 0.5, 1.5, 0.0, 1.0))   # TTFT 0.5 s: met
    fb.on_finish(Finished(1, None, "m", d, d.pick, "timeout", True, 0, None, None, 0.0, 2.0))  # not an answer
    assert sc.risk is not None and sc.risk.observed == 1
    view = d.learned.pick
    k = sc.risk.band(view.inflight_tokens, view.capacity_tokens)
    assert k is not None
    assert sc.risk.counts(view.name, k, True) == [0.0, 1.0]


def test_a_replay_on_its_own_log_gives_back_every_logged_propensity() -> None:
    rng = random.Random(9)
    r = _learned(risk_weight=2.0)
    logged = []
    for _ in range(400):
        req = RouteRequest("m", rng.randrange(50, 2000), rng.randrange(1, 200), stream=rng.random() < 0.7)
        d = r.decide(req, _views(rng))
        if d.learned is None or d.learned.pick is None:
            continue
        v = d.learned.pick
        slow = v.inflight_tokens > 0.8 * v.capacity_tokens and rng.random() < 0.5   # misses near full
        observe_decision(r.lifecycle, d, stream=req.stream, completion_tokens=req.output_tokens,
                         ttfb_s=3.0 if slow else 0.2, e2e_s=40.0 if slow else 2.0)
        logged.append(json.loads(json.dumps(d.to_json()["learned"])))
    charged = [lj for lj in logged if len(set(lj["ctx"]["risk"])) > 1]
    assert len(charged) > 100                # the counts moved: candidates were charged differently
    replay = _learned(risk_weight=2.0)       # a fresh scorer: its own counts are the prior
    for lj in logged:
        ctx = context_of(lj, "m")
        assert ctx.risk is not None
        pi = target_probabilities(replay, ctx)
        assert pi[lj["pick"]["node"]] == pytest.approx(lj["propensity"], abs=1e-6), lj


def _answer(r: Any, d: Any, req: RouteRequest) -> None:
    observe_decision(r.lifecycle, d, stream=req.stream, completion_tokens=req.output_tokens, ttfb_s=3.0, e2e_s=30.0)


def _fail(r: Any, d: Any, req: RouteRequest) -> None:
    observe_failure(r.lifecycle, d)


@pytest.mark.parametrize(("tuned_params", "seed", "n", "teach"), [
    ({"risk_bands": [0.5], "risk_prior": 0.3, "risk_prior_n": 1.0, "risk_half_life": 3.0}, 11, 200, _answer),
    ({"risk_key": "class", "risk_failures": True}, 12, 100, _fail),
], ids=["other-risk-settings", "new-options"])
def test_off_the_decisions_and_their_audit_are_byte_identical_whatever_the_other_risk_settings(
        tuned_params: dict[str, Any], seed: int, n: int, teach: Any) -> None:
    plain, tuned = _learned(), _learned(**tuned_params)
    rng = random.Random(seed)
    for _ in range(n):
        req = RouteRequest("m", rng.randrange(50, 2000), rng.randrange(1, 200), stream=rng.random() < 0.5)
        views = _views(rng)
        a, b = plain.decide(req, views), tuned.decide(req, views)
        assert json.dumps(a.to_json()) == json.dumps(b.to_json())
        for r, d in ((plain, a), (tuned, b)):
            teach(r, d, req)
    assert "risk" not in json.dumps(a.to_json()["learned"]["ctx"])


# ------------------------------------------------------------------ keyed by GPU class; failures as misses


def test_the_class_is_the_gpu_label_else_the_token_capacity() -> None:
    assert class_of(_node("a", labels=(("gpu", "NVIDIA-H100-80GB"), ("zone", "z")))) == "nvidia-h100-80gb"
    assert class_of(_node("a", labels=(("gpu_type", "L4"),))) == "l4"
    assert class_of(_node("a", cap=5000, labels=(("zone", "z"),))) == "cap:5000"
    with pytest.raises(ValueError):
        MissRisk(key="gpu")  # type: ignore[arg-type]


def test_keyed_by_class_a_node_learns_from_its_classs_answers_and_not_from_another_class() -> None:
    node, cls = (_scorer(risk_weight=1.0, risk_half_life=1e9, risk_key=k) for k in ("node", "class"))
    h1, h2 = _node("h1", 96_000, labels=(("gpu", "h100"),)), _node("h2", 96_000, labels=(("gpu", "h100"),))
    l1 = _node("l1", 96_000, labels=(("gpu", "l4"),))
    for s in (node, cls):
        for _ in range(30):
            s.observe_outcome(STREAM, h1, ttfb_s=4.0, e2e_s=5.0)    # h1 misses, l1 meets its TTFT
            s.observe_outcome(STREAM, l1, ttfb_s=0.3, e2e_s=1.0)
        s.score_all(STREAM, [h1, h2, l1])
    assert cls.risk is not None and set(cls.risk.tables[(3, 1)]) == {"h100", "l4", None}
    assert node.last is not None and node.last.risk is not None
    assert cls.last is not None and cls.last.risk is not None
    pn, pc = node.last.risk, cls.last.risk
    assert pc[0] == pc[1] == pytest.approx(cls.risk.probability("h100", 3, True))   # h2 gets h1's answers
    assert pn[1] < pc[1]                 # keyed by node, h2 unseen: only the band's pool
    assert pc[0] > 0.5 > 0.2 > pc[2]       # l1's own answers keep it low
    assert pn[0] == pytest.approx(pc[0])   # the same answers under one key either way


def test_with_failures_an_attempt_without_an_answer_is_a_miss_else_nothing() -> None:
    off, on = _scorer(risk_weight=1.0, risk_half_life=1e9), \
        _scorer(risk_weight=1.0, risk_half_life=1e9, risk_failures=True)
    full = _node("a", 99_000)
    for s in (off, on):
        s.observe_outcome(STREAM, full, ttfb_s=0.3, e2e_s=1.0)                  # met
        s.observe_outcome(STREAM, full, ttfb_s=None, e2e_s=None, failed=True)   # no answer
    assert off.risk is not None and on.risk is not None
    assert off.risk.counts("a", 3, 1) == [0.0, 1.0]
    assert on.risk.counts("a", 3, 1) == pytest.approx([1.0, 2.0])


def test_the_gateways_and_the_simulators_failure_paths_teach_the_same_miss() -> None:
    for via in ("gateway", "des"):
        r = _learned(risk_weight=1.0, risk_failures=True, risk_half_life=1e9)
        sc = _scorer_of(r)
        d = r.decide(STREAM, _views(random.Random(3)))
        assert d.learned is not None and d.learned.pick is not None
        if via == "gateway":
            observe_failure(r.lifecycle, d)
        else:
            fb = LearnedFeedback(r)
            fb.on_finish(Finished(0, None, "m", d, d.pick, "timeout", True, 0, None, None, 0.0, 2.0))
            fb.on_finish(Finished(1, None, "m", d, d.pick, "failed", True, 0, None, None, 0.0, 2.0))
        view = d.learned.pick
        k = sc.risk.band(view.inflight_tokens, view.capacity_tokens) if sc.risk is not None else None
        assert sc.risk is not None and k is not None
        assert sc.risk.counts(view.name, k, True) == pytest.approx([1.0, 1.0] if via == "gateway" else [2.0, 2.0])
    observe_failure(_learned().lifecycle, d)   # off: no hook, nothing called (no error)
