"""The planner: demand → replicas per pool, cheapest per token first, min/max, stabilisation, cost cap."""

from __future__ import annotations

from typing import Any

from inferlb.autoscale.capacity import Capacity, NodeBucket, learn_capacity
from inferlb.autoscale.forecast import Forecast
from inferlb.autoscale.planner import PlannerState, plan
from inferlb.autoscale.policy import Autoscaler, LoadHistory
from inferlb.config.autoscale import AutoscaleConfig


def cfg(**over: Any) -> AutoscaleConfig:
    base: dict[str, Any] = {
        "interval_s": 60, "step_s": 60, "target_utilisation": 0.5, "scale_down_stabilisation_s": 300,
        "pools": [{"model": "m", "gpu": "h100", "min": 1, "max": 4, "cold_start_s": 120, "price_per_hour": 4.0},
                  {"model": "m", "gpu": "l4", "min": 0, "max": 10, "cold_start_s": 60, "price_per_hour": 0.8}]}
    base.update(over)
    return AutoscaleConfig.model_validate(base)


CAP = {("m", "h100"): Capacity("m", "h100", 1000.0, "prior", ""), ("m", "l4"): Capacity("m", "l4", 250.0, "prior", "")}


def run(c: AutoscaleConfig, demand: list[float], current: dict[tuple[str, str], int], *, now: float = 0.0,
        observed: float = 0.0, state: PlannerState | None = None, cap: dict[Any, Capacity] | None = None
        ) -> tuple[dict[tuple[str, str], int], Any, PlannerState]:
    p, st = plan(c, now=now, forecasts={"m": Forecast(tuple(demand), "test")}, observed={"m": observed},
                 capacity=cap or CAP, current=current, step_s=c.step_s, state=state)
    return p.desired(), p, st


def test_fills_the_cheapest_pool_per_token_first_after_min() -> None:
    # l4 costs 0.8/250 = 0.0032 per token/s·h, h100 4/1000 = 0.004: l4 first.
    desired, p, _ = run(cfg(), [1000.0] * 5, {("m", "h100"): 1, ("m", "l4"): 0})
    # needed 1000 / 0.5 = 2000; h100 min 1 gives 1000; the other 1000 on l4 = 4 replicas
    assert desired == {("m", "h100"): 1, ("m", "l4"): 4}
    assert p.cost_per_hour == 4.0 + 4 * 0.8


def test_provisions_for_the_peak_within_cold_start_plus_one_round() -> None:
    # lead = 120 s cold start + 60 s interval = 3 steps; a spike at step 3 is included, step 5 is not
    c = cfg(pools=[{"model": "m", "gpu": "h100", "min": 0, "max": 9, "cold_start_s": 120, "price_per_hour": 4.0}])
    desired, _, _ = run(c, [100, 100, 2000, 100, 9000], {("m", "h100"): 1}, cap={("m", "h100"): CAP[("m", "h100")]})
    assert desired == {("m", "h100"): 4}     # 2000 / 0.5 / 1000


def test_never_below_min_nor_above_max_and_short_is_said() -> None:
    desired, p, _ = run(cfg(), [0.0] * 5, {("m", "h100"): 3, ("m", "l4"): 2}, now=0.0,
                        state=PlannerState())
    assert desired[("m", "h100")] >= 1
    huge, p2, _ = run(cfg(), [1e6] * 5, {("m", "h100"): 1, ("m", "l4"): 0})
    assert huge == {("m", "h100"): 4, ("m", "l4"): 10}
    assert any("short" in n for n in p2.notes)


def test_observed_load_is_a_floor_under_the_forecast() -> None:
    desired, _, _ = run(cfg(), [0.0] * 5, {("m", "h100"): 1, ("m", "l4"): 0}, observed=1000.0)
    assert desired == {("m", "h100"): 1, ("m", "l4"): 4}


def test_scale_down_waits_for_the_stabilisation_window_scale_up_does_not() -> None:
    c = cfg()
    cur = {("m", "h100"): 1, ("m", "l4"): 4}
    d1, _, st = run(c, [1000.0] * 5, cur, now=0.0)
    assert d1 == cur
    d2, p2, st = run(c, [100.0] * 5, cur, now=60.0, state=st)     # load dropped: held
    assert d2 == cur and "held" in p2.pools[1].reason
    d3, _, st = run(c, [100.0] * 5, cur, now=299.0, state=st)     # still inside the 300 s window
    assert d3 == cur
    d4, _, st = run(c, [100.0] * 5, cur, now=301.0, state=st)     # the 1000 recommendation aged out
    assert d4 == {("m", "h100"): 1, ("m", "l4"): 0}
    d5, _, _ = run(c, [3000.0] * 5, d4, now=302.0, state=st)     # up at once
    assert d5 == {("m", "h100"): 4, ("m", "l4"): 10}   # 6000 needed: l4 full (2500), h100 1 + 3


