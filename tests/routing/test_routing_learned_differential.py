"""The learned profile decides and explains itself exactly as it did before its speed work.

tests/routing/routing_reference_learned.py holds the audit copy (``LearnedInfo.why`` / ``to_json``
with ``_ctx``), the ``predicted-latency`` scorer's ``score_all`` and the ``softmax-bandit``'s
``rank_for`` as they were. Here two guarded
routers, one with each, run side by side from the same seed over random fleets and requests (views
reused across decisions and rebuilt, odd metrics, GPU labels, streamed and not, deadlines, short
requests that are charged interference, a tail reservation), their predictors trained alike
between decisions, warming (the token-aware fallback) and active: every decision must be equal, the
scorer's terms, the random generator's state and the audit copy byte for byte (the same error
where the record cannot be made, such as a NaN KV use).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pickle
import random
from typing import Any

import numpy as np
import pytest

from inferlb.routing.explain import LearnedInfo
from inferlb.routing.features import FEATURE_NAMES, features
from inferlb.routing.guarded import GuardedRouter, make_guarded
from inferlb.routing.learned import PredictedLatency, PredictedLatencyParams, SoftmaxBandit, SoftmaxBanditParams
from inferlb.routing.predictor import Observed, OnlineLinear
from inferlb.routing.profiles import LEARNED_LATENCY, PROFILES, build_router
from inferlb.routing.registry import make_plugin
from inferlb.routing.types import NodeList, NodeView, RouteRequest
from tests.routing.routing_reference_learned import (
    RefGuardedRouter,
    RefLearnedInfo,
    RefPredictedLatency,
    RefSoftmaxBandit,
    ref_node_part,
    ref_request_part,
)

_GPU = ((), (("gpu", "NVIDIA-H100-80GB"),), (("gpu_type", "a100"),), (("gpu", "l4"), ("gpu_type", "L40S")),
        (("gpu", ""),), (("zone", "b"),))


def _view(rng: random.Random, i: int, odd: float) -> NodeView:
    cap = rng.choice([4096, 16384, 131072])
    conc = rng.choice([4, 64])
    healthy = rng.random() >= 0.1
    return NodeView(
        name=f"n{i:03d}", models=frozenset({"m0"}), capacity_tokens=cap, max_concurrency=conc,
        weight=rng.choice([0.5, 1.0, 3.0]), inflight_requests=rng.choice([0, 1, rng.randint(0, 80), conc]),
        inflight_tokens=rng.choice([0, rng.randint(0, cap), cap * 2]),
        waiting=rng.choice([None, 0, rng.randint(0, 30)]),
        kv_usage=math.nan if rng.random() < odd else rng.choice([None, 0.0, 1.0, rng.random(), 1.3]),
        healthy=healthy, unhealthy_reason=None if healthy else "ejected: 5 failures",
        labels=rng.choice(_GPU),
        tokens_per_s=rng.choice([None, 0.0, -1.0, rng.uniform(5, 200), math.inf, math.nan]),
        ttft_s=rng.choice([None, rng.uniform(0.01, 2), 2e12, 0.0]))


def _request(rng: random.Random) -> RouteRequest:
    return RouteRequest(model="m0", prompt_tokens=rng.choice([1, 100, 3000, 60_000]),
                        output_tokens=rng.choice([0, 1, 16, 64, 256, 2048]),
                        priority=rng.choice([None, "critical", "standard"]), stream=rng.random() < 0.5,
                        deadline_s=rng.choice([None, None, 0.0, 2.0, 30.0]))


def _pair(seed: int, predictor: dict[str, Any] | None, latency: dict[str, Any],
          bandit: dict[str, Any]) -> tuple[GuardedRouter, GuardedRouter]:
    """The learned profile twice from ``seed``: its scorer as it is, and as it was."""
    spec = PROFILES["learned"]

    def build(cls: type[PredictedLatency], picker: Any) -> GuardedRouter:
        fs = [make_plugin(n, None) for n in spec.filters]
        w = spec.scorers
        sc = [(cls(PredictedLatencyParams(**{**LEARNED_LATENCY, **latency})), w["predicted-latency"]),
              (make_plugin("outstanding-tokens", None), w["outstanding-tokens"])]
        return make_guarded("learned", fs, sc, picker, random.Random(seed),
                            spec.sample, fallback=build_router("token-aware"), predictor=predictor, lifecycle=None)

    ref_picker = RefSoftmaxBandit(SoftmaxBanditParams(**bandit))
    ref = build(RefPredictedLatency, ref_picker)
    ref.__class__ = RefGuardedRouter   # the explanation as it was, too
    return build(PredictedLatency, make_plugin("softmax-bandit", bandit)), ref


def _json_or_error(d: Any) -> str:
    try:
        return json.dumps(d.to_json())
    except Exception as exc:   # what cannot be recorded must fail the same way
        return f"{type(exc).__name__}: {exc}"


def _as_ref(info: LearnedInfo) -> RefLearnedInfo:
    return RefLearnedInfo(**{f.name: getattr(info, f.name) for f in dataclasses.fields(info)})


VARIANTS: list[tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any]]] = [
    ({"min_samples": 0}, {}, {}),                                                  # active, the profile's own
    (None, {}, {}),                                                                # warming: the fallback
    ({"min_samples": 0}, {"reserve": 0.9, "reserve_quantile": None, "reserve_min_output": 200}, {"epsilon": 0.3}),
    ({"min_samples": 0}, {"reserve": 0.5, "reserve_window": 64, "interference_max_output": None,
                          "elasticity": None, "prefill_interference": 0.0}, {"epsilon": 1.0}),
    ({"min_samples": 0}, {"miss_weight": 0.5, "miss_ttft_s": 0.05, "miss_e2e_s": 2.0}, {}),   # the SLO-miss charge
]


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
@pytest.mark.parametrize("seed", [1, 2])
def test_learned_decisions_and_audit_equal_the_reference(seed: int, variant: int) -> None:
    predictor, latency, bandit = VARIANTS[variant]
    new, ref = _pair(seed, predictor, latency, bandit)
    rng = random.Random(100 * seed + variant)
    odd = 0.02 if variant % 2 == 0 else 0.0
    views = [_view(rng, i, odd) for i in range(60)]
    compared = explained = nan_faults = 0
    for step in range(400):
        # A few views rebuilt (new objects, no memo) before each decision; the rest as they were.
        for _ in range(rng.choice([0, 1, 3])):
            i = rng.randrange(len(views))
            views[i] = _view(rng, i, odd) if rng.random() < 0.5 else dataclasses.replace(
                views[i], inflight_requests=views[i].inflight_requests + 1)
        nodes: list[NodeView] = NodeList(list(views), {"m0": list(views)}, exact=True, fixed=True) \
            if step % 2 else list(views)
        req = _request(rng)
        # Now and then a broken model, the same in both: an infinite weight on a KV feature, so
        # the nodes where it is 0 are predicted NaN and the others clipped (unusable: a fault).
        models = [m for r in (new, ref) if isinstance(m := r.lifecycle.model, OnlineLinear)]
        kept = [m.w.copy() for m in models] if step % 40 == 20 else []
        if kept:
            bad = kept[0].copy()
            bad[FEATURE_NAMES.index(rng.choice(["kv_usage", "kv_unknown"]))] = math.inf
            for m in models:
                m._set_weights(bad.copy())
        with np.errstate(invalid="ignore"):   # inf · 0: the NaN this is about
            a, b = new.decide(req, nodes), ref.decide(req, nodes)
        for m, w in zip(models, kept, strict=False):
            m._set_weights(w)
        nan_faults += "nan" in (a.learned.reason or "")
        assert a.ranked == b.ranked and a.pick == b.pick and a.candidates == b.candidates
        assert json.dumps(a.score_rows) == json.dumps(b.score_rows)
        assert new.rng.getstate() == ref.rng.getstate()
        sa, sb = getattr(new._explainer, "last", None), getattr(ref._explainer, "last", None)
        if sa is not None or sb is not None:
            assert sa is not None and sb is not None
            assert repr((sa.preds, sa.slack, sa.scores, sa.others_s, sa.reserved, sa.reserve_cut)) == \
                repr((sb.preds, sb.slack, sb.scores, sb.others_s, sb.reserved, sb.reserve_cut))
            assert [n.name for n in sa.nodes] == [n.name for n in sb.nodes]
        assert b.learned is not None and a.learned is not None
        explained += a.learned.fallback is None
        b.learned = _as_ref(b.learned)
        assert _json_or_error(a) == _json_or_error(b)
        assert repr(a.learned.why()) == repr(b.learned.why())
        compared += 1
        # Both predictors learn the same answer of the pick, now and then.
        view = a.learned.pick
        if view is not None and rng.random() < 0.5:
            obs = Observed(rng.choice([None, rng.uniform(0.01, 3.0)]), rng.uniform(0.001, 0.2))
            for r in (new, ref):
                model = r.lifecycle.model
                assert model is not None
                model.update(features(req, view), obs)
    assert compared == 400
    assert (explained > 300) if predictor is not None else (explained == 0)
    assert (nan_faults > 0) if predictor is not None else True


def test_a_views_context_memo_is_its_own() -> None:
    """The audit columns memoised on a view (``NodeView._ctx``) are never carried to a copy, a
    replaced view or an unpickled one, and a memoised view is recorded as a fresh one is."""
    rng = random.Random(4)
    new, _ = _pair(3, {"min_samples": 0}, {}, {})
    views = [_view(rng, i, 0.0) for i in range(30)]
    req = RouteRequest(model="m0", prompt_tokens=100, output_tokens=256)
    first = json.dumps(new.decide(req, views).to_json()["learned"]["ctx"])
    assert any(v._ctx is not None for v in views)
    for v in views:
        for other in (copy.copy(v), copy.deepcopy(v), dataclasses.replace(v), pickle.loads(pickle.dumps(v))):
            assert other._ctx is None and repr(other) == repr(v)
    new2, _ = _pair(3, {"min_samples": 0}, {}, {})
    fresh = [dataclasses.replace(v) for v in views]
    assert json.dumps(new2.decide(req, fresh).to_json()["learned"]["ctx"]) == first


def test_the_context_columns_equal_the_reference_for_any_predictions() -> None:
    """``_ctx`` against the earlier one over views memoised and not, any number of candidates, and
    predictions missing (None), huge, NaN or infinite: the same columns and GPU labels."""
    from inferlb.routing.explain import _ctx
    from tests.routing.routing_reference_learned import _ctx as ref_ctx

    rng = random.Random(8)
    views = [_view(rng, i, 0.0) for i in range(40)]
    odd = [None, (math.nan, 0.01), (math.inf, math.inf), (2e12, 2e9), (1e-7, 1e-10), (0.2, 0.03)]
    for _ in range(400):
        nodes = rng.sample(views, rng.choice([0, 1, 1, 2, 16, 40]))
        preds = [rng.choice(odd) if rng.random() < 0.3 else (rng.uniform(0.01, 5), rng.uniform(1e-4, 0.2))
                 for _ in nodes]
        probs: list[float | None] = [rng.choice([None, rng.random()]) for _ in nodes]
        cols, gpu = _ctx(nodes, preds, probs)
        want = ref_ctx(nodes, preds, probs)
        assert json.dumps(cols) == json.dumps(want) and list(cols) == list(want)
        want_gpu = {n.name: v for n in nodes for k, v in n.labels if k in ("gpu", "gpu_type")}
        assert (gpu or {}) == want_gpu and list(gpu or {}) == list(want_gpu)


def test_a_context_that_cannot_be_recorded_fails_as_before() -> None:
    """Candidates whose values cannot be recorded (a NaN or infinite KV use, an infinite TTFT, a
    speed so small that its TPOT overflows) raise what the earlier context raised: the first bad
    column's error, whichever candidate holds it."""
    from inferlb.routing.explain import _ctx
    from tests.routing.routing_reference_learned import _ctx as ref_ctx

    rng = random.Random(13)
    bad: list[dict[str, Any]] = [{"kv_usage": math.nan}, {"kv_usage": math.inf}, {"ttft_s": -math.inf},
                                 {"tokens_per_s": 5e-324}]
    fails = 0
    for _ in range(300):
        nodes = [_view(rng, i, 0.0) for i in range(rng.choice([1, 2, 5, 16]))]
        for _ in range(rng.choice([1, 2, 3])):
            i = rng.randrange(len(nodes))
            nodes[i] = dataclasses.replace(nodes[i], **rng.choice(bad))
        if rng.random() < 0.5:   # the good ones memoised already, in an earlier context of their own
            for n in nodes:
                try:
                    _ctx([n], [None], [None])
                except Exception:   # a bad one: nothing memoised
                    assert n._ctx is None
        preds: list[tuple[float, float] | None] = [(0.1, 0.01)] * len(nodes)
        got = want = ""
        try:
            _ctx(nodes, preds, [None] * len(nodes))
        except Exception as exc:
            got = f"{type(exc).__name__}: {exc}"
        try:
            ref_ctx(nodes, preds, [None] * len(nodes))
        except Exception as exc:
            want = f"{type(exc).__name__}: {exc}"
        assert got == want
        fails += want != ""
    assert fails > 200


