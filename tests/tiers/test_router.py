"""The tier router (tiers/router.py) on an injected clock: the walk over the tiers, the audit entry,
the feedback from request ends (errors, SLO misses, what is not counted), the guard moving traffic
to the stronger tier and back, the learned model taking over only when ready, and a reload."""

from __future__ import annotations

import random
from typing import Any

from inferlb.config.settings import SLOConfig
from inferlb.config.tiers import TierPolicy
from inferlb.store.records import RequestRecord
from inferlb.tiers.router import TierRouter
from inferlb.types import ManualClock

POLICY = TierPolicy.model_validate({
    "models": [{"model": "s", "max_score": 0.2}, {"model": "m", "max_score": 0.5}, {"model": "l"}],
    "guard": {"min_requests": 10, "window_s": 60, "cooldown_s": 30, "probe_share": 0.0, "max_error_rate": 0.1}})
SLOS = [SLOConfig(model="auto", e2e_max_s=2.0)]
EASY: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
MID: dict[str, Any] = {"messages": [{"role": "user", "content": "```x```"}], "tools": [{"type": "function"}]}
HARD: dict[str, Any] = {"messages": [{"role": "user", "content": "prove the theorem, the integral ```x```"}],
                        "tools": [{}], "response_format": {"type": "json_schema"}}


def choose(r: TierRouter, body: dict[str, Any], rid: str = "r", policy: TierPolicy = POLICY, **kw: Any) -> Any:
    return r.choose("auto", policy, body, prompt_tokens=10, max_tokens=None, request_id=rid, slos=SLOS, **kw)


def ended(r: TierRouter, choice: Any, clock: ManualClock, *, status: str = "ok", e2e: float = 0.5,
          rid: str = "r") -> None:
    t0 = clock.time()
    rec = RequestRecord(request_id=rid, received_at=t0, endpoint="chat", model_requested="auto", status=status,
                        last_byte_at=t0 + e2e, tags={"tier": choice.to_json()}, cost_est=0.01)
    r.observe(rec)


def test_the_walk_picks_the_first_tier_whose_threshold_holds() -> None:
    r = TierRouter(ManualClock())
    easy, mid, hard = choose(r, EASY), choose(r, MID), choose(r, HARD)
    assert (easy.model, mid.model, hard.model) == ("s", "m", "l")
    assert easy.why.startswith("s: score") and "<= 0.2" in easy.why
    assert "s passed over: score" in mid.why and mid.why.startswith("m: score")
    assert "(mostly " in hard.why and "m passed over" in hard.why
    entry = hard.to_json()
    assert set(entry) == {"alias", "model", "index", "score", "why", "contributions", "features"}
    assert entry["index"] == 2 and entry["contributions"]["response_format"] > 0
    # A tier whose context does not hold the request is passed over for the next.
    assert choose(r, EASY, fits=lambda name: name != "s").model == "m"


def test_errors_trip_the_cheap_tier_its_traffic_moves_up_and_comes_back_after_the_cool_down() -> None:
    clock = ManualClock()
    r = TierRouter(clock)
    for i in range(10):
        c = choose(r, EASY, f"r{i}")
        assert c.model == "s"
        ended(r, c, clock, status="upstream_error" if i < 3 else "ok", rid=f"r{i}")
        clock.advance(0.1)
    g = r.guards[("auto", "s")]
    assert g.tripped and g.trips == 1
    [t] = list(r.transitions)
    assert t["event"] == "tripped" and t["tier"] == "s" and t["error_rate"] == 0.3
    moved = choose(r, EASY, "x")
    assert moved.model == "m" and moved.guard is not None and "s guard tripped" in moved.guard
    assert "its guard is tripped" in moved.why
    clock.advance(30)
    back = choose(r, EASY, "y")      # the cool-down is over: half-open (probe_share 0)
    assert back.model == "s" and not r.guards[("auto", "s")].tripped
    assert [t["event"] for t in r.transitions] == ["tripped", "restored"]
    [desc] = r.describe([type("M", (), {"name": "auto", "tiers": POLICY})()])
    assert desc["tiers"][0]["errors"] == 3 and desc["tiers"][0]["requests"] == 10
    assert desc["tiers"][0]["guard"]["trips"] == 1 and [x["event"] for x in desc["transitions"]] == [
        "tripped", "restored"]


