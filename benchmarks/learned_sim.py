"""Learned routing in virtual time: latency-prediction error by library, and learned vs token-aware.

``python -m benchmarks.learned_sim [--nodes 24] [--load 0.85] [--duration 300] [--seed 1]
[--targets token-aware,learned] [--compare]``

The fleet, workload (``heavy-tail``) and node engine are those of :mod:`benchmarks.routing_sim`
(``BatchCore`` nodes cycling the ``h100`` / ``a100`` / ``l4`` presets, the gateway's
:class:`~inferlb.fleet.state.Fleet` fed as in production); no HTTP, no wall clock, seeded.
With the ``learned`` profile the predictor's lifecycle is fed every answer
(``observe_answer``, the gateway's rule) and trained every ``--train-every`` virtual seconds, as
the gateway's background loop does.

``--compare`` records, for every answered request, the feature row of the chosen node at
decision time and the times the simulator measured, then replays them in order through each
candidate predictor: the built-in :class:`~inferlb.routing.predictor.OnlineLinear`,
river (``LinearRegression`` on standardised features, online), scikit-learn retrained every
``--retrain-every`` records (``Ridge`` and ``HistGradientBoostingRegressor``), and the baseline
"recent EWMA" (the node's own TTFT and 1 / tokens-per-second as the gateway measured them). Each
record is predicted before any model learns from it, and MAPE is reported on the last 30 %
(held out from every model when it was predicted). CPU: µs to predict the 16 candidates of one
decision, and per update. river and scikit-learn are optional (``pip install river
scikit-learn``); a missing one is reported as such.
"""

from __future__ import annotations

import argparse
import heapq
import importlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.routing_sim import _pct
from inferlb.bench.loadgen.workload import load_workload, plan
from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.health.isolation import observe
from inferlb.node_types import Sample
from inferlb.routing.features import FEATURE_NAMES, features
from inferlb.routing.predictor import Observed, OnlineLinear
from inferlb.routing.profiles import build_router
from inferlb.routing.types import RouteRequest
from inferlb.simulator.batching import BatchCore, Seq, SeqState
from inferlb.simulator.presets import PRESETS
from inferlb.types import ManualClock

__all__ = ["Record", "Run", "compare_predictors", "main", "run"]

_CYCLE = ("h100", "a100", "l4")
_MODEL = "sim-llm"


@dataclass
class Record:
    """One answered request: the pick's features at decision time and what was measured."""

    row: list[float]
    stream: bool
    ttft_s: float          # true TTFT (the simulator knows it for every request)
    tpot_s: float | None   # true time per output token after the first
    observed: Observed     # what the gateway would learn from (like with like)


@dataclass
class Run:
    target: str
    completed: int
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    ttft_p99_s: float | None
    goodput: float           # share of requests meeting the workload's SLO
    explored: int
    fallback_decisions: int
    records: list[Record] = field(default_factory=list)


