"""Fleet state machine with an injected clock (no sleeps): every timing rule of the request path,
the sweeps' un-ejection, half-open trials, slow start, cooldowns, panic mode, stale samples, events."""

from __future__ import annotations

from typing import Any

import pytest

from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.health.isolation import observe, outlier_sweep, restore
from inferlb.node_types import Sample
from inferlb.types import ManualClock


def make(n: int = 4, health: dict[str, Any] | None = None, models: int = 1) -> tuple[Fleet, ManualClock]:
    clock = ManualClock()
    cfg = fleet_from_mapping({
        "models": [{"name": f"m{j}" if j else "m"} for j in range(models)],
        "nodes": [{"name": f"n{i}", "url": f"http://127.0.0.1:{i + 1}", "models": ["m"], "capacity_tokens": 1000,
                   "max_concurrency": 10} for i in range(n)],
        "health": health or {},
    })
    return Fleet(cfg, clock), clock


def view(f: Fleet, name: str) -> Any:
    return next(v for v in f.views() if v.name == name)


def healthy(f: Fleet, name: str) -> bool:
    return bool(view(f, name).healthy)


def fail(f: Fleet, name: str, times: int = 5) -> list[bool]:
    return [f.report_failure(name) for _ in range(times)]


def test_ejected_exactly_at_the_fifth_consecutive_failure() -> None:
    f, _ = make()
    assert fail(f, "n0") == [False, False, False, False, True]
    assert not healthy(f, "n0") and f.nodes["n0"].state == "ejected"
    assert "ejected" in (view(f, "n0").unhealthy_reason or "")


def test_a_success_resets_the_count() -> None:
    f, _ = make()
    fail(f, "n0", 4)
    f.report_success("n0")
    assert not any(fail(f, "n0", 4))


def test_unejection_happens_at_the_sweep_not_before() -> None:
    f, clock = make()
    fail(f, "n0")
    clock.advance(29.999)
    restore(f)
    assert f.nodes["n0"].state == "ejected"
    clock.advance(0.001)
    assert not healthy(f, "n0")           # the timer ran out, but only a sweep brings it back
    restore(f)
    assert f.nodes["n0"].state == "half_open" and healthy(f, "n0")


def test_ejection_time_grows_in_a_row_and_is_capped() -> None:
    f, clock = make()
    lengths = []
    for _ in range(12):
        fail(f, "n0", 5 if f.nodes["n0"].state == "healthy" else 1)   # half-open: one failure re-opens
        lengths.append(f.nodes["n0"].ejected_until - clock.monotonic())
        clock.advance(lengths[-1])
        restore(f)
        assert f.nodes["n0"].state == "half_open"
    assert lengths[:4] == [30.0, 60.0, 90.0, 120.0]
    assert max(lengths) == 300.0 and lengths[-1] == 300.0


def test_healthy_intervals_shed_one_step_of_the_multiplier() -> None:  # Envoy: "ejected in a row"
    f, clock = make()
    fail(f, "n0")
    clock.advance(30)
    restore(f)
    f.report_failure("n0")                      # trial fails: 60 s
    assert f.nodes["n0"].backoff == 2
    clock.advance(60)
    restore(f)
    f.report_success("n0")                      # trial succeeds: healthy again
    assert f.nodes["n0"].state == "healthy"
    clock.advance(10)
    outlier_sweep(f)                            # one healthy interval
    assert f.nodes["n0"].backoff == 1
    fail(f, "n0")
    assert f.nodes["n0"].ejected_until - clock.monotonic() == 60.0


def test_half_open_admits_limited_trials_then_closes_into_slow_start() -> None:
    f, clock = make(health={"circuit": {"half_open_requests": 2}, "slow_start": {"window_s": 10}})
    fail(f, "n0")
    clock.advance(30)
    restore(f)
    v = view(f, "n0")
    assert v.healthy and v.max_concurrency == 2
    f.report_success("n0")
    st = f.nodes["n0"]
    assert st.state == "healthy" and st.slow_start_at == clock.monotonic()
    assert view(f, "n0").capacity_tokens == 100          # 10 % of 1000 at the start of the window