def test_slo_misses_count_and_client_ends_do_not() -> None:
    clock = ManualClock()
    r = TierRouter(clock)
    c = choose(r, EASY)
    ended(r, c, clock, e2e=3.0)                       # over the alias's 2 s
    ended(r, c, clock, status="client_closed")
    ended(r, c, clock, status="rejected_rate_limit")
    st = r.stats[("auto", "s")]
    assert (st.requests, st.errors, st.slo_missed, st.chosen) == (1, 0, 1, 1)
    assert round(st.cost, 6) == 0.01
    # The strongest tier has no guard: nowhere stronger to send its traffic.
    ended(r, choose(r, HARD), clock, status="upstream_error")
    assert ("auto", "l") not in r.guards and r.stats[("auto", "l")].errors == 1


def test_probes_reach_a_tripped_tier_by_the_request_id() -> None:
    clock = ManualClock()
    policy = POLICY.model_copy(update={"guard": POLICY.guard.model_copy(update={"probe_share": 0.2})})
    r = TierRouter(clock)
    for i in range(10):
        ended(r, choose(r, EASY, f"r{i}", policy), clock, status="upstream_error", rid=f"r{i}")
    assert r.guards[("auto", "s")].tripped
    picks = [choose(r, EASY, f"q{i}", policy) for i in range(500)]
    probes = [p for p in picks if p.model == "s"]
    assert all(p.probe and "(guard probe)" in p.why for p in probes)
    assert 0.14 < len(probes) / 500 < 0.26
    assert [p.model for p in picks] == [choose(r, EASY, f"q{i}", policy).model for i in range(500)]   # stable


def test_the_learned_model_decides_only_once_ready_and_a_reload_keeps_the_state() -> None:
    clock = ManualClock()
    learned = POLICY.model_copy(update={"learned": POLICY.learned.model_copy(
        update={"enabled": True, "min_samples": 100, "learning_rate": 0.3, "min_success": 0.7}),
        "guard": POLICY.guard.model_copy(update={"enabled": False})})
    r = TierRouter(clock)
    rng = random.Random(5)
    assert choose(r, EASY, "first", learned).p_success is None     # nothing learned yet: the threshold
    for i in range(1500):
        # What the cheap tier was sent: easy requests succeed; those with tools fail (a boundary the
        # thresholds do not draw, since tools alone score under 0.2 with these weights).
        body = {"messages": [{"role": "user", "content": "hi"}], **({"tools": [{}]} if rng.random() < 0.5 else {})}
        c = choose(r, body, f"t{i}", learned.model_copy(update={"models": [
            learned.models[0].model_copy(update={"max_score": 0.5}), learned.models[1], learned.models[2]]}))
        assert c.model == "s" or (c.p_success is not None and "s passed over: learned P(success)" in c.why)
        if c.model == "s":
            ended(r, c, clock, status="upstream_error" if "tools" in body else "ok", rid=f"t{i}")
    m = r.models[("auto", "s")]
    assert m.ready
    easy = choose(r, EASY, "e", learned)
    tools = choose(r, {**EASY, "tools": [{}]}, "t", learned)
    assert easy.model == "s" and easy.p_success is not None and easy.p_success >= 0.7 and "learned P" in easy.why
    assert tools.model != "s" and "s passed over: learned P(success)" in tools.why
    explored = [choose(r, {**EASY, "tools": [{}]}, f"x{i}", learned) for i in range(1000)]
    share = sum(c.model == "s" for c in explored) / 1000
    assert 0.005 < share < 0.04 and all("(exploration)" in c.why for c in explored if c.model == "s")
    # A reload with other guard and learned settings keeps the counts and the model.
    reloaded = learned.model_copy(update={"learned": learned.learned.model_copy(update={"min_success": 0.99})})
    choose(r, EASY, "z", reloaded)
    assert r.models[("auto", "s")] is m and m.cfg.min_success == 0.99 and m.trained > 0