def test_the_bandits_ranking_equals_the_reference_for_any_totals() -> None:
    """``SoftmaxBandit.rank_totals_for`` (what the router calls) and ``rank_for`` against the
    earlier ``rank_for`` over totals with ties, NaN, infinities, signed zeros and ints, every
    exploration rate and never-explore class: the same ranking, ``last`` and generator state."""
    rng = random.Random(21)
    odd: list[Any] = [0.0, -0.0, 1.0, 0.5, math.nan, math.inf, -math.inf, 1, 0, 2.5e-300]
    for _ in range(3000):
        params = SoftmaxBanditParams(epsilon=rng.choice([0.0, 0.05, 0.5, 1.0]),
                                     temperature=rng.choice([0.05, 1.0, 1e-300]))
        new, ref = SoftmaxBandit(params), RefSoftmaxBandit(params)
        n = rng.choice([0, 1, 2, 3, 14, 16])
        totals = [rng.choice(odd) if rng.random() < 0.2 else rng.choice([rng.random(), 0.25, 0.75]) for _ in range(n)]
        views = [_view(rng, i, 0.0) for i in range(n)]
        req = rng.choice([None, RouteRequest(model="m0", prompt_tokens=1, output_tokens=1, priority="critical"),
                          RouteRequest(model="m0", prompt_tokens=1, output_tokens=1)])
        seed = rng.random()
        pairs = list(zip(views, totals, strict=True))
        results = []
        for way in ("totals", "pairs", "reference"):
            ra = random.Random(seed)
            picker: SoftmaxBandit = ref if way == "reference" else new
            try:
                out: Any = picker.rank_totals_for(req, views, totals, ra) if way == "totals" \
                    else picker.rank_for(req, pairs, ra)
            except Exception as exc:
                out = f"{type(exc).__name__}: {exc}"
            results.append((repr(out), repr(picker.last), ra.getstate()))
        assert results[0] == results[2] and results[1] == results[2]


