"""The routing core decides exactly as it did before its speed work.

tests/routing/routing_reference.py holds the core as it was (plugins, ``Router``, ``Decision``,
copied verbatim). Here both run side by side from the same seed over random fleets and requests
(healthy and not, full and idle nodes, unknown metrics, other models, retries, sampled and not,
plain lists and :class:`NodeList`, sessions and prompt prefixes for the affinity picker), and
every field of every decision must be equal: candidates, eliminations with their reasons, counts,
per-scorer scores, ranking, the picker's detail, the audit copy byte for byte.
The discrete-event simulation gives the same results with either core.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from inferlb.routing.learned import PredictedLatency, SoftmaxBandit, SoftmaxBanditParams
from inferlb.routing.profiles import PROFILES, Router, build_router
from inferlb.routing.types import Elimination, NodeList, NodeView, RouteRequest
from tests.routing.routing_reference import RefDecision, RefRouter, ref_router

MODELS = ("m0", "m1", "m2")


def random_views(rng: random.Random, n: int) -> list[NodeView]:
    out = []
    for i in range(n):
        cap = rng.choice([64, 512, 4096, 16384, 131072])
        conc = rng.choice([1, 4, 64])
        healthy = rng.random() >= 0.15
        models = frozenset(m for m in MODELS[:2] if rng.random() < 0.8) or frozenset({"m0"})
        out.append(NodeView(
            name=f"n{i:04d}", models=models, capacity_tokens=cap, max_concurrency=conc,
            weight=rng.choice([0.0, 0.5, 1.0, 3.0, 20.0]),
            inflight_requests=rng.choice([0, 0, 1, conc - 1, conc, conc + 1, rng.randint(0, 80)]),
            # cap − (prompt + output) of some requests below: has-capacity's boundary (it + t == c)
            inflight_tokens=rng.choice([0, 0, rng.randint(0, cap), cap, cap * 2,
                                        max(0, cap - rng.choice([1, 101, 164, 356, 3001, 3064]))]),
            waiting=rng.choice([None, 0, rng.randint(0, 30)]),
            kv_usage=rng.choice([None, 0.0, 1.0, rng.random(), 1.3, -0.2, math.nan]),
            healthy=healthy, unhealthy_reason=None if healthy else rng.choice([None, "ejected: 5 failures"]),
            tokens_per_s=rng.choice([None, 0.0, -1.0, rng.uniform(5, 200), math.nan]),
            ttft_s=rng.choice([None, rng.uniform(0.01, 2)])))
    return out


def as_nodelist(views: list[NodeView], exact: bool = False, fixed: bool = False) -> NodeList:
    """``by_model`` from the views' own ``models``, so the list is exact: ``exact`` says so;
    ``fixed``: the caller never changes the lists afterwards, and says so."""
    by_model: dict[str, list[NodeView]] = {m: [] for m in MODELS}
    for v in views:
        for m in sorted(v.models):
            by_model[m].append(v)
    return NodeList(views, by_model, exact=exact, fixed=fixed)


def random_request(rng: random.Random, views: list[NodeView]) -> RouteRequest:
    names = [v.name for v in views]
    exclude = frozenset(rng.sample(names, min(len(names), rng.choice([0, 0, 1, 3])))) if names else frozenset()
    return RouteRequest(model=rng.choice(("m0", "m0", "m1", "m2")), prompt_tokens=rng.choice([1, 100, 3000, 200_000]),
                        output_tokens=rng.choice([0, 1, 64, 256, 2048]),
                        priority=rng.choice([None, "critical", "standard", "sheddable"]), exclude=exclude,
                        stream=rng.random() < 0.5, deadline_s=rng.choice([None, 0.0, 2.0, 30.0]),
                        prefix=tuple(rng.getrandbits(64) for _ in range(rng.choice([0, 0, 1, 4, 20]))),
                        session=rng.choice([None, None, rng.getrandbits(64), 42]))


def same(new: Any, ref: RefDecision, json_first: bool = False) -> None:
    if json_first:    # the audit copy straight from the decision's sources, before anything else is read
        assert json.dumps(new.to_json()) == json.dumps(ref.to_json())
    assert new.profile == ref.profile
    assert new.candidates == ref.candidates
    assert [(e.node, e.by, e.reason) for e in new.eliminated] == [(e.node, e.by, e.reason) for e in ref.eliminated]
    assert new.counts == ref.counts and list(new.counts) == list(ref.counts)
    assert new.score_keys == ref.score_keys
    assert _nan_eq(new.score_rows, ref.score_rows) and list(new.score_rows) == list(ref.score_rows)
    assert _nan_eq(new.scores, ref.scores)
    assert new.ranked == ref.ranked and new.pick == ref.pick and new.picker == ref.picker
    assert new.offered == ref.offered and new.sampled == ref.sampled and new.pick_detail == ref.pick_detail
    assert json.dumps(new.to_json()) == json.dumps(ref.to_json())


def _nan_eq(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=False) == json.dumps(b, sort_keys=False)


CUSTOM: dict[str, tuple[tuple[str, ...], dict[str, float], str, dict[str, dict[str, Any]]]] = {
    "headroom-and-weights": (("healthy", "serves-model", "has-capacity"),
                             {"outstanding-tokens": 2.0, "static-weight": 0.0, "least-requests": 1.0},
                             "max-score",
                             {"has-capacity": {"token_headroom": 0.5}, "static-weight": {"max_weight": 4}}),
    "capacity-first": (("has-capacity", "healthy"), {"decode-speed": 1.0, "queue-depth": 3.0}, "power-of-two",
                       {"has-capacity": {"token_headroom": 2.0},
                        "decode-speed": {"reference_s": 3.0, "optimistic_max_tokens": 64}}),
    "no-filters": ((), {"kv-cache": 1.0}, "weighted-random", {}),
    "no-scorers": (("serves-model",), {}, "max-score", {}),
    "round-robin-scored": (("healthy", "serves-model"), {"outstanding-tokens": 1.0}, "round-robin", {}),
    "five-scorers": (("healthy", "serves-model"), {"outstanding-tokens": 1.0, "queue-depth": 0.5, "kv-cache": 0.25,
                                                   "decode-speed": 1.0, "least-requests": 0.125}, "max-score", {}),
}


def pairs(scores_when_read: bool = False) -> list[tuple[str, Router, RefRouter]]:
    out: list[tuple[str, Router, RefRouter]] = []
    for seed, sample in ((1, None), (2, 0), (3, 4)):
        for name, spec in PROFILES.items():
            if name == "learned":
                continue
            k = spec.sample if sample is None else sample
            out.append((f"{name}/k={k}", build_router(name, seed=seed, sample=sample),
                        ref_router(spec.filters, spec.scorers, spec.picker, seed=seed, sample=k, name=name)))
        for name, (fs, sc, pk, params) in CUSTOM.items():
            k = 16 if sample is None else sample
            out.append((f"{name}/k={k}", build_router("custom", filters=list(fs), scorers=sc, picker=pk,
                                                       params=params, seed=seed, sample=k),
                        ref_router(fs, sc, pk, seed=seed, sample=k, params=params, name="custom")))
    for _, router, _ in out:
        router.scores_when_read = scores_when_read
    return out


@pytest.mark.parametrize("scores_when_read", [False, True])
@pytest.mark.parametrize("fleet_seed", range(4))
def test_every_decision_equals_the_reference_core(fleet_seed: int, scores_when_read: bool) -> None:
    """``scores_when_read`` (what the DES sets): the same decisions, scores and audit copy, with
    the token-aware totals from one fused pass and the columns computed when first read."""
    rng = random.Random(fleet_seed)
    fleets = [random_views(rng, n) for n in (0, 1, 3, 16, 17, 40, 300)]
    for label, new, ref in pairs(scores_when_read):
        for views in fleets:
            for kind in ("list", "nodelist", "exact", "fixed"):
                nodes: list[NodeView] = as_nodelist(views, kind != "nodelist", kind == "fixed") \
                    if kind != "list" else list(views)
                for _ in range(12):
                    req = random_request(rng, views)
                    same(new.decide(req, nodes), ref.decide(req, nodes), json_first=scores_when_read)
        assert new.rng.random() == ref.rng.random(), label     # the same random draws were taken


def roomy_views(rng: random.Random, n: int, idle: bool = False) -> list[NodeView]:
    """Views that the token-aware filters mostly all keep (healthy, in-flight work well under
    capacity), as in a fleet under normal load: so that a 16-node sample is often kept whole and
    the router's one-pass path (``Router._decided``) decides. Some nodes are still unhealthy,
    full or at ``max_concurrency``; metrics and speeds are unknown, odd or tied now and then.
    ``idle``: nothing in flight (a request larger than every capacity still goes to one)."""
    out = []
    for i in range(n):
        cap = rng.choice([4096, 16384, 131072])
        conc = rng.choice([64, 256])
        odd = rng.random() < 0.02   # the rare node a filter drops
        out.append(NodeView(
            name=f"r{i:04d}", models=frozenset({"m0"}) if rng.random() < 0.9 else frozenset({"m0", "m1"}),
            capacity_tokens=cap, max_concurrency=conc,
            inflight_requests=conc if odd and rng.random() < 0.5 else rng.choice([0, 1, 2, rng.randint(0, 20)]),
            inflight_tokens=0 if idle else cap * 2 if odd else rng.choice([0, 0, 100, rng.randint(0, cap // 4)]),
            waiting=rng.choice([None, 0, 0, 1, rng.randint(0, 30)]),
            kv_usage=rng.choice([None, 0.0, 0.25, rng.random(), rng.random(), 1.3, -0.2, math.nan]),
            healthy=rng.random() >= 0.01,
            tokens_per_s=rng.choice([None, 40.0, 40.0, rng.uniform(5, 200), rng.uniform(5, 200),
                                     rng.uniform(5, 200), 0.0, -1.0, math.nan]),
            ttft_s=rng.choice([None, rng.uniform(0.01, 2)])))
    return out


@pytest.mark.parametrize("scores_when_read", [False, True])
def test_decisions_over_roomy_fleets_equal_the_reference_core(scores_when_read: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the filters keep the whole sample (what a fleet under normal load mostly gives), the
    token-aware profile's one-pass path (filters and totals together, ``Router._decided``) decides
    as the reference core does, field by field and in the audit copy; and it did decide."""
    rng = random.Random(21)
    taken = [0]
    decided = Router._decided

    def counting(self: Router, *args: Any) -> Any:
        taken[0] += 1
        return decided(self, *args)

    monkeypatch.setattr(Router, "_decided", counting)
    spec = PROFILES["token-aware"]
    for seed in (1, 2):
        for views in (roomy_views(rng, 40), roomy_views(rng, 1000), roomy_views(rng, 30, idle=True)):
            for kind in ("exact", "fixed", "nodelist"):
                new = build_router("token-aware", seed=seed)
                new.scores_when_read = scores_when_read
                ref = ref_router(spec.filters, spec.scorers, spec.picker, seed=seed, sample=spec.sample,
                                 name="token-aware")
                nodes = as_nodelist(views, kind != "nodelist", kind == "fixed")
                for _ in range(150):
                    req = random_request(rng, views)
                    if rng.random() < 0.5:
                        req = RouteRequest(req.model, rng.choice([1, 100, 3000]), rng.choice([0, 64, 256, 257, 2048]))
                    same(new.decide(req, nodes), ref.decide(req, nodes), json_first=scores_when_read)
                assert new.rng.random() == ref.rng.random()
    assert (taken[0] > 200) is scores_when_read, taken   # the DES's setting takes it; the gateway's does not