def run(target: str, *, nodes: int, rate: float, duration_s: float, seed: int, scrape_s: float = 5.0,
        train_every_s: float = 0.25, predictor: dict[str, Any] | None = None) -> Run:
    """Route one seeded heavy-tail plan with ``target`` (a profile name)."""
    presets = [PRESETS[_CYCLE[i % 3]] for i in range(nodes)]
    names = [f"{_CYCLE[i % 3]}-{i:04d}" for i in range(nodes)]
    cfg = fleet_from_mapping({
        "models": [{"name": _MODEL}],
        "nodes": [{"name": n, "url": f"http://127.0.0.1:{20000 + i}", "models": [_MODEL],
                   "capacity_tokens": p.kv_tokens, "max_concurrency": p.max_num_seqs}
                  for i, (n, p) in enumerate(zip(names, presets, strict=True))],
    })
    clock = ManualClock()
    fleet = Fleet(cfg, clock)
    router = build_router(target, seed=seed, predictor=predictor)
    lc = getattr(router, "lifecycle", None)
    cores = [BatchCore(p.batch_spec()) for p in presets]
    index = {n: i for i, n in enumerate(names)}
    workload = load_workload("heavy-tail")
    reqs = plan(workload, seed=seed, rate=rate, duration_s=duration_s)
    wake: list[tuple[float, int]] = []
    inflight: dict[int, tuple[int, Seq, int, float, bool, Any, list[float]]] = {}
    out = Run(target, 0, None, None, None, 0.0, 0, 0)
    e2e: list[float] = []
    ttft: list[float] = []
    ok = 0
    start = clock.monotonic()
    next_scrape = start
    next_train = start

    def schedule(i: int) -> None:
        at = cores[i].next_event_at()
        if at is not None:
            heapq.heappush(wake, (at, i))

    def run_nodes_until(t: float) -> None:
        nonlocal ok
        while wake and wake[0][0] <= t:
            at, i = heapq.heappop(wake)
            if cores[i].next_event_at() != at:
                continue
            clock.advance(max(0.0, start + at - clock.monotonic()))
            for seq in cores[i].advance(at).progressed:
                entry = inflight.get(id(seq))
                if entry is None or seq.state is not SeqState.FINISHED:
                    continue
                node, _, tokens, arrived, stream, info, row = entry
                del inflight[id(seq)]
                first = (seq.first_token_at or at) - arrived
                total = (seq.finished_at or at) - arrived
                e2e.append(total)
                if stream:
                    ttft.append(first)
                slo = workload.slo
                ok += (not stream or first <= slo.ttft_s) and total <= slo.e2e_s
                ttfb = first if stream else total
                fleet.report_success(names[node], stream=stream, completion_tokens=seq.generated,
                                     ttfb_s=ttfb, e2e_s=total)
                obs: Observed | None = None
                if lc is not None and info is not None:
                    obs = lc.observe_answer(info.pick_row, info.pick_pred, stream=stream,
                                            completion_tokens=seq.generated, ttfb_s=ttfb, e2e_s=total)
                if obs is None:   # token-aware runs: what the gateway would have learned from
                    st = fleet.nodes[names[node]]
                    tp = ((total - first) / (seq.generated - 1) if stream and seq.generated > 1 else
                          (total - min(st.ttft_ewma or 0.0, total / 2)) / max(1, seq.generated))
                    obs = Observed(first if stream else None, tp)
                tpot = (total - first) / (seq.generated - 1) if seq.generated > 1 else None
                out.records.append(Record(row, stream, first, tpot, obs))
                fleet.release(names[node], tokens)
            schedule(i)

    for r in reqs:
        run_nodes_until(r.t)
        clock.advance(max(0.0, start + r.t - clock.monotonic()))
        now = clock.monotonic()
        while now >= next_scrape:
            observe(fleet, [Sample(n, "metrics", True, now, 0.0,
                                   values={"waiting": len(c.waiting), "kv_usage": c.kv_usage}).to_json()
                            for n, c in zip(names, cores, strict=True)])
            next_scrape += scrape_s
        if lc is not None and now >= next_train:
            lc.train_pending()
            next_train = now + train_every_s
        req = RouteRequest(_MODEL, r.prompt_tokens, r.output_tokens, priority=r.priority, stream=r.stream)
        views = fleet.views()
        d = router.decide(req, views)
        if d.pick is None:
            continue
        info = d.learned
        if info is not None:
            out.explored += bool(info.explored)
            out.fallback_decisions += info.fallback is not None
        i = index[d.pick]
        row = features(req, views[i])
        tokens = r.prompt_tokens + r.output_tokens
        fleet.acquire(d.pick, tokens)
        seq = cores[i].submit(r.prompt_tokens, r.output_tokens, r.t)
        inflight[id(seq)] = (i, seq, tokens, r.t, r.stream, info, row)
        schedule(i)
    run_nodes_until(duration_s * 10)
    out.completed = len(e2e)
    out.e2e_p50_s, out.e2e_p99_s, out.ttft_p99_s = _pct(e2e, 0.5), _pct(e2e, 0.99), _pct(ttft, 0.99)
    out.goodput = ok / max(1, len(reqs))
    return out


# ---------------------------------------------------------------------- predictor comparison


def _mape(pred: list[float], true: list[float]) -> float:
    return float(np.mean([abs(p - t) / t for p, t in zip(pred, true, strict=True)]))


def _online(records: list[Record], predict: Callable[[list[float]], tuple[float, float]],
            update: Callable[[list[float], Observed], None]) -> tuple[list[tuple[float, float]], float, float]:
    preds = []
    t_pred = t_upd = 0.0
    for r in records:
        t0 = time.perf_counter()
        preds.append(predict(r.row))
        t1 = time.perf_counter()
        update(r.row, r.observed)
        t_upd += time.perf_counter() - t1
        t_pred += t1 - t0
    return preds, t_pred / len(records), t_upd / len(records)