def test_the_feature_rows_equal_the_reference_for_any_view() -> None:
    """``request_part`` / ``node_part`` (their clamps written out) against the earlier ones with
    ``min`` / ``max`` over odd values: KV uses of -0.0, 0, the int 1, True, above 1, NaN and
    infinite; negative, zero and float in-flight counts; zero and negative capacities; odd times
    and labels: the same row, value for value and type for type (``repr``: an int 1 is not 1.0)."""
    from inferlb.routing.features import node_part, request_part

    rng = random.Random(34)
    kvs: list[Any] = [None, math.nan, -0.0, 0.0, 0, 1, 1.0, True, False, 0.5, 1.3, 2, -1, math.inf, -math.inf]
    counts: list[Any] = [-5, -0.5, 0, 0.0, -0.0, 1, 7, 999, 10**6, 3.5]
    caps: list[Any] = [0, -1, 1, 4096, 131072, 0.5]
    for _ in range(3000):
        v = NodeView(
            name="n", models=frozenset({"m0"}), capacity_tokens=rng.choice(caps),
            max_concurrency=4, weight=1.0, inflight_requests=rng.choice(counts),
            inflight_tokens=rng.choice([*counts, 10**9, 4 * 4096]), waiting=rng.choice([None, *counts]),
            kv_usage=rng.choice(kvs), healthy=True, unhealthy_reason=None, labels=rng.choice(_GPU),
            tokens_per_s=rng.choice([None, 0.0, -1.0, 37.5, math.inf, math.nan]),
            ttft_s=rng.choice([None, 0.0, -1.0, 0.3, 2e12, math.inf, math.nan]))
        assert repr(node_part(v)) == repr(ref_node_part(v))
        req = RouteRequest(model="m0", prompt_tokens=rng.choice(counts), output_tokens=rng.choice(counts),
                           priority=rng.choice([None, "critical", "standard"]), stream=rng.random() < 0.5)
        assert repr(request_part(req)) == repr(ref_request_part(req))
        assert repr(features(req, v)) == repr(ref_request_part(req) + ref_node_part(v))