def test_cost_cap_cuts_the_dearest_per_token_first_but_never_min() -> None:
    c = cfg(cost_cap_per_hour=6.0)
    desired, p, _ = run(c, [2500.0] * 5, {("m", "h100"): 1, ("m", "l4"): 0})
    assert p.cost_per_hour <= 6.0 and desired[("m", "h100")] >= 1
    assert any("capped" in d.reason for d in p.pools)
    tight = cfg(cost_cap_per_hour=1.0)
    desired, p, _ = run(tight, [0.0] * 5, {("m", "h100"): 1, ("m", "l4"): 0})
    assert desired[("m", "h100")] == 1 and any("min wins" in n for n in p.notes)


def test_unknown_capacity_keeps_the_pool_and_says_why() -> None:
    cap = {("m", "h100"): Capacity("m", "h100", None, "unknown", ""), ("m", "l4"): CAP[("m", "l4")]}
    desired, p, _ = run(cfg(), [500.0] * 5, {("m", "h100"): 2, ("m", "l4"): 0}, cap=cap)
    assert desired[("m", "h100")] == 2 and "capacity unknown" in p.pools[0].reason
    assert desired[("m", "l4")] == 4   # 1000 needed on l4 alone (h100's min is not counted as known)


def test_capacity_is_learned_where_the_slo_broke_under_saturation() -> None:
    def b(tokens: int, in_slo: int, node: str = "a", queued: int = 0) -> NodeBucket:
        return NodeBucket("m", "l4", node, 60.0, tokens, 100, in_slo, queued=queued)

    rows = [b(6000, 100), b(12000, 100), b(18000, 100), b(24000, 90, queued=30), b(3000, 50, "sick")]
    got = learn_capacity(rows, {("m", "l4"): 1000.0})[("m", "l4")]
    assert got.source == "learned" and got.tokens_per_s == 300.0   # held at 18000/60, broke queued at 400
    assert "1 SLO break(s) without saturation ignored" in got.detail   # the sick node's
    never = learn_capacity(rows[:3], {("m", "l4"): 1000.0})[("m", "l4")]
    assert never.source == "prior" and never.tokens_per_s == 1000.0
    lower = learn_capacity(rows[:3], {})[("m", "l4")]
    assert lower.source == "lower-bound" and lower.tokens_per_s == 300.0
    unknown = learn_capacity([], {("m", "x"): None})[("m", "x")]
    assert unknown.tokens_per_s is None and unknown.source == "unknown"


def test_autoscaler_facade_observe_forecast_plan() -> None:
    c = cfg(season_s=60 * 48, forecaster="seasonal-naive")
    scaler = Autoscaler(c)
    short = LoadHistory(step_s=60, end=0.0, tokens={"m": [800.0] * 10})
    scaler.observe(short)
    fc = scaler.forecast()
    assert fc["m"].method == "reactive" and fc["m"].fallback is not None
    p = scaler.plan(now=0.0, current={("m", "h100"): 1, ("m", "l4"): 0}, capacity=CAP)
    assert p.desired() == {("m", "h100"): 1, ("m", "l4"): 3}   # 800/0.5 = 1600 = 1000 + 3 × 250 (rounded up)


def test_an_under_loaded_node_missing_its_slo_keeps_the_prior_a_saturated_one_updates_it() -> None:
    """Issue 22, item 7: capacity is learned only from saturation signals (queue waiting, KV-cache
    use, in-flight at the limit), never lowered by the SLO misses of an under-loaded node."""
    prior = {("m", "l4"): 500.0}

    def b(tokens: int, in_slo: int, **signals: float | int | None) -> NodeBucket:
        return NodeBucket("m", "l4", "a", 60.0, tokens, 100, in_slo, **signals)  # type: ignore[arg-type]

    held = [b(6000, 100), b(9000, 100)]                        # 100 and 150 tokens/s, SLO held
    # 120 tokens/s, SLO at 60 %, but nothing queued, KV at 30 %, 2 of 8 in flight: under-loaded
    idle_misses = [b(7200, 60, queued=0, kv_peak=0.3, inflight_peak=2, inflight_limit=8)]
    kept = learn_capacity(held + idle_misses, prior)[("m", "l4")]
    assert (kept.source, kept.tokens_per_s) == ("prior", 500.0)
    assert "1 SLO break(s) without saturation ignored" in kept.detail
    # the same misses at the same rate on a saturated node, by each signal alone: learned 150
    for signal in ({"queued": 20}, {"kv_peak": 0.97}, {"inflight_peak": 8, "inflight_limit": 8}):
        sat = learn_capacity([*held, b(12000, 60, **signal)], prior)[("m", "l4")]
        assert (sat.source, sat.tokens_per_s) == ("learned", 150.0), signal
    # saturated with no held bucket below it: what it served within the SLO (200 × 0.6)
    only = learn_capacity([b(12000, 60, queued=50)], prior)[("m", "l4")]
    assert (only.source, only.tokens_per_s) == ("learned", 120.0)
    # a queue of one request in a hundred is not saturation (QUEUED_SHARE is 5 %)
    assert not b(12000, 60, queued=1).saturated and b(12000, 60, queued=5).saturated