def _score(name: str, records: list[Record], preds: list[tuple[float, float]], us_decision: float,
           us_update: float) -> dict[str, Any]:
    cut = int(len(records) * 0.7)
    held = list(range(cut, len(records)))
    ttft_i = [i for i in held if records[i].stream]
    tpot_i = [i for i in held if records[i].tpot_s]
    return {"predictor": name, "ttft_mape": _mape([preds[i][0] for i in ttft_i], [records[i].ttft_s for i in ttft_i]),
            "tpot_mape": _mape([preds[i][1] for i in tpot_i], [records[i].tpot_s or 0 for i in tpot_i]),
            "held_out": len(held), "us_per_decision_16": us_decision, "us_per_update": us_update}


def _bench_16(fn: Callable[[np.ndarray], Any], rows: np.ndarray, n: int = 300) -> float:
    t0 = time.perf_counter()
    for k in range(n):
        fn(rows[(k * 16) % max(1, len(rows) - 16):][:16])
    return (time.perf_counter() - t0) / n * 1e6


def compare_predictors(records: list[Record], retrain_every: int = 500) -> list[dict[str, Any]]:
    """MAPE (held-out last 30 %) and CPU of each candidate predictor over ``records`` in order."""
    results: list[dict[str, Any]] = []
    X = np.asarray([r.row for r in records])
    ti, pi = FEATURE_NAMES.index("log_ttft"), FEATURE_NAMES.index("log_tpot")
    tu, pu = FEATURE_NAMES.index("ttft_unknown"), FEATURE_NAMES.index("tpot_unknown")

    def ewma(row: list[float]) -> tuple[float, float]:
        return (math.exp(row[ti]) if not row[tu] else 0.5, math.exp(row[pi]) if not row[pu] else 0.05)

    preds = [ewma(r.row) for r in records]
    results.append(_score("recent EWMA (baseline)", records, preds, 0.0, 0.0))

    m = OnlineLinear()
    preds, _, upd = _online(records, lambda row: (lambda p: (p.ttft_s, p.tpot_s))(m.predict(row)), m.update)
    from inferlb.routing.types import NodeView
    views = [NodeView(name=f"n{i}", models=frozenset({_MODEL}), capacity_tokens=100_000, max_concurrency=64,
                      inflight_requests=i, inflight_tokens=1000 * i, tokens_per_s=30.0 + i, ttft_s=0.1 + i / 100)
             for i in range(16)]
    req = RouteRequest(_MODEL, 400, 256, stream=True)
    m._node_cache.clear()
    t0 = time.perf_counter()
    for _ in range(300):
        m._node_cache.clear()    # worst case: every candidate's view changed since the last decision
        m.predict_nodes(req, views)
    us_cold = (time.perf_counter() - t0) / 300 * 1e6
    t0 = time.perf_counter()
    for _ in range(300):
        m.predict_nodes(req, views)
    us_warm = (time.perf_counter() - t0) / 300 * 1e6
    res = _score("online-linear (numpy, built in)", records, preds, us_cold, upd * 1e6)
    res["us_per_decision_16_cached"] = us_warm
    results.append(res)

    try:
        # optional: only this comparison uses it
        rpre: Any = importlib.import_module("river.preprocessing")
        rlin: Any = importlib.import_module("river.linear_model")
        ropt: Any = importlib.import_module("river.optim")
    except ImportError:
        results.append({"predictor": "river", "error": "not installed"})
    else:
        rm = [rpre.StandardScaler() | rlin.LinearRegression(optimizer=ropt.SGD(0.01)) for _ in range(2)]
        keys = list(FEATURE_NAMES)

        def rpred(row: list[float]) -> tuple[float, float]:
            x = dict(zip(keys, row, strict=True))
            return (math.exp(min(6.0, rm[0].predict_one(x))), math.exp(min(6.0, rm[1].predict_one(x))))

        def rupd(row: list[float], o: Observed) -> None:
            x = dict(zip(keys, row, strict=True))
            if o.ttft_s:
                rm[0].learn_one(x, math.log(o.ttft_s))
            if o.tpot_s and o.tpot_s > 0:
                rm[1].learn_one(x, math.log(o.tpot_s))

        preds, _, upd = _online(records, rpred, rupd)
        us = _bench_16(lambda rows: [rpred(list(r)) for r in rows], X)
        results.append(_score("river LinearRegression (online)", records, preds, us, upd * 1e6))

    try:
        ensemble: Any = importlib.import_module("sklearn.ensemble")
        linear: Any = importlib.import_module("sklearn.linear_model")
    except ImportError:
        results.append({"predictor": "scikit-learn", "error": "not installed"})
    else:
        makers: list[tuple[str, Callable[[], Any]]] = [
            ("scikit-learn Ridge (retrained)", lambda: linear.Ridge(alpha=1.0)),
            ("scikit-learn HistGradientBoosting (retrained)",
             lambda: ensemble.HistGradientBoostingRegressor(max_iter=100))]
        for label, make in makers:
            preds = []
            models: list[Any] = [None, None]
            fit_s = 0.0
            for k in range(0, len(records), retrain_every):
                chunk = X[k:k + retrain_every]
                if models[0] is None:
                    preds.extend(ewma(list(r)) for r in chunk)
                else:
                    a = np.exp(np.clip(models[0].predict(chunk), -12, 6))
                    b = np.exp(np.clip(models[1].predict(chunk), -12, 6))
                    preds.extend(zip(a.tolist(), b.tolist(), strict=True))
                seen = records[:k + retrain_every]
                t0 = time.perf_counter()
                for j, attr in enumerate(("ttft_s", "tpot_s")):
                    idx = [i for i, r in enumerate(seen) if getattr(r.observed, attr)]
                    if len(idx) >= 20:
                        mdl = make()
                        mdl.fit(X[idx], np.log([getattr(seen[i].observed, attr) for i in idx]))
                        models[j] = mdl
                fit_s += time.perf_counter() - t0
            if models[0] is None or models[1] is None:
                continue
            m0, m1 = models
            def both(rows: np.ndarray, m0: Any = m0, m1: Any = m1) -> Any:
                return m0.predict(rows), m1.predict(rows)

            us = _bench_16(both, X, 100)
            res = _score(label, records, preds, us, 0.0)
            res["fit_s_total"] = fit_s
            results.append(res)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--rate", type=float, default=None, help="requests/s (default: 1.2 per node)")
    ap.add_argument("--duration", type=float, default=300.0, help="virtual seconds of arrivals")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--targets", default="token-aware,learned")
    ap.add_argument("--compare", action="store_true", help="compare predictors on the first target's records")
    ap.add_argument("--retrain-every", type=int, default=500)
    a = ap.parse_args(argv)
    rate = a.rate if a.rate is not None else 1.2 * a.nodes
    print(f"{a.nodes} nodes, heavy-tail at {rate:g} req/s for {a.duration:g} s (virtual), seed {a.seed}")
    print(f"{'target':14} {'done':>6} {'e2e p50':>8} {'e2e p99':>8} {'TTFT p99':>9} {'goodput':>8} "
          f"{'explored':>8} {'fallback':>8}")
    runs = []
    for target in a.targets.split(","):
        r = run(target, nodes=a.nodes, rate=rate, duration_s=a.duration, seed=a.seed)
        runs.append(r)

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"

        print(f"{r.target:14} {r.completed:6d} {f(r.e2e_p50_s):>8} {f(r.e2e_p99_s):>8} {f(r.ttft_p99_s):>9} "
              f"{r.goodput:8.3f} {r.explored:8d} {r.fallback_decisions:8d}", flush=True)
    if a.compare and runs:
        recs = runs[0].records
        print(f"\npredictors over {len(recs)} answers of {runs[0].target} (MAPE on the last 30 %, held out)")
        print(f"{'predictor':46} {'TTFT MAPE':>9} {'TPOT MAPE':>9} {'µs/16 pred':>10} {'µs/update':>9}")
        for res in compare_predictors(recs, a.retrain_every):
            if "error" in res:
                print(f"{res['predictor']:46} {res['error']}")
                continue
            print(f"{res['predictor']:46} {res['ttft_mape']:9.3f} {res['tpot_mape']:9.3f} "
                  f"{res['us_per_decision_16']:10.1f} {res['us_per_update']:9.1f}"
                  + (f"  (cached views: {res['us_per_decision_16_cached']:.1f} µs)"
                     if "us_per_decision_16_cached" in res else "")
                  + (f"  (fits: {res['fit_s_total']:.1f} s in all)" if "fit_s_total" in res else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
