"""The predicted-latency scorer's tail reservation: pure, no I/O, known values."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferlb.routing.learned import PredictedLatency, PredictedLatencyParams
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeView, RouteRequest
from tests.routing.table_predictor import TablePredictor


def _node(name: str, tokens: int, capacity: int = 10_000) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=capacity, max_concurrency=64,
                    inflight_requests=1 if tokens else 0, inflight_tokens=tokens)


def _scorer(table: dict[str, tuple[float, float]], **params: object) -> PredictedLatency:
    s = PredictedLatency(PredictedLatencyParams.model_validate({"e2e_slo_s": 20.0, **params}))
    s.bind(TablePredictor(table))
    return s


# fast: TPOT 0.010; fast2 within 10 % of it (0.0105); slow: 0.020 (not fast)
TABLE = {"fast": (0.1, 0.010), "fast2": (0.1, 0.0105), "slow": (0.1, 0.020)}


def test_off_by_default_charges_nothing() -> None:
    s = _scorer(TABLE)
    s.score_all(RouteRequest("m", 100, 10), [_node("fast", 9_000), _node("slow", 0)])
    assert s.last is not None and s.last.reserved is None


def test_short_request_is_charged_in_proportion_to_its_reach_into_a_fast_nodes_reserve() -> None:
    # reserve 0.5 of 10,000 tokens: the top 5,000 are held. The request has d = 1,000 tokens.
    s = _scorer(TABLE, reserve=0.5, reserve_min_output=700, reserve_fast=0.1, reserve_weight=1.0)
    nodes = [_node("fast", 0), _node("fast2", 5_000), _node("slow", 9_500)]
    base = _scorer(TABLE)
    req = RouteRequest("m", 900, 100)
    plain = base.score_all(req, nodes)
    s.score_all(req, nodes)
    assert s.last is not None and s.last.reserved is not None
    # fast: 0 + 1,000 ≤ 5,000: below the reserve; fast2: (5,000 + 1,000 − 5,000) / 5,000 = 0.2;
    # slow: not a fast node (0.020 > 1.1 × 0.010), never charged however full
    assert s.last.reserved == [0.0, pytest.approx(0.2), 0.0]
    assert base.last is not None and s.last.slack[1] == pytest.approx(base.last.slack[1] - 0.2)
    assert s.last.scores[0] == plain[0] and s.last.scores[2] == plain[2]


def test_the_charge_is_capped_at_the_weight_and_long_requests_are_never_charged() -> None:
    s = _scorer(TABLE, reserve=0.5, reserve_min_output=700, reserve_weight=0.4)
    nodes = [_node("fast", 9_900), _node("slow", 0)]
    s.score_all(RouteRequest("m", 900, 100), nodes)
    assert s.last is not None and s.last.reserved == [pytest.approx(0.4), 0.0]
    s.score_all(RouteRequest("m", 300, 700), nodes)    # output budget ≥ reserve_min_output: long
    assert s.last is not None and s.last.reserved is None


def test_short_work_leaves_a_full_fast_node_for_a_slower_one_with_slack_long_work_keeps_it() -> None:
    table = {"fast": (0.05, 0.010), "slow": (0.05, 0.020)}
    nodes = [_node("fast", 8_000), _node("slow", 0)]
    short, long_ = RouteRequest("m", 400, 50), RouteRequest("m", 400, 900)
    off, on = _scorer(table), _scorer(table, reserve=0.5, reserve_min_output=700)
    a, b = off.score_all(short, nodes)
    assert a > b                                   # greedy: the fast node, even near full
    a, b = on.score_all(short, nodes)
    assert b > a                                   # reserved: the short request goes to the slow node
    a, b = on.score_all(long_, nodes)
    assert a > b                                   # the long one takes the fast node's reserve


def test_zero_capacity_node_is_not_charged() -> None:
    s = _scorer({"fast": (0.1, 0.01)}, reserve=0.5)
    s.score_all(RouteRequest("m", 10, 10), [_node("fast", 0, capacity=0)])
    assert s.last is not None and s.last.reserved == [0.0]


@pytest.mark.parametrize("bad", [{"reserve": 1.0}, {"reserve": -0.1}, {"reserve_min_output": 0},
                                 {"reserve_fast": -1}, {"reserve_weight": -1}, {"reserve_size": 3}])
def test_params_reject_out_of_range_and_unknown_keys(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PredictedLatencyParams.model_validate(bad)


def test_the_learned_profile_takes_the_params() -> None:
    r = build_router("learned", seed=1, params={"predicted-latency": {"reserve": 0.7, "reserve_min_output": 700}})
    found = [s for s, _ in r.scorers if isinstance(s, PredictedLatency)]
    assert len(found) == 1 and found[0].p.reserve == 0.7 and found[0].p.reserve_min_output == 700
