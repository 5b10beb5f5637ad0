"""A routing-policy change gated by off-policy evaluation (routing/gate.py, learned/policy_gate.py),
without I/O: synthetic logs of the learned profile whose per-node costs follow a known law, so the
gate's verdicts can be checked against each policy's true value."""

from __future__ import annotations

import json
import random

import pytest

from inferlb.config.settings import RoutingConfig, fleet_from_mapping
from inferlb.errors import ConfigError
from inferlb.learned.policy_gate import EVENT_NODE, requirement_for, routing_changed, verdict_event
from inferlb.routing.explain import context_of
from inferlb.routing.gate import EvaluationRequirement, judge, span_seconds
from inferlb.routing.ope_replay import LoggedDecision, target_probabilities
from inferlb.routing.profiles import Router, build_router
from inferlb.routing.types import NodeView, RouteRequest

BANDIT = {"softmax-bandit": {"epsilon": 0.5, "temperature": 0.2}}


def _law(v: NodeView, out: int) -> float:
    """The mean cost (seconds) of sending a request of ``out`` tokens to ``v``."""
    return (v.ttft_s or 0.2) * (1 + v.inflight_requests / 5) + out / (v.tokens_per_s or 20)


def _log(n: int, seed: int = 3) -> tuple[list[LoggedDecision], list[tuple[list[NodeView], RouteRequest, object]]]:
    rng = random.Random(seed)
    logging = build_router("learned", seed=3, predictor={"min_samples": 0}, params=BANDIT)
    out: list[LoggedDecision] = []
    ctxs = []
    for _ in range(n):
        views = [NodeView(name=f"n{k}", models=frozenset({"m"}), capacity_tokens=100_000, max_concurrency=64,
                          inflight_requests=rng.randrange(10), inflight_tokens=rng.randrange(10) * 500,
                          tokens_per_s=rng.uniform(10, 100), ttft_s=rng.uniform(0.05, 0.4)) for k in range(5)]
        req = RouteRequest("m", rng.randrange(50, 500), rng.randrange(50, 300), stream=True)
        d = logging.decide(req, views)
        lj = json.loads(json.dumps(d.to_json()["learned"]))
        picked = next(v for v in views if v.name == d.pick)
        out.append(LoggedDecision("m", lj, _law(picked, req.output_tokens) * rng.uniform(0.95, 1.05)))
        ctxs.append((views, req, lj))
    return out, ctxs


def _truth(policy: Router, ctxs: list[tuple[list[NodeView], RouteRequest, object]]) -> float:
    total = 0.0
    for views, req, lj in ctxs:
        pi = target_probabilities(policy, context_of(lj, "m"))   # type: ignore[arg-type]
        by = {v.name: v for v in views}
        total += sum(p * _law(by[n], req.output_tokens) for n, p in pi.items())
    return total / len(ctxs)


@pytest.fixture(scope="module")
def logged() -> tuple[list[LoggedDecision], list[tuple[list[NodeView], RouteRequest, object]]]:
    return _log(800)


def _req(**kw: object) -> EvaluationRequirement:
    return EvaluationRequirement.model_validate({"bootstrap": 20, "min_ess": 50, **kw})


def test_the_logging_policy_itself_passes_against_what_it_measured(logged: tuple[list[LoggedDecision], list]) -> None:
    decisions, _ = logged
    same = build_router("learned", seed=9, params=BANDIT)            # a new seed: the same probabilities
    v = judge(decisions, same, build_router("learned", seed=3, params=BANDIT), _req(max_regression=0.001),
              current_logged=True)
    assert v["passed"] is True, v["reason"]
    assert v["baseline"]["how"] == "measured on the logged decisions" and v["baseline"]["n"] == 800
    assert v["candidate"]["estimate"]["value"] == pytest.approx(v["baseline"]["value"], rel=1e-4)
    assert v["reason"].startswith("learned passed: mean e2e cost per decision")


def test_a_worse_candidate_is_refused_as_its_true_value_says(logged: tuple[list[LoggedDecision], list]) -> None:
    decisions, ctxs = logged
    current = build_router("learned", seed=3, params=BANDIT)
    worse = build_router("round-robin", seed=1)                       # ignores load and speed
    truth_worse, truth_current = _truth(worse, ctxs), sum(d.reward for d in decisions) / len(decisions)
    assert truth_worse > 1.2 * truth_current                          # the law says so, by a margin
    v = judge(decisions, worse, current, _req(), current_logged=True)
    assert v["passed"] is False and "round-robin is estimated worse than learned" in v["reason"]
    assert "more than the 5 % allowed" in v["reason"] and v["bound"] == pytest.approx(v["baseline"]["value"] * 1.05)
    # the estimate it refused on is close to the truth (the log overlaps round-robin everywhere)
    assert v["candidate"]["estimate"]["value"] == pytest.approx(truth_worse, rel=0.05)
    # with room for it (a margin of 100 %), the same candidate passes
    assert judge(decisions, worse, current, _req(max_regression=1.0), current_logged=True)["passed"] is True


def test_against_a_current_policy_that_did_not_log_its_estimate_is_the_baseline(
        logged: tuple[list[LoggedDecision], list]) -> None:
    decisions, ctxs = logged
    v = judge(decisions, build_router("learned", seed=9, params=BANDIT), build_router("round-robin", seed=1),
              _req(), current_logged=False)
    assert v["passed"] is True and v["baseline"]["how"] == "estimated by snips"
    assert v["baseline"]["value"] == pytest.approx(_truth(build_router("round-robin", seed=1), ctxs), rel=0.05)