@pytest.mark.parametrize("epsilon", [0.05, 1.0])
def test_candidates_of_one_name_are_explained_as_before(epsilon: float) -> None:
    """Candidates that share a name (a caller's list with a node twice, views of one node old
    and new): the explanation takes the pick's first place among the scored nodes, as
    ``names.index`` did, whichever of them the bandit drew; the same audit copy, exploring or not."""
    new, ref = _pair(5, {"min_samples": 0}, {}, {"epsilon": epsilon})
    rng = random.Random(55)
    views = [_view(rng, i, 0.0) for i in range(12)]
    seen_later = 0
    for _ in range(200):
        twins = [dataclasses.replace(v, inflight_requests=v.inflight_requests + rng.randint(1, 30),
                                     inflight_tokens=v.inflight_tokens + rng.randint(0, 900))
                 for v in rng.sample(views, 4)]
        nodes = list(views) + twins
        rng.shuffle(nodes)
        req = _request(rng)
        a, b = new.decide(req, nodes), ref.decide(req, nodes)
        assert a.learned is not None and b.learned is not None
        b.learned = _as_ref(b.learned)
        assert _json_or_error(a) == _json_or_error(b)
        assert new.rng.getstate() == ref.rng.getstate()
        info = a.learned
        if info.pick is not None:   # both learn the pick's answer: predictions that tell twins apart
            obs = Observed(rng.uniform(0.01, 3.0), rng.uniform(0.001, 0.2))
            for r in (new, ref):
                model = r.lifecycle.model
                assert model is not None
                model.update(features(req, info.pick), obs)
        if info.fallback is None and info.pick is not None:
            first = [n.name for n in info.nodes].index(info.pick.name)
            assert info.pick is info.nodes[first]
            choice = getattr(new.picker, "last", None)
            seen_later += choice is not None and sum(n.name == info.pick.name for n in info.nodes) > 1
    assert seen_later > 0


