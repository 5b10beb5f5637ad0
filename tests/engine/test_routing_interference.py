"""The predicted-latency scorer's interference term: pure, no I/O, known values."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from inferlb.engine.routing import NodeView, RouteRequest
from inferlb.engine.routing.learned import PredictedLatency, PredictedLatencyParams
from inferlb.engine.routing.predictor import OnlineLinear


class FixedPredictor:
    """Every node: TTFT 0.1 s, TPOT 0.02 s; ``elasticity`` for the learned-response path."""

    version = 1

    def __init__(self, elasticity: float | None = None, raises: bool = False) -> None:
        self.e = elasticity
        self.raises = raises

    def predict_nodes(self, req: RouteRequest, nodes: list[NodeView]) -> list[tuple[float, float]]:
        return [(0.1, 0.02) for _ in nodes]

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
    from inferlb.engine.routing.features import FEATURE_NAMES
    w[FEATURE_NAMES.index("log_inflight_ktokens"), 1] = 0.6
    m._set_weights(w)
    assert m.tpot_elasticity(_node("n", 5_000, 5)) == pytest.approx(0.6 * 5_000 / 6_000)


def test_params_reject_unknown_keys_and_negative_weights() -> None:
    with pytest.raises(ValidationError):
        PredictedLatencyParams.model_validate({"interference": -1})
    with pytest.raises(ValidationError):
        PredictedLatencyParams.model_validate({"interferance": 1})