class _Predictor:
    """A deterministic latency predictor: TTFT and TPOT from the node's load."""

    def predict_nodes(self, req: RouteRequest, nodes: list[NodeView]) -> list[tuple[float, float]]:
        return [(0.05 + n.inflight_tokens / 1e5, 0.01 + n.inflight_requests / 1e3) for n in nodes]


def test_plugins_from_elsewhere_run_the_same_in_both_cores() -> None:
    """The learned plugins (a scorer with state, a picker with ``rank_for``) through both routers."""
    rng = random.Random(9)
    views = random_views(rng, 200)
    nodes = as_nodelist(views)

    def plugins() -> tuple[list[Any], list[tuple[Any, float]], Any]:
        from inferlb.routing.plugins import HasCapacity, Healthy, ServesModel

        sc = PredictedLatency()
        sc.bind(_Predictor())
        return [Healthy(), ServesModel(), HasCapacity()], [(sc, 1.0)], SoftmaxBandit(SoftmaxBanditParams(epsilon=0.3))

    fs, sc, pk = plugins()
    new = Router("learned", fs, sc, pk, random.Random(5), 16)
    fs, sc, pk = plugins()
    ref = RefRouter("learned", fs, sc, pk, random.Random(5), 16)
    for _ in range(300):
        req = random_request(rng, views)
        same(new.decide(req, nodes), ref.decide(req, nodes))


