"""A routing-policy change gated by off-policy evaluation (routing/gate.py, learned/policy_gate.py),
without I/O: synthetic logs of the learned profile whose per-node costs follow a known law, so the
gate's verdicts can be checked against each policy's true value."""

from __future__ import annotations

import json
import random

import pytest

from inferlb.config.settings import RoutingConfig, fleet_from_mapping
from inferlb.errors import ConfigError, StoreError
from inferlb.learned.policy_gate import (
    EVENT_NODE,
    gate_routing_change,
    requirement_for,
    routing_changed,
    verdict_event,
)
from inferlb.routing.explain import context_of
from inferlb.routing.gate import EvaluationRequirement, fixed_heuristic, fixed_heuristic_profiles, judge, span_seconds
from inferlb.routing.ope_replay import LoggedDecision, target_probabilities
from inferlb.routing.profiles import PROFILES, Router, build_router
from inferlb.routing.types import NodeView, RouteRequest

# The tail reservation on (the learned profile shipped it until issue 22 item 4 turned it off), so
# these logs carry the reserve that the caveat test needs.
BANDIT = {"softmax-bandit": {"epsilon": 0.5, "temperature": 0.2}, "predicted-latency": {"reserve": 0.9}}
Logged = tuple[list[LoggedDecision], list[tuple[list[NodeView], RouteRequest, object]]]


def _custom(profile: str, seed: int = 1) -> Router:
    """``profile`` with a filter list of its own (no node-selector): it decides as the profile does
    here, but it is not the built-in profile, so the gate judges it (it is not the safe direction)."""
    return build_router(profile, seed=seed, filters=[f for f in PROFILES[profile].filters if f != "node-selector"])


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


def test_the_logging_policy_itself_passes_against_what_it_measured(logged: Logged) -> None:
    decisions, _ = logged
    same = build_router("learned", seed=9, params=BANDIT)            # a new seed: the same probabilities
    v = judge(decisions, same, build_router("learned", seed=3, params=BANDIT), _req(max_regression=0.001),
              current_logged=True)
    assert v["passed"] is True, v["reason"]
    assert v["baseline"]["how"] == "measured on the logged decisions" and v["baseline"]["n"] == 800
    assert v["candidate"]["estimate"]["value"] == pytest.approx(v["baseline"]["value"], rel=1e-4)
    assert v["reason"].startswith("learned passed: mean e2e cost per decision")


def test_a_worse_candidate_is_refused_as_its_true_value_says(logged: Logged) -> None:
    decisions, ctxs = logged
    current = build_router("learned", seed=3, params=BANDIT)
    worse = _custom("round-robin")                                     # ignores load and speed
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
        logged: Logged) -> None:
    decisions, ctxs = logged
    v = judge(decisions, build_router("learned", seed=9, params=BANDIT), build_router("round-robin", seed=1),
              _req(), current_logged=False)
    assert v["passed"] is True and v["baseline"]["how"] == "estimated by snips"
    assert v["baseline"]["value"] == pytest.approx(_truth(build_router("round-robin", seed=1), ctxs), rel=0.05)


def test_too_little_overlap_or_no_log_is_a_refusal_never_a_pass(logged: Logged) -> None:
    decisions, _ = logged
    current = build_router("learned", seed=3, params=BANDIT)
    v = judge(decisions, _custom("token-aware"), current, _req(min_ess=10_000), current_logged=True)
    assert v["passed"] is False and "was refused: insufficient overlap" in v["reason"]
    empty = judge([], _custom("token-aware"), current, _req(), current_logged=True)
    assert empty["passed"] is False and "no logged decision with a propensity" in empty["reason"]
    # the current policy cannot be estimated either: no comparison, no pass
    v = judge(decisions, build_router("learned", seed=9, params=BANDIT), build_router("token-aware", seed=1),
              _req(min_ess=10_000), current_logged=False)
    assert v["passed"] is False


def test_switch_dr_is_an_estimator_the_gate_accepts(logged: Logged) -> None:
    decisions, ctxs = logged
    req = _req(estimator="switch_dr")
    assert req.estimator == "switch_dr"
    with pytest.raises(ValueError):
        EvaluationRequirement.model_validate({"estimator": "switch-dr"})
    current = build_router("learned", seed=3, params=BANDIT)
    worse = _custom("round-robin")
    v = judge(decisions, worse, current, req, current_logged=True)
    # refused by the SWITCH-DR estimate, which is the one reported, and close to the law's truth
    assert v["passed"] is False and v["estimator"] == "switch_dr" and "switch_dr," in v["reason"]
    assert v["candidate"]["estimate"]["value"] == pytest.approx(_truth(worse, ctxs), rel=0.05)
    # the same policy: SWITCH-DR's reward-model terms do not cancel as SNIPS's weights of 1 do, so
    # its paired interval has a width (±1.4 % here) that the margin must cover
    same = judge(decisions, build_router("learned", seed=9, params=BANDIT), current, _req(estimator="switch_dr",
                 max_regression=0.02), current_logged=True)
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
        logged: Logged) -> None:
    decisions, _ = logged
    assert any(d.learned.get("reserve") for d in decisions)   # a learned profile with the reserve on
    same, current = build_router("learned", seed=9, params=BANDIT), build_router("learned", seed=3, params=BANDIT)
    v = judge(decisions, same, current, _req(max_regression=0.001), current_logged=True)
    assert v["passed"] is True and len(v["caveats"]) == 1
    assert "a policy that reserves fast-node capacity" in v["caveats"][0] and v["reason"].endswith(v["caveats"][0])
    plain = [LoggedDecision(d.model, {k: x for k, x in d.learned.items() if k != "reserve"}, d.reward)
             for d in decisions]
    w = judge(plain, same, current, _req(max_regression=0.001), current_logged=True)
    assert "caveats" not in w and "caveat" not in w["reason"]