def test_half_open_failure_reopens_at_once() -> None:
    f, clock = make()
    fail(f, "n0")
    clock.advance(30)
    restore(f)
    assert f.report_failure("n0") is True
    assert f.nodes["n0"].state == "ejected" and f.nodes["n0"].ejected_until - clock.monotonic() == 60.0


def test_at_most_half_the_pool_is_ejected() -> None:
    f, _ = make(4)
    for name in ("n0", "n1", "n2"):
        fail(f, name)
    assert [healthy(f, n) for n in ("n0", "n1", "n2", "n3")] == [False, False, True, True]


def test_one_node_may_always_be_ejected() -> None:
    f, _ = make(3, health={"outlier": {"max_ejection_percent": 10}})
    assert fail(f, "n0")[-1] is True
    assert not any(fail(f, "n1"))


def test_cooldown_extends_never_shortens_and_ends_to_the_microsecond() -> None:
    f, clock = make()
    f.cool_down("n0", 7)
    f.cool_down("n0", 2)
    clock.advance(6.999)
    assert not healthy(f, "n0")
    clock.advance(0.001)
    assert healthy(f, "n0")                    # no sweep needed to route again
    f.cool_down("n0", 3)                        # a later 429 starts a new cooldown
    clock.advance(1)
    f.cool_down("n0", 5)                        # …and a re-cool extends it
    clock.advance(4.9)
    assert not healthy(f, "n0")


def test_cooldown_is_an_audited_state_and_the_sweep_records_its_end() -> None:
    f, clock = make()
    f.cool_down("n0", 7)
    f.cool_down("n0", 9)
    clock.advance(20)
    restore(f)
    evs = f.take_events()
    assert [(e.from_state, e.to_state) for e in evs] == [("healthy", "cooldown"), ("cooldown", "healthy")]
    assert evs[0].evidence["retry_after_s"] == 7
    assert evs[1].at == pytest.approx(clock.time() - 11)   # stamped when the cooldown ended, not at the sweep
    assert f.nodes["n0"].slow_start_at is None            # a 429 is not a cold start


def test_every_state_change_is_an_event() -> None:
    f, clock = make()
    fail(f, "n0")
    clock.advance(30)
    restore(f)
    f.report_success("n0")
    evs = f.take_events()
    assert [(e.node, e.from_state, e.to_state) for e in evs] == [
        ("n0", "healthy", "ejected"), ("n0", "ejected", "half_open"), ("n0", "half_open", "healthy")]
    first = evs[0]
    assert first.evidence["consecutive_failures"] == 5 and first.evidence["ejection_s"] == 30.0
    assert "5 consecutive" in first.reason and first.at == pytest.approx(clock.time() - 30)
    assert f.take_events() == []


def test_panic_below_half_the_nodes_offers_health_ejected_ones_again() -> None:
    f, clock = make(4, health={"outlier": {"max_ejection_percent": 100}})
    fail(f, "n0")
    assert f.panic_models(clock.monotonic()) == set()
    fail(f, "n1")
    fail(f, "n2")                                # 1 of 4 available: 25 % < 50 %
    assert f.panic_models(clock.monotonic()) == {"m"}
    assert all(healthy(f, n) for n in ("n0", "n1", "n2", "n3"))


def test_panic_never_offers_loading_draining_or_cooling_nodes() -> None:
    f, clock = make(3)
    f.transition(f.nodes["n0"], "loading", "test")
    f.transition(f.nodes["n1"], "draining", "test")
    assert f.panic_models(clock.monotonic()) == {"m"}
    assert [healthy(f, n) for n in ("n0", "n1", "n2")] == [False, False, True]
    f2, _ = make(3)
    for n in ("n0", "n1", "n2"):
        f2.cool_down(n, 5)
    assert f2.panic_models(clock.monotonic()) == set()   # busy is not broken: fast 503, no panic