def test_an_elimination_reads_as_before() -> None:
    e = Elimination("n1", "has-capacity", "4 requests in flight (max)")
    assert (e.node, e.by, e.reason) == ("n1", "has-capacity", "4 requests in flight (max)")
    assert e == Elimination("n1", "has-capacity", "4 requests in flight (max)") and len({e, e}) == 1
    assert repr(e) == "Elimination(node='n1', by='has-capacity', reason='4 requests in flight (max)')"


def test_a_node_view_equals_another_as_a_dataclass_does() -> None:
    """``NodeView.__eq__`` (the in-flight counts first) agrees with the dataclass rule: every field
    compared in order, by identity, then ``==`` (so the same NaN object is equal to itself)."""
    import dataclasses

    rng = random.Random(12)
    nan = math.nan
    names = [f.name for f in dataclasses.fields(NodeView)]
    views = random_views(rng, 60)
    views += [dataclasses.replace(v, kv_usage=nan) for v in views[:10]]
    views += [dataclasses.replace(v, kv_usage=float("nan")) for v in views[:5]]
    for _ in range(5000):
        a = rng.choice(views)
        b = rng.choice((a, rng.choice(views), dataclasses.replace(a), dataclasses.replace(a, inflight_tokens=7),
                        dataclasses.replace(a, inflight_requests=a.inflight_requests),
                        dataclasses.replace(a, weight=9.0)))
        want = tuple(getattr(a, n) for n in names) == tuple(getattr(b, n) for n in names)
        assert (a == b) is want and (a != b) is (not want) and (b == a) is want
    assert views[0].__eq__("n0000") is NotImplemented


