"""The predicted-latency scorer's prefill interference: pure, no I/O, known values."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferlb.routing.learned import PredictedLatency, PredictedLatencyParams
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeView, RouteRequest
from tests.routing.table_predictor import TablePredictor


def _node(name: str, requests: int) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=100_000, max_concurrency=256,
                    inflight_requests=requests, inflight_tokens=500 * requests)


def _scorer(table: dict[str, tuple[float, float]], **params: object) -> PredictedLatency:
    s = PredictedLatency(PredictedLatencyParams.model_validate({"e2e_slo_s": 20.0, **params}))
    s.bind(TablePredictor(table))
    return s


def test_off_by_default_the_slack_is_the_requests_own() -> None:
    s = _scorer({"a": (0.5, 0.01)})
    s.score_all(RouteRequest("m", 1000, 11), [_node("a", 40)])
    # own e2e = 0.5 + 0.01 × 10 = 0.6 s of a 20 s budget
    assert s.last is not None and s.last.slack == [pytest.approx((20.0 - 0.6) / 20.0)]


def test_the_charge_is_gamma_times_predicted_ttft_times_requests_in_flight() -> None:
    s = _scorer({"a": (0.5, 0.01), "b": (0.1, 0.01)}, prefill_interference=0.2)
    s.score_all(RouteRequest("m", 1000, 11), [_node("a", 40), _node("b", 0)])
    assert s.last is not None
    # a: 0.6 + 0.2 × 0.5 × 40 = 4.6 s; b: nothing in flight, nobody stalled: 0.1 + 0.1 = 0.2 s
    assert s.last.slack == [pytest.approx((20.0 - 4.6) / 20.0), pytest.approx((20.0 - 0.2) / 20.0)]


def test_a_long_prompt_leaves_a_busy_slow_prefill_node_for_a_busy_fast_prefill_one() -> None:
    # Same decode speed; "slow" prefills this prompt in 0.4 s, "fast" in 0.1 s, and "fast" is
    # somewhat busier: greedy on own latency the TTFTs still decide, so both pick "fast"; the
    # point is the gap widens with the others stalled (40 × 0.3 s more on "slow").
    table = {"slow": (0.4, 0.010), "fast": (0.1, 0.010)}
    nodes = [_node("slow", 40), _node("fast", 60)]
    req = RouteRequest("m", 3000, 50)
    off, on = _scorer(table), _scorer(table, prefill_interference=0.1)
    a_off, b_off = off.score_all(req, nodes)
    a_on, b_on = on.score_all(req, nodes)
    assert (b_on - a_on) > (b_off - a_off) > 0


def test_it_moves_a_request_that_own_latency_alone_would_send_to_the_crowded_node() -> None:
    # "busy" answers this request a little sooner, but 100 requests wait on its prefill there
    table = {"busy": (0.20, 0.010), "idle": (0.25, 0.010)}
    nodes = [_node("busy", 100), _node("idle", 2)]
    req = RouteRequest("m", 2000, 20)
    a, b = _scorer(table).score_all(req, nodes)
    assert a > b
    a, b = _scorer(table, prefill_interference=0.05).score_all(req, nodes)
    assert b > a


@pytest.mark.parametrize("bad", [{"prefill_interference": -0.1}, {"prefill_interferance": 1.0}])
def test_params_reject_negative_and_misspelt(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PredictedLatencyParams.model_validate(bad)


def test_the_learned_profile_takes_the_param() -> None:
    r = build_router("learned", seed=1, params={"predicted-latency": {"prefill_interference": 1.0}})
    found = [s for s, _ in r.scorers if isinstance(s, PredictedLatency)]
    assert len(found) == 1 and found[0].p.prefill_interference == 1.0