def test_too_little_overlap_or_no_log_is_a_refusal_never_a_pass(logged: tuple[list[LoggedDecision], list]) -> None:
    decisions, _ = logged
    current = build_router("learned", seed=3, params=BANDIT)
    v = judge(decisions, build_router("token-aware", seed=1), current, _req(min_ess=10_000), current_logged=True)
    assert v["passed"] is False and "was refused: insufficient overlap" in v["reason"]
    empty = judge([], build_router("token-aware"), current, _req(), current_logged=True)
    assert empty["passed"] is False and "no logged decision with a propensity" in empty["reason"]
    # the current policy cannot be estimated either: no comparison, no pass
    v = judge(decisions, build_router("learned", seed=9, params=BANDIT), build_router("token-aware", seed=1),
              _req(min_ess=10_000), current_logged=False)
    assert v["passed"] is False


def test_switch_dr_is_an_estimator_the_gate_accepts(logged: tuple[list[LoggedDecision], list]) -> None:
    decisions, ctxs = logged
    req = _req(estimator="switch_dr")
    assert req.estimator == "switch_dr"
    with pytest.raises(ValueError):
        EvaluationRequirement.model_validate({"estimator": "switch-dr"})
    current = build_router("learned", seed=3, params=BANDIT)
    worse = build_router("round-robin", seed=1)
    v = judge(decisions, worse, current, req, current_logged=True)
    # refused by the SWITCH-DR estimate, which is the one reported, and close to the law's truth
    assert v["passed"] is False and v["estimator"] == "switch_dr" and "switch_dr," in v["reason"]
    assert v["candidate"]["estimate"]["value"] == pytest.approx(_truth(worse, ctxs), rel=0.05)
    same = judge(decisions, build_router("learned", seed=9, params=BANDIT), current, _req(estimator="switch_dr",
                 max_regression=0.001), current_logged=True)
    assert same["passed"] is True, same["reason"]


def test_requirement_parsing_and_what_counts_as_a_policy_change() -> None:
    assert [span_seconds(x) for x in ("90s", "30m", "24h", "7d", "120", 60)] == [90, 1800, 86400, 604800, 120, 60]
    for bad in ("yesterday", "-1h", "0", "400d"):
        with pytest.raises(ValueError):
            span_seconds(bad)
    doc = {"models": [{"name": "m"}], "nodes": [{"name": "a", "url": "http://127.0.0.1:1", "models": ["m"]}],
           "routing": {"profile": "token-aware", "require_evaluation": {"since": "soon"}}}
    with pytest.raises(ConfigError) as exc:
        fleet_from_mapping(doc, source="fleet.yaml")
    assert exc.value.path == "routing.require_evaluation.since" and "not a time span" in exc.value.message
    doc["routing"] = {"profile": "token-aware", "require_evaluation": {"max_regresion": 0.1}}
    with pytest.raises(ConfigError) as exc:
        fleet_from_mapping(doc, source="fleet.yaml")
    assert exc.value.path == "routing.require_evaluation.max_regresion"
    gate = EvaluationRequirement(max_regression=0.1)
    old = RoutingConfig(profile="learned")
    assert not routing_changed(old, old.model_copy(update={"require_evaluation": gate}))   # the gate itself
    assert routing_changed(old, RoutingConfig(profile="learned", params=BANDIT))
    # the new file's requirement when it has one, else the running one's (removing it does not skip it)
    assert requirement_for(old, RoutingConfig(require_evaluation=gate)) is gate
    assert requirement_for(RoutingConfig(require_evaluation=gate), RoutingConfig()) is gate
    assert requirement_for(old, RoutingConfig()) is None


def test_the_verdict_becomes_a_policy_event() -> None:
    ev = verdict_event({"passed": False, "from": "learned", "to": "token-aware", "reason": "worse", "bound": 1.0},
                       at=12.3456789, actor={"by": "admin", "key_id": None})
    assert (ev.node, ev.from_state, ev.to_state, ev.at) == (EVENT_NODE, "learned", "refused", 12.345679)
    assert ev.reason == "routing change learned → token-aware refused: worse"
    assert ev.evidence == {"from": "learned", "to": "token-aware", "bound": 1.0, "by": "admin", "key_id": None}


def test_a_log_that_reserved_capacity_carries_a_caveat_and_one_that_did_not_none(
        logged: tuple[list[LoggedDecision], list]) -> None:
    decisions, _ = logged
    assert any(d.learned.get("reserve") for d in decisions)   # the shipped learned profile reserves
    same, current = build_router("learned", seed=9, params=BANDIT), build_router("learned", seed=3, params=BANDIT)
    v = judge(decisions, same, current, _req(max_regression=0.001), current_logged=True)
    assert v["passed"] is True and len(v["caveats"]) == 1
    assert "a policy that reserves fast-node capacity" in v["caveats"][0] and v["reason"].endswith(v["caveats"][0])
    plain = [LoggedDecision(d.model, {k: x for k, x in d.learned.items() if k != "reserve"}, d.reward)
             for d in decisions]
    w = judge(plain, same, current, _req(max_regression=0.001), current_logged=True)
    assert "caveats" not in w and "caveat" not in w["reason"]
