"""Routing at fleet scale: the incremental node snapshot agrees with a full rebuild,
sampling (power-of-k) keeps decisions correct, and the audit copy of a decision stays bounded."""

from __future__ import annotations

import json
import random

from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.health.isolation import observe, outlier_sweep, restore
from inferlb.node_types import Sample
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeList, NodeView, RouteRequest
from inferlb.types import ManualClock


def fleet(n: int, clock: ManualClock, panic: float = 50.0) -> Fleet:
    cfg = fleet_from_mapping({
        "models": [{"name": "m0"}, {"name": "m1"}],
        "nodes": [{"name": f"node{i:04d}", "url": f"http://127.0.0.1:{i + 1}",
                   "models": ["m0", "m1"] if i % 3 == 0 else ["m0"], "capacity_tokens": 4096,
                   "max_concurrency": 8} for i in range(n)],
        "health": {"probe": {"stale_after_s": 4.0}, "outlier": {"panic_threshold_percent": panic}},
    })
    return Fleet(cfg, clock)


def full(f: Fleet) -> list[NodeView]:
    f._rebuild_all = True          # force the from-scratch build the cache must agree with
    return list(f.views())


def test_the_incremental_snapshot_always_equals_a_full_rebuild() -> None:
    clock = ManualClock()
    f = fleet(12, clock)
    rng = random.Random(7)
    names = list(f.nodes)
    for step in range(600):
        node = rng.choice(names)
        op = rng.randrange(9)
        if op == 0:
            f.acquire(node, rng.randint(1, 900))
        elif op == 1:
            f.release(node, rng.randint(1, 900))
        elif op == 2:
            f.report_failure(node)
        elif op == 3:
            f.report_success(node, stream=True, completion_tokens=50, ttfb_s=0.1, e2e_s=rng.uniform(0.5, 2))
        elif op == 4:
            f.cool_down(node, rng.uniform(0.1, 3))
        elif op == 5:
            observe(f, [Sample(node, "metrics", True, clock.monotonic(), 0.0,
                               values={"waiting": rng.randint(0, 5), "kv_usage": rng.random()}).to_json()])
        elif op == 6:
            observe(f, [Sample(node, "probe", rng.random() < 0.8, clock.monotonic(), 0.0).to_json()])
        elif op == 7:
            clock.advance(rng.choice([0.0, 0.001, 0.3, 1.0, 4.0, 4.5]))
        else:
            outlier_sweep(f, force=True)
            restore(f)
        got = [(v, list(f.views().by_model["m1"])) for v in f.views()]
        want = full(f)
        assert [v for v, _ in got] == want, step
        assert got[0][1] == [v for v in want if "m1" in f.nodes[v.name].cfg.models], step


def test_a_large_fleet_is_sampled_and_the_decision_stays_correct() -> None:
    clock = ManualClock()
    f = fleet(1000, clock, panic=0.0)       # no panic mode: ejected nodes stay out
    for i, st in enumerate(f.nodes.values()):
        if i % 2:
            st.state = "ejected"           # half the fleet out, so most samples hold ejected nodes
            st.ejected_until = 1e9
    router = build_router("token-aware", seed=1)
    views = f.views()
    assert isinstance(views, NodeList) and len(views.by_model["m1"]) == 334
    d = router.decide(RouteRequest("m1", 100, 100), views)
    assert d.sampled is not None and d.sampled <= 16 and d.offered == 1000
    assert d.pick is not None and f.nodes[d.pick].state == "healthy" and "m1" in f.nodes[d.pick].cfg.models
    assert d.counts["serves-model"] == 666               # skipped through the model's pool
    assert set(d.candidates) <= {v.name for v in views.by_model["m1"]}
    # Only one node can serve: sampling cannot miss it (the router falls back to every node).
    only = build_router("token-aware", seed=2)
    for st in f.nodes.values():
        st.state = "ejected"
    f.nodes["node0999"].state = "healthy"
    d = only.decide(RouteRequest("m0", 100, 100), f.views())
    assert d.pick == "node0999" and d.sampled is None and d.counts["healthy"] == 999


def test_the_audit_copy_of_a_decision_is_bounded_and_says_why() -> None:
    clock = ManualClock()
    f = fleet(1000, clock)
    for i, st in enumerate(f.nodes.values()):
        if i % 10 == 0:
            st.state, st.reason, st.ejected_until = "ejected", "5 consecutive gateway-side failures", 1e9
    plain = list(f.views())                                  # a plain list: no model index, no sampling
    for router, nodes in ((build_router("token-aware", seed=1), f.views()),
                          (build_router("token-aware", seed=1, sample=0), plain),
                          (build_router("round-robin"), plain)):
        d = router.decide(RouteRequest("m0", 100, 100), nodes)
        j = d.to_json()
        size = len(json.dumps(j))
        assert size <= 2048, size
        assert j["pick"] == d.pick and j["ranked"][0] == d.pick
        assert j["eliminated_counts"] == d.counts
        assert sum(d.counts.values()) == (d.sampled or 1000) - len(d.ranked)   # every node seen is accounted
        assert j["offered"] == 1000
    d = build_router("token-aware", seed=1, sample=0).decide(RouteRequest("m0", 100, 100), plain)
    j = d.to_json()
    assert j["eliminated_counts"] == {"healthy": 100} and j["candidates_total"] == 1000
    assert len(j["eliminated"]) == 6 and "5 consecutive gateway-side failures" in j["eliminated"][0]["reason"]
    assert set(j["scores"]) == set(d.ranked[:4]) and j["ranked_total"] == 900
    assert j["scores"][d.pick]["total"] >= max(s["total"] for s in j["scores"].values())


def test_a_small_fleet_is_never_sampled() -> None:
    clock = ManualClock()
    f = fleet(16, clock)
    d = build_router("token-aware", seed=1).decide(RouteRequest("m0", 100, 100), f.views())
    assert d.sampled is None and len(d.candidates) == 16 and len(d.scores) == 16


def test_the_fleet_files_sample_size_reaches_the_router() -> None:
    from inferlb.config.settings import Settings
    from inferlb.engine.scope import build_runtime

    clock = ManualClock()
    base = fleet(200, clock)
    for sample, expected in ((4, 4), (0, None)):
        routing = base.cfg.routing.model_copy(update={"sample": sample, "seed": 1})
        rt = build_runtime(Settings(), base.cfg.model_copy(update={"routing": routing}), clock=clock,
                           end=lambda _a: lambda _r: None)
        d = rt.router.decide(RouteRequest("m0", 100, 100), rt.fleet.views())
        # k draws from the pool (repeats count once); 0: every node of the pool is considered
        assert (d.sampled is None) if expected is None else (d.sampled is not None and 1 <= d.sampled <= expected), \
            (sample, d.sampled)