def test_panic_threshold_zero_disables_it() -> None:
    f, _ = make(2, health={"outlier": {"panic_threshold_percent": 0, "max_ejection_percent": 100}})
    fail(f, "n0")
    fail(f, "n1")
    assert not healthy(f, "n0") and not healthy(f, "n1")


@pytest.mark.parametrize(("t", "expected"), [(0.0, 0.1), (5.0, 0.1), (25.0, 0.25), (30.0, 0.3), (50.0, 0.5),
                                             (99.0, 0.99), (100.0, 1.0)])
def test_slow_start_scales_capacity_weight_and_concurrency(t: float, expected: float) -> None:
    f, clock = make(health={"slow_start": {"window_s": 100}})
    f.to_healthy(f.nodes["n0"], "test")
    clock.advance(t)
    v = view(f, "n0")
    assert v.capacity_tokens == round(1000 * expected)
    assert v.weight == pytest.approx(expected)
    assert v.max_concurrency == max(1, -(-10 * expected // 1))


def test_slow_start_aggression() -> None:
    f, clock = make(health={"slow_start": {"window_s": 100, "aggression": 2.0}})
    f.to_healthy(f.nodes["n0"], "test")
    clock.advance(49)
    assert view(f, "n0").weight == pytest.approx(0.7)   # (49/100)^(1/2)


def _metrics(node: str, taken_at: float, waiting: int = 3, kv: float = 0.4) -> dict[str, Any]:
    return Sample(node, "metrics", True, taken_at, 0.0, values={"waiting": waiting, "kv_usage": kv}).to_json()


def test_fresh_metrics_feed_routing_stale_ones_are_unknown_only_stale_is_saturated() -> None:
    f, clock = make(health={"interval_s": 1})          # stale after 3 s
    now = clock.monotonic()
    probe = Sample("n0", "probe", True, now, 0.0).to_json()
    observe(f, [_metrics("n0", now), probe])
    assert (view(f, "n0").waiting, view(f, "n0").kv_usage) == (3, 0.4)
    clock.advance(3.5)
    observe(f, [Sample("n0", "probe", True, clock.monotonic(), 0.0).to_json()])
    assert (view(f, "n0").waiting, view(f, "n0").kv_usage) == (None, None)   # metrics stale, probe fresh
    clock.advance(3.5)
    assert (view(f, "n0").waiting, view(f, "n0").kv_usage) == (10, 1.0)      # nothing fresh: saturated
    assert (view(f, "n1").waiting, view(f, "n1").kv_usage) == (None, None)   # never sampled: unknown


def test_inflight_accounting() -> None:
    f, _ = make()
    f.acquire("n0", 300)
    f.acquire("n0", 200)
    v = view(f, "n0")
    assert (v.inflight_requests, v.inflight_tokens) == (2, 500)
    f.release("n0", 300)
    f.release("n0", 200)
    assert f.inflight_total() == 0


# ---- learned decode speed


def test_decode_speed_is_learned_from_streamed_timings() -> None:
    f, _ = make()
    assert f.nodes["n0"].tokens_per_s is None
    # 101 tokens: the first at 0.2 s, the other 100 in the next 2 s.
    f.report_success("n0", stream=True, completion_tokens=101, ttfb_s=0.2, e2e_s=2.2)
    assert f.nodes["n0"].tokens_per_s == pytest.approx(50.0)
    f.report_success("n0", stream=True, completion_tokens=101, ttfb_s=0.2, e2e_s=1.2)   # 100 tokens/s
    assert f.nodes["n0"].tokens_per_s == pytest.approx(0.8 * 50 + 0.2 * 100)
    assert view(f, "n0").tokens_per_s == pytest.approx(60.0)   # what routing reads


def test_a_non_streamed_answer_gives_a_sane_decode_speed() -> None:
    # The issue: first byte == last byte for a non-streamed answer, so "decode time" was ~0 and
    # the learned speed 793,168 tokens/s. Now: e2e minus the prefill estimate (streamed TTFT).
    f, _ = make()
    f.report_success("n0", stream=False, completion_tokens=100, ttfb_s=2.2, e2e_s=2.2)
    assert f.nodes["n0"].tokens_per_s == pytest.approx(100 / 2.2)     # no prefill estimate: under, not over
    f.report_success("n1", stream=True, completion_tokens=101, ttfb_s=0.2, e2e_s=2.2)
    f.report_success("n1", stream=False, completion_tokens=100, ttfb_s=2.2, e2e_s=2.2)
    assert f.nodes["n1"].tokens_per_s == pytest.approx(50.0)
    f.report_success("n2", stream=False, completion_tokens=1, ttfb_s=0.3, e2e_s=0.3)    # too short to say
    assert f.nodes["n2"].tokens_per_s is None


def test_at_low_load_every_node_gets_traffic_and_learns_its_speed() -> None:
    # Requests one at a time: a node whose speed is unknown must not lose every tie to the first
    # node that learned one (it would never learn its own); it learns on short requests, and a
    # long one never goes to a node whose speed is unknown while a known one can take it.
    from inferlb.routing.profiles import build_router
    from inferlb.routing.types import RouteRequest

    f, _ = make(3)
    true_speed = {"n0": 30.0, "n1": 60.0, "n2": 90.0}
    router = build_router("token-aware", seed=3)
    served = dict.fromkeys(f.nodes, 0)
    for i in range(40):
        out = 900 if i % 4 == 3 else 128
        pick = router.decide(RouteRequest("m", 100, out), f.views()).pick
        assert pick is not None
        if out > 256 and any(st.tokens_per_s is not None for st in f.nodes.values()):
            assert f.nodes[pick].tokens_per_s is not None, i
        served[pick] += 1
        f.acquire(pick, 100 + out)
        f.report_success(pick, stream=True, completion_tokens=out, ttfb_s=0.1, e2e_s=0.1 + (out - 1) / true_speed[pick])
        f.release(pick, 100 + out)
    assert all(st.tokens_per_s is not None for st in f.nodes.values()), served
    assert {n: round(st.tokens_per_s or 0) for n, st in f.nodes.items()} == {"n0": 30, "n1": 60, "n2": 90}
    assert max(served, key=lambda n: served[n]) == "n2"          # and then the fastest takes the work


def test_views_are_exact_by_model_unless_panic_narrowed_a_nodes_models() -> None:
    """``NodeList.exact`` (the router then skips ``serves-model`` on a model's pool) holds while
    every view lists the models it is indexed under; panic mode offers an ejected node for the
    panicking model only, so it is not exact then and ``serves-model`` still drops that node."""
    from inferlb.routing.profiles import build_router
    from inferlb.routing.types import RouteRequest

    clock = ManualClock()
    cfg = fleet_from_mapping({
        "models": [{"name": "m"}, {"name": "m1"}],
        "nodes": [{"name": f"n{i}", "url": f"http://127.0.0.1:{i + 1}", "models": ["m", "m1"] if i < 3 else ["m1"],
                   "capacity_tokens": 1000, "max_concurrency": 10} for i in range(9)],
        "health": {"outlier": {"max_ejection_percent": 100}},
    })
    f = Fleet(cfg, clock)
    assert f.views().exact is True
    for n in ("n0", "n1", "n2"):
        fail(f, n)                              # m: 0 of 3 available (panic); m1: 6 of 9 (none)
    views = f.views()
    assert f.panic_models(clock.monotonic()) == {"m"} and views.exact is False
    assert view(f, "n0").models == frozenset({"m"}) and view(f, "n0") in views.by_model["m1"]
    d = build_router("round-robin", seed=1).decide(RouteRequest("m1", 10, 10), views)
    assert d.counts == {"serves-model": 3} and not {"n0", "n1", "n2"} & set(d.ranked)