# ---------------------------------------------------------------- the interval, and the safe direction


def test_a_point_estimate_within_the_margin_does_not_pass_when_its_interval_is_not(
        logged: Logged) -> None:
    decisions, _ = logged
    current = build_router("learned", seed=3, params=BANDIT)
    worse = _custom("round-robin")
    probe = judge(decisions, worse, current, _req(max_regression=10.0), current_logged=True)
    base, value, high = probe["baseline"]["value"], probe["candidate"]["estimate"]["value"], probe["upper"]
    assert base < value < high
    ratio = probe["candidate"]["estimate"]["value"] / base
    # a margin between the point estimate and the upper end of its (paired) interval: refused
    margin = ((value + high) / 2) / base - 1.0
    v = judge(decisions, worse, current, _req(max_regression=margin), current_logged=True)
    assert v["passed"] is False and v["bound"] == pytest.approx(base * (1 + margin)) and v["upper"] == high
    assert value <= v["bound"] < high
    assert "round-robin is not shown within" in v["reason"] and "95 % interval (paired" in v["reason"]
    assert f"{(ratio - 1) * 100:+.1f} %" in v["reason"]
    # a margin past the interval's upper end: passed, saying both
    wide = judge(decisions, worse, current, _req(max_regression=high / base - 1.0 + 0.01), current_logged=True)
    assert wide["passed"] is True and "interval (paired with what it measured) up to" in wide["reason"]
    # against an estimated baseline the candidate's own (unpaired) interval is the one compared
    est = judge(decisions, worse, build_router("learned", seed=9, params=BANDIT), _req(max_regression=10.0),
                current_logged=False)
    assert est["upper"] == est["candidate"]["estimate"]["ci_high"]
    mid = ((est["candidate"]["estimate"]["value"] + est["upper"]) / 2) / est["baseline"]["value"] - 1.0
    assert judge(decisions, worse, build_router("learned", seed=9, params=BANDIT), _req(max_regression=mid),
                 current_logged=False)["passed"] is False


def test_the_fixed_heuristic_profiles_are_every_built_in_that_does_not_learn() -> None:
    assert fixed_heuristic_profiles() == frozenset(PROFILES) - {"learned"}
    assert fixed_heuristic("token-aware") and not fixed_heuristic("learned") and not fixed_heuristic("mine")
    assert fixed_heuristic(build_router("token-aware", seed=2, params={"kv-cache": {}}))   # params allowed
    assert not fixed_heuristic(build_router("learned", params=BANDIT))
    assert not fixed_heuristic(_custom("round-robin"))                                    # its own filters
    assert not fixed_heuristic(build_router("token-aware", scorers={"outstanding-tokens": 1.0}))
    assert not fixed_heuristic(build_router("token-aware", picker="softmax-bandit"))


def test_a_change_to_a_fixed_heuristic_is_always_allowed_and_reports_its_evaluation(
        logged: Logged) -> None:
    decisions, _ = logged
    current = build_router("learned", seed=3, params=BANDIT)
    # little overlap (token-aware picks its best node, the log explored): the evaluation refuses...
    v = judge(decisions, build_router("token-aware", seed=1), current, _req(min_ess=10_000), current_logged=True)
    # ...and the change is allowed all the same, saying so
    assert v["passed"] is True and v["safe_direction"] is True and v["evaluation_passed"] is False
    assert v["reason"].startswith("token-aware is a fixed heuristic profile, the safe direction")
    assert "would refuse it: the evaluation of token-aware was refused: insufficient overlap" in v["reason"]
    assert "ess" in v["candidate"]
    # worse by its estimate: allowed too; no log at all: allowed too
    worse = judge(decisions, build_router("round-robin", seed=1), current, _req(), current_logged=True)
    assert worse["passed"] is True and worse["evaluation_passed"] is False and "estimated worse" in worse["reason"]
    empty = judge([], build_router("least-connections"), current, _req(), current_logged=True)
    assert empty["passed"] is True and empty["evaluation_passed"] is False
    ev = verdict_event({**v, "from": "learned", "to": "token-aware"}, at=1.0, actor={})
    assert ev.to_state == "accepted" and ev.evidence["safe_direction"] is True
    assert ev.evidence["evaluation_passed"] is False
    # the other way, away from the heuristic toward a learned policy, the evaluation decides
    back = judge(decisions, build_router("learned", seed=9, params=BANDIT), build_router("token-aware"),
                 _req(min_ess=10_000), current_logged=False)
    assert back["passed"] is False and "safe_direction" not in back


def test_the_safe_direction_needs_no_readable_audit_trail() -> None:
    old, new = RoutingConfig(profile="learned"), RoutingConfig(profile="power-of-two")
    v = gate_routing_change(None, old, new, EvaluationRequirement(), current_logged=True, now=0.0)
    assert v["passed"] is True and v["safe_direction"] is True and v["decisions_read"] == 0
    assert "the audit trail cannot be read (no audit database)" in v["reason"]
    with pytest.raises(StoreError):
        gate_routing_change(None, RoutingConfig(profile="token-aware"), old, EvaluationRequirement(),
                            current_logged=False, now=0.0)
