"""Output-length prediction: its calibration on the benchmark workloads, and what routing gains
from it when the DES sees only what a gateway knows (docs/benchmarks.md, "Only what a gateway
knows: declared budgets and output-length prediction").

``python -m benchmarks.output_length [--calibration-only] [--train-seeds 1,2,3] [--test-seeds 11,12,13,14,15]
[--requests 10000] [--load 0.85] [--budgets mean,p50,p90] [--json]``

1. **Calibration** (pure, no DES): each workload's plan in arrival order through a
   :class:`~inferlb.routing.length.LengthPredictor`: an estimate for every request from what it
   declares, then the answer's true length observed (the gateway learns each answer once it
   ends; here, at once: an upper bound on how much it has seen). Printed per workload and
   statistic: MAE of the p50 and of the budget (tokens), coverage of the p50 and the p90 (a
   calibrated predictor covers ~0.50 and ~0.90), and the share of estimates from data.
2. **Routing in the DES** (``benchmarks.learned_goals``'s 12-node h100/a100/l4 fleet at
   ``--load`` of its measured capacity, its gateway admission and client timeout): ``learned``
   and ``token-aware`` on the same plans under three conditions: (a) ``oracle``: ``heavy-tail``,
   whose clients declare the exact answer length as ``max_tokens`` (the old benchmark); (b)
   ``declared``: ``heavy-tail-mixed`` (the same requests; most declare no ``max_tokens`` or a
   loose cap; the gateway assumes 256 without one), no predictor; (c) ``predicted``: the same with
   a :class:`~inferlb.routing.length.LengthPredictor` trained online from the completions. The
   predictor's statistic (``--budgets``) is chosen on the TRAINING seeds (lowest mean of learned's and
   token-aware's e2e p99 under (c)); the table is reported on the disjoint TEST seeds, which no
   choice touched. Per condition and profile: e2e p99 (seconds, pooled over the test seeds),
   the ratio learned ÷ token-aware, and the SLO share (requests meeting the workload's SLO).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.learned_goals import fleet, fleet_capacity
from inferlb.bench.des_admission import GatewayAdmission
from inferlb.bench.des_report import des_summary
from inferlb.bench.loadgen.workload import PlannedRequest, Workload, load_workload, plan
from inferlb.config.admission import AdmissionPolicy
from inferlb.routing.length import BudgetStat, LengthPredictor
from inferlb.routing.profiles import build_router
from inferlb.simulator.des.feedback import LearnedFeedback
from inferlb.simulator.des.results import OUTCOMES
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.spec import NodeSpec

__all__ = ["calibrate", "main", "run"]

CALIBRATION_WORKLOADS = ("heavy-tail-mixed", "chat", "bursty", "chat-sessions", "diurnal-bursty")
_OK = OUTCOMES.index("ok")
_STATS: tuple[BudgetStat, ...] = ("mean", "p50", "p90")


def calibrate(w: Workload, budget: BudgetStat, *, seed: int = 1, requests: int = 20_000) -> dict[str, Any]:
    """The predictor's calibration on ``w``'s plan (see the module docstring, step 1)."""
    p = LengthPredictor(budget=budget)
    before = 0.0     # |the gateway's old budget − true|: the declared max_tokens, else the default 256
    # long enough for ``requests`` at the workload's own rate (sessions: turns of sessions at that rate)
    reqs = plan(w, seed=seed, duration_s=1.5 * requests / w.arrival.rate, max_requests=requests)
    for r in reqs:
        before += abs((r.max_tokens if r.max_tokens is not None else 256) - r.answer_tokens)
        e = p.estimate(r.model or w.model, prompt_tokens=r.prompt_tokens, declared=r.max_tokens, default=256,
                       tenant=r.tenant)
        p.observe(r.model or w.model, prompt_tokens=r.prompt_tokens, tokens=r.answer_tokens, tenant=r.tenant,
                  estimate=e)
    return p.calibration.summary() | {"mae_declared": round(before / len(reqs), 1) if reqs else None}


def run(profile: str, specs: Sequence[NodeSpec], reqs: Sequence[PlannedRequest], w: Workload, *, seed: int,
        duration_s: float, budget: BudgetStat | None) -> dict[str, Any]:
    """One seeded DES run; ``budget``: with a predictor of that statistic (None: declared only)."""
    box: list[Simulation] = []
    router = build_router(profile, seed=seed, clock=lambda: box[0].now if box else 0.0)
    fb = LearnedFeedback(router, failure_cost_s=w.timeout_s) if hasattr(router, "lifecycle") else None
    lengths = LengthPredictor(budget=budget) if budget is not None else None
    sim = Simulation(specs, router=router, seed=seed, admission=GatewayAdmission(AdmissionPolicy()), model=w.model,
                     timeout_s=w.timeout_s, feedback=fb, lengths=lengths)
    box.append(sim)
    res = sim.run(reqs)
    s = des_summary(res, w, duration_s=duration_s)
    e2e_ok = [res.e2e[i] for i in range(len(res.t)) if res.outcome[i] == _OK and res.t[i] >= w.warmup_s]
    return {"e2e": e2e_ok, "good": s["good"], "measured": s["measured"],
            "calibration": lengths.calibration.summary() if lengths is not None else None}


def _p99(xs: list[float]) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def _pool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    e2e = [x for r in runs for x in r["e2e"]]
    good, measured = sum(r["good"] for r in runs), sum(r["measured"] for r in runs)
    return {"e2e_p99": round(_p99(e2e), 3), "slo": round(good / measured, 4) if measured else math.nan,
            "per_seed_p99": [round(_p99(r["e2e"]), 3) for r in runs]}


def _conditions(budget: BudgetStat) -> list[tuple[str, str, BudgetStat | None]]:
    return [("oracle", "heavy-tail", None), ("declared", "heavy-tail-mixed", None),
            (f"predicted ({budget})", "heavy-tail-mixed", budget)]


def _table(specs: list[NodeSpec], seeds: list[int], rate: float, n: int,
           conds: list[tuple[str, str, BudgetStat | None]], log: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, wname, budget in conds:
        w = load_workload(wname)
        row: dict[str, Any] = {}
        for profile in ("learned", "token-aware"):
            runs = []
            for seed in seeds:
                duration = n / rate
                reqs = plan(w, seed=seed, rate=rate, duration_s=duration, max_requests=n)
                runs.append(run(profile, specs, reqs, w, seed=seed, duration_s=duration, budget=budget))
            row[profile] = _pool(runs)
            cal = [r["calibration"] for r in runs if r["calibration"] is not None]
            if cal and profile == "learned":
                row["calibration"] = cal[0]
            log(f"  {name:16} {profile:12} e2e p99 {row[profile]['e2e_p99']:.3f} s  SLO {row[profile]['slo']:.4f}",
                flush=True)
        row["ratio"] = round(row["learned"]["e2e_p99"] / row["token-aware"]["e2e_p99"], 3)
        out[name] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration-only", action="store_true")
    ap.add_argument("--train-seeds", default="1,2,3")
    ap.add_argument("--test-seeds", default="11,12,13,14,15")
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--nodes", type=int, default=12)
    ap.add_argument("--budgets", default=",".join(_STATS), help="the statistics tried on the training seeds")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    log = print if not a.json else (lambda *x, **k: None)
    t0 = time.perf_counter()
    report: dict[str, Any] = {"calibration": {}}
    log("calibration (plan order; MAE in tokens; coverage of p50 / p90):")
    for name in CALIBRATION_WORKLOADS:
        w = load_workload(name)
        if name != "heavy-tail-mixed":
            w = w.model_copy(update={"max_tokens": "mix"})   # the realistic mix on every workload
        for stat in _STATS:
            c = calibrate(w, stat)
            report["calibration"][f"{name}/{stat}"] = c
            log(f"  {name:17} {stat:4}  n {c['n']:6}  learned {c['learned']:6}  MAE p50 {c['mae_p50']:7}  "
                f"MAE budget {c['mae_budget']:7} (declared/default: {c['mae_declared']})  "
                f"cover p50 {c['cover_p50']}  p90 {c['cover_p90']}", flush=True)
    if a.calibration_only:
        print(json.dumps(report, indent=1)) if a.json else None
        return 0
    specs = fleet(a.nodes)
    cap, _ = fleet_capacity(specs, load_workload("heavy-tail"), seed=1)
    rate = a.load * cap
    train = [int(x) for x in a.train_seeds.split(",") if x.strip()]
    test = [int(x) for x in a.test_seeds.split(",") if x.strip()]
    if set(train) & set(test):
        print("the training and test seeds must be disjoint", file=sys.stderr)
        return 2
    log(f"fleet {a.nodes} nodes, capacity {cap:.1f} req/s, offered {rate:.1f} ({a.load:.0%}); "
        f"{a.requests} requests a seed; train seeds {train}, test seeds {test}")
    stats = [s for s in _STATS if s in a.budgets.split(",")]
    log("training (choose the predictor's statistic):")
    tried: dict[str, float] = {}
    for stat in stats:
        t = _table(specs, train, rate, a.requests, [(f"predicted ({stat})", "heavy-tail-mixed", stat)], log)
        row = t[f"predicted ({stat})"]
        tried[stat] = (row["learned"]["e2e_p99"] + row["token-aware"]["e2e_p99"]) / 2
    best: BudgetStat = min(stats, key=lambda s: tried[s])
    log(f"chosen on the training seeds: {best} ({', '.join(f'{k} {v:.3f}' for k, v in tried.items())})")
    log("test seeds:")
    report.update({"train_seeds": train, "test_seeds": test, "chosen": best, "training": tried,
                   "capacity_rps": cap, "offered_rps": rate,
                   "test": _table(specs, test, rate, a.requests, _conditions(best), log),
                   "wall_s": round(time.perf_counter() - t0, 1)})
    if a.json:
        print(json.dumps(report, indent=1))
    else:
        print("\n| condition | learned e2e p99 (s) | token-aware e2e p99 (s) | learned ÷ token-aware | "
              "learned SLO | token-aware SLO |\n|---|---:|---:|---:|---:|---:|")
        for name, row in report["test"].items():
            print(f"| {name} | {row['learned']['e2e_p99']:.3f} | {row['token-aware']['e2e_p99']:.3f} | "
                  f"{row['ratio']:.3f} | {row['learned']['slo']:.4f} | {row['token-aware']['slo']:.4f} |")
        for name, row in report["test"].items():
            if "calibration" in row:
                print(f"\nDES calibration, {name}, learned, test seed {test[0]} (estimates in completion order): "
                      f"{json.dumps(row['calibration'])}")
        print(f"\n({report['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