def test_the_simulation_gives_the_same_results_with_either_core() -> None:
    from inferlb.bench.loadgen.workload import load_workload, plan
    from inferlb.simulator.des.sim import Simulation
    from inferlb.simulator.presets import preset_spec

    specs = [preset_spec(f"{p}-{i}", p) for i, p in enumerate(("h100", "a100", "l4") * 10)]
    w = load_workload("chat")
    reqs = plan(w, seed=3, rate=120.0, duration_s=20.0, max_requests=2000)
    spec = PROFILES["token-aware"]
    runs = []
    for router in (build_router("token-aware", seed=4),
                   ref_router(spec.filters, spec.scorers, spec.picker, seed=4, sample=spec.sample)):
        sim = Simulation(specs, router=router, seed=4, timeout_s=w.timeout_s)  # type: ignore[arg-type]
        runs.append(list(sim.run(reqs).rows()))
    assert len(runs[0]) == len(reqs) and runs[0] == runs[1]


def test_the_audit_copys_fast_rounding_equals_round() -> None:
    """``_round_row4`` (the audit copy's fast ``round(x, 4)`` over a score row) gives the very
    same floats, sign of zero, ties, NaN and infinities included."""
    import struct
    import sys

    from inferlb.routing.types import _json_rows4, _round_row4

    rng = random.Random(11)
    xs = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-320, -1e-320, sys.float_info.max, 1e300, -1e300,
          0.00005, -0.00005, 0.00015, 0.12345, 0.99995, 1.00005, 2.5e-5, 0.5, 1.0, -1.0, 109951162.77755,
          109951162.77765, 1e8 + 0.00005]
    xs += [rng.random() for _ in range(100_000)]
    xs += [rng.uniform(-1e9, 1e9) for _ in range(20_000)]
    xs += [k / 20000 + rng.choice((0.0, 1e-17, -1e-17)) for k in range(-40_000, 40_000)]   # at and near ties
    xs += [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(20_000)]   # any bits
    keys = ("a", "b", "c", "d", "e")
    for j in range(0, len(xs) - 4, 5):
        row = xs[j:j + 5]
        assert repr(_round_row4(keys, row)) == repr({k: round(x, 4) for k, x in zip(keys, row, strict=True)}), row
    # The few rows read from the columns (the audit copy of a scored decision): the same dicts.
    for j in range(0, len(xs) - 19, 20):
        block = xs[j:j + 20]
        cols, totals = [block[c::5] for c in range(4)], block[4::5]
        at = [(f"n{i}", i) for i in (3, 0, 2)]
        want = {name: {k: round(x, 4) for k, x in zip(keys, [*(c[i] for c in cols), totals[i]], strict=True)}
                for name, i in at}
        assert repr(_json_rows4(keys, cols, totals, at)) == repr(want), block


