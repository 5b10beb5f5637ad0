"""The predicted-latency scorer's interference term: pure, no I/O, known values; and what the audit
record keeps of it per candidate (routing/explain.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import ValidationError

from inferlb.routing.learned import PredictedLatency, PredictedLatencyParams
from inferlb.routing.lifecycle import LifecycleParams, PredictorLifecycle
from inferlb.routing.predictor import Observed, OnlineLinear, Prediction
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeView, RouteRequest


class FixedPredictor:
    """Every node: TTFT 0.1 s, TPOT 0.02 s; ``elasticity`` for the learned-response path."""

    version = 1

    def __init__(self, elasticity: float | None = None, raises: bool = False) -> None:
        self.e = elasticity
        self.raises = raises

    def predict_nodes(self, req: RouteRequest, nodes: Sequence[NodeView]) -> list[tuple[float, float]]:
        return [(0.1, 0.02) for _ in nodes]

    def predict(self, row: Sequence[float]) -> Prediction:
        return Prediction(0.1, 0.02)

    def update(self, row: Sequence[float], observed: Observed) -> None:
        """Fixed: it learns nothing."""

    def tpot_elasticity(self, node: NodeView) -> float:
        if self.raises:
            raise RuntimeError("no")
        return self.e if self.e is not None else math.nan


def _node(name: str, tokens: int, requests: int) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=100_000, max_concurrency=64,
                    inflight_requests=requests, inflight_tokens=tokens)


def _scorer(predictor: object, **params: object) -> PredictedLatency:
    s = PredictedLatency(PredictedLatencyParams.model_validate(params))
    s.bind(predictor)
    return s


def test_off_by_default_scores_own_latency_only() -> None:
    req = RouteRequest("m", 100, 900)
    nodes = [_node("idle", 0, 0), _node("busy", 50_000, 40)]
    s = _scorer(FixedPredictor())
    assert s.score_all(req, nodes) == [s.score_all(req, nodes)[0]] * 2   # same predictions: same score
    assert s.last is not None and s.last.others_s is None


def test_the_term_is_the_predicted_slowdown_of_the_others() -> None:
    req = RouteRequest("m", 100, 900)              # d = 1,000 tokens, o = 900
    busy = _node("busy", 9_000, 10)                # T = 9,000, n = 10
    s = _scorer(FixedPredictor(), interference=1.0, elasticity=0.5, e2e_slo_s=60.0)
    scores = s.score_all(req, [_node("idle", 0, 0), busy])
    assert s.last is not None and s.last.others_s is not None
    # τ · e · d / (T + d) × min(n · o, T) = 0.02 · 0.5 · 1000 / 10000 × min(9000, 9000)
    expected = 0.02 * 0.5 * 1000 / 10_000 * 9_000
    assert s.last.others_s == [0.0, pytest.approx(expected)]
    own = 0.1 + 0.02 * 899
    assert s.last.slack[1] == pytest.approx((60.0 - own - expected) / 60.0)
    assert scores[0] > scores[1]


def test_short_requests_only_when_size_aware() -> None:
    busy = [_node("busy", 9_000, 10)]
    s = _scorer(FixedPredictor(), interference=1.0, interference_max_output=64)
    s.score_all(RouteRequest("m", 100, 900), busy)
    assert s.last is not None and s.last.others_s is None          # long: judged on its own latency
    s.score_all(RouteRequest("m", 100, 32), busy)
    assert s.last is not None and s.last.others_s is not None and s.last.others_s[0] > 0


@pytest.mark.parametrize(("learned", "raises", "charged"), [(0.4, False, True), (-0.3, False, False),
                                                            (None, False, False), (0.4, True, False)])
def test_learned_elasticity_is_floored_at_zero_and_never_raises(learned: float | None, raises: bool,
                                                                charged: bool) -> None:
    s = _scorer(FixedPredictor(learned, raises), interference=1.0, elasticity=None)
    s.score_all(RouteRequest("m", 100, 500), [_node("busy", 9_000, 10)])
    assert s.last is not None and s.last.others_s is not None
    assert (s.last.others_s[0] > 0) is charged


def test_online_linear_reports_its_learned_load_response() -> None:
    m = OnlineLinear()
    assert m.tpot_elasticity(_node("n", 5_000, 5)) == 0.0       # the prior: no load term
    w = m.w.copy()
    from inferlb.routing.features import FEATURE_NAMES
    w[FEATURE_NAMES.index("log_inflight_ktokens"), 1] = 0.6
    m._set_weights(w)
    assert m.tpot_elasticity(_node("n", 5_000, 5)) == pytest.approx(0.6 * 5_000 / 6_000)


def test_params_reject_unknown_keys_and_negative_weights() -> None:
    with pytest.raises(ValidationError):
        PredictedLatencyParams.model_validate({"interference": -1})
    with pytest.raises(ValidationError):
        PredictedLatencyParams.model_validate({"interferance": 1})


# The learned profile's shipped terms off (profiles.LEARNED_LATENCY), so each test turns on its own.
TERMS_OFF = {"reserve": 0.0, "interference": 0.0, "interference_max_output": None, "prefill_interference": 0.0}


def _guarded(**params: object) -> Any:
    lc = PredictorLifecycle(LifecycleParams(min_samples=0), model=FixedPredictor())   # active at once
    return build_router("learned", seed=1, sample=0, lifecycle=lc,
                        params={"predicted-latency": {**TERMS_OFF, **params},
                                "softmax-bandit": {"epsilon": 0.0}})


def test_the_audit_keeps_each_candidates_interference_and_slack_bounded() -> None:
    router = _guarded(interference=1.0, elasticity=0.5, e2e_slo_s=60.0)
    busy = _node("busy", 9_000, 10)
    others = [_node(f"n{i:02d}", 100 * i, i) for i in range(1, 30)]        # 31 candidates: the log keeps 16
    d = router.decide(RouteRequest("m", 100, 900), [_node("idle", 0, 0), busy, *others])
    lj = json.loads(json.dumps(d.to_json()))["learned"]                     # what GET /audit/requests/{id} shows
    ctx = lj["ctx"]
    assert lj["interference"] == {"weight": 1.0, "charged": True} and lj["ctx_total"] == 31
    assert all(len(ctx[k]) == 16 for k in ("node", "slack_permille", "others_us"))
    assert "reserved_permille" not in ctx                                    # tail reservation off
    row = {k: dict(zip(ctx["node"], ctx[k], strict=True)) for k in ("slack_permille", "others_us")}
    scorer = router.scorers[0][0]
    names = [n.name for n in scorer.last.nodes]
    for name in ctx["node"]:                                                 # the scorer's own values
        i = names.index(name)
        assert row["others_us"][name] == int(scorer.last.others_s[i] * 1e6)
        assert row["slack_permille"][name] == int(scorer.last.slack[i] * 1000)
    pick = lj["pick"]
    assert pick["node"] == "idle" and pick["others_s"] == 0.0                # nothing in flight there
    # a pick with something in flight: its share is named in the pick and the sentence
    d2 = router.decide(RouteRequest("m", 100, 900), [busy])
    lj2 = d2.to_json()["learned"]
    expected = 0.02 * 0.5 * 1000 / 10_000 * 9_000
    assert lj2["pick"]["others_s"] == pytest.approx(expected, rel=1e-6)
    assert lj2["ctx"]["others_us"] == [int(expected * 1e6)]
    assert "slowing the requests in flight there by 9.000 s" in lj2["why"] and "weight 1" in lj2["why"]


def test_interference_columns_only_when_charged() -> None:
    off = _guarded().decide(RouteRequest("m", 100, 900), [_node("a", 9_000, 10)]).to_json()["learned"]
    assert "interference" not in off and "others_us" not in off["ctx"] and "others_s" not in off["pick"]
    assert off["ctx"]["slack_permille"] == [int(off["pick"]["slack"] * 1000)]
    sized = _guarded(interference=1.0, interference_max_output=64)           # size-aware: a long request
    lj = sized.decide(RouteRequest("m", 100, 900), [_node("a", 9_000, 10)]).to_json()["learned"]
    assert lj["interference"] == {"weight": 1.0, "charged": False} and "others_us" not in lj["ctx"]
    reserve = _guarded(reserve=0.2).decide(RouteRequest("m", 100, 10), [_node("a", 95_000, 10)]).to_json()
    assert reserve["learned"]["ctx"]["reserved_permille"][0] > 0 and reserve["learned"]["pick"]["reserved"] > 0