def test_the_scorer_reads_its_params_as_assigned_after_it_was_built() -> None:
    """``score_all`` reads its params from the model's own dict (routing/learned.py): a params
    field assigned after the scorer was built counts as one given at the start (the same scores,
    slack and terms as a scorer built with it, after it has scored with the earlier value), for
    every field the common case reads."""
    rng = random.Random(77)
    views = [_view(rng, i, 0.0) for i in range(16)]
    model = OnlineLinear()
    changes: list[dict[str, Any]] = [{"e2e_slo_s": 5.0}, {"ttft_slo_s": 0.2}, {"interference": 2.0},
                                     {"interference_max_output": None}, {"reserve": 0.9},
                                     {"prefill_interference": 0.0}, {"miss_weight": 0.5}]
    for change in changes:
        built = PredictedLatency(PredictedLatencyParams(**{**LEARNED_LATENCY, **change}))
        later = PredictedLatency(PredictedLatencyParams(**LEARNED_LATENCY))
        for s in (built, later):
            s.bind(model)
        later.score_all(RouteRequest(model="m0", prompt_tokens=100, output_tokens=16), views)   # before the change
        for k, v in change.items():
            setattr(later.p, k, v)
        for _ in range(20):
            req = _request(rng)
            a, b = built.score_all(req, views), later.score_all(req, views)
            la, lb = built.last, later.last
            assert la is not None and lb is not None
            assert repr((a, la.slack, la.others_s, la.reserved, la.reserve_cut)) == \
                repr((b, lb.slack, lb.others_s, lb.reserved, lb.reserve_cut))