@pytest.mark.parametrize("nd", [3, 4, 6, 7])
def test_the_learned_records_fast_rounding_equals_round(nd: int) -> None:
    """``_round_to`` (the learned record's fast ``round(x, nd)``), as ``_round_row4`` above: the same
    float for values at, near and far from a tie at ``nd`` places, and for any bits."""
    import struct

    from inferlb.routing.types import _round_to

    rng = random.Random(nd)
    scale = 10 ** nd
    xs = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-320, 5 / scale / 10, -5 / scale / 10, 0.5, 1.0, -1.0,
          2.0 ** 40 / scale, -(2.0 ** 40) / scale, 1e300]
    xs += [rng.random() for _ in range(50_000)]
    xs += [rng.uniform(-30.0, 30.0) for _ in range(20_000)]
    xs += [rng.uniform(-1e5, 1e5) for _ in range(10_000)]
    xs += [k / (2 * scale) + rng.choice((0.0, 1e-17, -1e-17, 1e-13)) for k in range(-30_000, 30_000)]
    xs += [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(10_000)]
    for x in xs:
        assert repr(_round_to(x, nd)) == repr(round(x, nd)), x


def test_a_prediction_is_clipped_as_with_np_clip() -> None:
    """``OnlineLinear.predict`` clips its two log-predictions without ``np.clip``: the same floats
    for trained weights, NaN rows and rows that overflow."""
    import numpy as np

    from inferlb.routing.features import N_FEATURES
    from inferlb.routing.predictor import _LOG_MAX, _LOG_MIN, Observed, OnlineLinear

    rng = random.Random(3)
    m = OnlineLinear()
    rows = [[rng.uniform(-20, 20) for _ in range(N_FEATURES)] for _ in range(2000)]
    for r in rows[:300]:
        m.update(r, Observed(rng.uniform(0.01, 2), rng.uniform(0.001, 0.1)))
    rows += [[math.nan] * N_FEATURES, [1e308] * N_FEATURES, [-1e308] * N_FEATURES]
    for r in rows:
        logs = np.clip(np.asarray(r, dtype=float) @ m.w, _LOG_MIN, _LOG_MAX)
        p = m.predict(r)
        assert repr((p.ttft_s, p.tpot_s)) == repr((float(math.exp(logs[0])), float(math.exp(logs[1]))))
