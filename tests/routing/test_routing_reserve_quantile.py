"""The tail reservation's adaptive cut (a quantile of recent output budgets) and the learned
profile's default params: pure, no I/O, known values."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferlb.routing.learned import RESERVE_MIN_SAMPLES, PredictedLatency, PredictedLatencyParams
from inferlb.routing.profiles import LEARNED_LATENCY, build_router
from inferlb.routing.quantile import WindowQuantile
from inferlb.routing.types import NodeView, RouteRequest
from tests.routing.table_predictor import TablePredictor

TABLE = {"fast": (0.1, 0.010), "slow": (0.1, 0.020)}


def _node(name: str, tokens: int, capacity: int = 10_000) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=capacity, max_concurrency=64,
                    inflight_requests=1 if tokens else 0, inflight_tokens=tokens)


def _scorer(**params: object) -> PredictedLatency:
    s = PredictedLatency(PredictedLatencyParams.model_validate({"e2e_slo_s": 20.0, **params}))
    s.bind(TablePredictor(TABLE))
    return s


def test_window_quantile_known_values_and_eviction() -> None:
    w = WindowQuantile(10)
    assert w.quantile(0.5) is None
    for x in (7, 3, 10, 1, 5, 9, 2, 8, 4, 6):
        w.add(x)
    assert len(w) == 10 and w.quantile(0.0) == 1 and w.quantile(0.5) == 6 and w.quantile(0.95) == 10
    w3 = WindowQuantile(3)
    for x in (5, 1, 9, 2):        # 5 leaves: the window is 1, 9, 2
        w3.add(x)
    assert len(w3) == 3 and w3.quantile(0.0) == 1 and w3.quantile(0.5) == 2 and w3.quantile(0.99) == 9
    with pytest.raises(ValueError):
        WindowQuantile(0)


def test_the_cut_is_the_fixed_one_until_enough_budgets_were_seen_then_their_quantile() -> None:
    s = _scorer(reserve=0.5, reserve_min_output=700, reserve_quantile=0.9, reserve_fast=0.1)
    nodes = [_node("fast", 9_000), _node("slow", 0)]
    for o in range(1, RESERVE_MIN_SAMPLES + 1):      # output budgets 1..100, one decision each
        assert s.reserve_cut() == 700
        s.score_all(RouteRequest("m", 10, o), nodes)
    # the 0.9-quantile of 1..100: the value at rank 90 of the sorted 100, i.e. 91
    assert s.reserve_cut() == 91
    s.score_all(RouteRequest("m", 10, 91), nodes)
    assert s.last is not None and s.last.reserve_cut == 91 and s.last.reserved is None   # long: not charged
    s.score_all(RouteRequest("m", 10, 90), nodes)
    # short (90 < the cut, now 91 still): (9,000 + 100 − 5,000) / 5,000 = 0.82 on the fast node
    assert s.last is not None and s.last.reserved == [pytest.approx(0.82), 0.0]


def test_a_request_is_not_its_own_reference_and_the_window_slides() -> None:
    s = _scorer(reserve=0.5, reserve_min_output=700, reserve_quantile=0.5, reserve_window=RESERVE_MIN_SAMPLES)
    nodes = [_node("fast", 0)]
    for _ in range(RESERVE_MIN_SAMPLES):
        s.score_all(RouteRequest("m", 10, 10), nodes)
    s.score_all(RouteRequest("m", 10, 5_000), nodes)
    assert s.last is not None and s.last.reserve_cut == 10       # read before 5,000 joined the window
    for _ in range(RESERVE_MIN_SAMPLES):                          # the 10s slide out
        s.score_all(RouteRequest("m", 10, 300), nodes)
    assert s.reserve_cut() == 300


def test_no_window_without_a_reservation_or_a_quantile() -> None:
    s = _scorer(reserve_quantile=0.9)                              # reserve 0: nothing tracked
    s.score_all(RouteRequest("m", 10, 10), [_node("fast", 0)])
    assert s.last is not None and s.last.reserved is None and s.last.reserve_cut is None
    assert _scorer(reserve=0.5, reserve_min_output=321).reserve_cut() == 321


@pytest.mark.parametrize("bad", [{"reserve_quantile": 0}, {"reserve_quantile": 1}, {"reserve_window": 0},
                                 {"reserve_quantile": "high"}])
def test_params_reject_out_of_range(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PredictedLatencyParams.model_validate(bad)


# The setting docs/benchmarks.md ("an adaptive tail reservation") measured, with the reserve itself
# off as the learned profile ships it since issue 22 item 4 ("The tail reservation off").
ADAPTIVE = {"reserve": 0.0, "reserve_quantile": 0.985, "reserve_window": 4096, "reserve_min_output": 800,
            "reserve_fast": 0.1, "interference": 1.25, "interference_max_output": 64, "prefill_interference": 1.0}


def _pl(r: object) -> PredictedLatency:
    found = [s for s, _ in r.scorers if isinstance(s, PredictedLatency)]   # type: ignore[attr-defined]
    assert len(found) == 1
    return found[0]


def test_the_learned_profile_ships_the_adaptive_params_and_a_callers_keys_override_them() -> None:
    assert LEARNED_LATENCY == ADAPTIVE
    shipped = _pl(build_router("learned", seed=1)).p
    assert shipped.model_dump(include=set(ADAPTIVE)) == ADAPTIVE
    mine = _pl(build_router("learned", seed=1, params={"predicted-latency": {"reserve_quantile": None}})).p
    assert mine.reserve_quantile is None and mine.reserve == 0.0 and mine.interference == 1.25
    on = _pl(build_router("learned", seed=1, params={"predicted-latency": {"reserve": 0.9}}))
    assert on.p.reserve == 0.9 and on.p.reserve_quantile == 0.985 and on._lengths is not None
    off = _pl(build_router("learned", seed=1, params={"predicted-latency": {"reserve": 0.0}}))
    assert off._lengths is None and off.cut_rule is None
    # the scorer's own defaults (any other profile that uses it) stay off
    bare = PredictedLatency().p
    assert bare.reserve == 0.0 and bare.reserve_quantile is None and bare.interference == 0.0