def test_burst_path_scales_up_in_the_round_the_jump_is_seen() -> None:
    """Issue 22, item 7: rounds every 60 s of a fake clock over 300 s steps; the load jumps ×4 at
    t = 120 s, mid-step. The forecast (reactive: the last closed step) still says 500 tokens/s,
    but the round at 120 s sizes for the jump; with the burst path off, nothing moves until the
    step closes at 300 s."""
    c = cfg(step_s=300, pools=[{"model": "m", "gpu": "l4", "min": 1, "max": 40, "cold_start_s": 300,
                                "price_per_hour": 0.8}], forecaster="reactive")
    cap = {("m", "l4"): Capacity("m", "l4", 250.0, "prior", "")}
    for factor, jump_round in ((1.0, 120.0), (None, 300.0)):
        scaler = Autoscaler(c.model_copy(update={"burst_factor": factor}))
        replicas = 4                                     # 500 / 0.5 / 250: the steady fleet
        series = [500.0] * 12
        moved_at = None
        for now in (0.0, 60.0, 120.0, 180.0, 240.0, 300.0):
            recent = 500.0 if now < 120 else 2000.0      # tokens/s of this round alone
            if now == 300.0:
                series.append((2 * 500.0 + 3 * 2000.0) / 5)   # the step that closed at 300 s
            scaler.observe(LoadHistory(300.0, now, {"m": series}, recent={"m": recent}))
            scaler.forecast()
            p = scaler.plan(now=now, current={("m", "l4"): replicas}, capacity=cap)
            d = p.pools[0]
            if d.desired > replicas and moved_at is None:
                moved_at = now
                assert d.burst is (factor is not None)
                if factor is not None:
                    assert d.desired == 16 and "burst" in d.reason   # 2000 / 0.5 / 250, at once
            replicas = max(replicas, d.desired)
        assert moved_at == jump_round


def test_burst_path_ignores_load_the_replicas_in_place_serve() -> None:
    c = cfg(pools=[{"model": "m", "gpu": "l4", "min": 1, "max": 40, "cold_start_s": 60, "price_per_hour": 0.8}])
    cap = {("m", "l4"): Capacity("m", "l4", 250.0, "prior", "")}
    # 4 replicas serve 1000 tokens/s; a round at 900 is no burst: the forecast's 500 decides
    p, _ = plan(c, now=0.0, forecasts={"m": Forecast((500.0,) * 3, "test")}, observed={"m": 500.0}, capacity=cap,
                current={("m", "l4"): 4}, step_s=60, recent={"m": 900.0})
    assert p.pools[0].desired == 4 and not p.pools[0].burst


def test_pools_are_sized_from_the_demand_the_router_sends_each() -> None:
    """Issue 22, item 7: the router sends 10 % of the model's tokens to h100 and 90 % to l4; each
    pool is sized for its share, not for the model's whole demand (nor cheapest-first)."""
    c = cfg(pools=[{"model": "m", "gpu": "h100", "min": 0, "max": 20, "cold_start_s": 60, "price_per_hour": 4.0},
                   {"model": "m", "gpu": "l4", "min": 0, "max": 40, "cold_start_s": 60, "price_per_hour": 0.8}])
    fc = {"m": Forecast((5000.0,) * 3, "test")}
    routed = {("m", "h100"): 300.0, ("m", "l4"): 2700.0}      # tokens/s each pool served lately
    p, _ = plan(c, now=0.0, forecasts=fc, observed={"m": 5000.0}, capacity=CAP, current={}, step_s=60,
                routed=routed)
    by = {d.gpu: d for d in p.pools}
    # needed 5000 / 0.5 = 10000: h100 10 % → 1000 → 1 replica of 1000; l4 90 % → 9000 → 36 of 250
    assert (by["h100"].desired, by["l4"].desired) == (1, 36)
    assert by["h100"].share == 0.1 and "routed share 10.0 %" in by["h100"].reason
    # the same demand without routed traffic: cheapest-first puts it all on l4 (40 × 250 = 10000)
    q, _ = plan(c, now=0.0, forecasts=fc, observed={"m": 5000.0}, capacity=CAP, current={}, step_s=60)
    assert {d.gpu: d.desired for d in q.pools} == {"h100": 0, "l4": 40} and q.pools[0].share is None
    # a share that needs more than the pool's max is said short
    r, _ = plan(c, now=0.0, forecasts={"m": Forecast((6000.0,) * 3, "test")}, observed={"m": 6000.0},
                capacity=CAP, current={}, step_s=60, routed={("m", "h100"): 0.0, ("m", "l4"): 1.0})
    assert {d.gpu: d.desired for d in r.pools} == {"h100": 0, "l4": 40}   # h100 gets no share: min 0
    assert r.notes == ("m: short by 2,000 tokens/s with every pool at max",)
