"""The predicted-latency scorer's SLO-miss charge: pure, no I/O, known values."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferlb.routing.learned import PredictedLatency, PredictedLatencyParams
from inferlb.routing.types import NodeView, RouteRequest
from tests.routing.table_predictor import TablePredictor


def _node(name: str) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=100_000, max_concurrency=256)


def _scorer(table: dict[str, tuple[float, float]], **params: object) -> PredictedLatency:
    s = PredictedLatency(PredictedLatencyParams.model_validate({"e2e_slo_s": 30.0, **params}))
    s.bind(TablePredictor(table))
    return s


# own e2e = TTFT + TPOT × 100: "a" 0.5 + 18 = 18.5 s (meets 20 s), "b" 0.5 + 22 = 22.5 s (misses)
TABLE = {"a": (0.5, 0.18), "b": (0.5, 0.22)}
REQ = RouteRequest("m", 1000, 101)


def test_off_by_default() -> None:
    s = _scorer(TABLE)
    s.score_all(REQ, [_node("a"), _node("b")])
    assert s.last is not None
    assert s.last.slack == [pytest.approx((30 - 18.5) / 30), pytest.approx((30 - 22.5) / 30)]


def test_the_charge_is_the_weight_where_the_predicted_e2e_misses_the_budget() -> None:
    s = _scorer(TABLE, miss_weight=0.25, miss_e2e_s=20.0)
    s.score_all(REQ, [_node("a"), _node("b")])
    assert s.last is not None
    assert s.last.slack == [pytest.approx((30 - 18.5) / 30), pytest.approx((30 - 22.5) / 30 - 0.25)]


def test_without_a_miss_budget_the_slack_budget_is_the_slo() -> None:
    s = _scorer(TABLE, miss_weight=0.25, e2e_slo_s=20.0)
    s.score_all(REQ, [_node("a"), _node("b")])
    assert s.last is not None
    assert s.last.slack == [pytest.approx((20 - 18.5) / 20), pytest.approx((20 - 22.5) / 20 - 0.25)]


def test_a_deadline_is_the_requests_own_e2e_slo() -> None:
    s = _scorer(TABLE, miss_weight=0.25, miss_e2e_s=20.0)
    s.score_all(RouteRequest("m", 1000, 101, deadline_s=25.0), [_node("a"), _node("b")])
    assert s.last is not None   # both meet 25 s: no charge (the slack's budget is the deadline too)
    assert s.last.slack == [pytest.approx((25 - 18.5) / 25), pytest.approx((25 - 22.5) / 25)]


def test_a_streams_ttft_past_its_budget_is_a_miss_and_only_for_streams() -> None:
    table = {"a": (0.5, 0.01), "b": (2.5, 0.01)}
    s = _scorer(table, miss_weight=0.25, miss_ttft_s=2.0, ttft_slo_s=4.0)
    s.score_all(RouteRequest("m", 1000, 101, stream=True), [_node("a"), _node("b")])
    assert s.last is not None
    assert s.last.slack == [pytest.approx((4 - 0.5) / 4), pytest.approx((4 - 2.5) / 4 - 0.25)]
    s.score_all(RouteRequest("m", 1000, 101, stream=False), [_node("a"), _node("b")])
    assert s.last is not None
    assert s.last.slack == [pytest.approx((30 - 1.5) / 30), pytest.approx((30 - 3.5) / 30)]


def test_it_moves_a_request_to_the_node_where_it_meets_its_slo() -> None:
    # "b" is predicted a little faster, but past the SLO on its TTFT; "a" meets both
    table = {"a": (1.9, 0.010), "b": (2.1, 0.008)}
    req = RouteRequest("m", 1000, 1001, stream=True)
    a, b = _scorer(table, ttft_slo_s=20.0).score_all(req, [_node("a"), _node("b")])
    assert b > a
    a, b = _scorer(table, ttft_slo_s=20.0, miss_weight=0.25, miss_ttft_s=2.0).score_all(req, [_node("a"), _node("b")])
    assert a > b


@pytest.mark.parametrize("bad", [{"miss_weight": -0.1}, {"miss_e2e_s": 0.0}, {"miss_ttft_s": -1.0},
                                 {"miss_wieght": 1.0}])
def test_params_reject_negative_zero_budgets_and_misspelt(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PredictedLatencyParams.model_validate(bad)
