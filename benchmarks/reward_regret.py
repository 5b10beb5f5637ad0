"""Regret over time of the learned profile with and without its reward bandit (routing/reward.py),
in the discrete-event simulator (docs/benchmarks.md, "Learning from reward").

``python -m benchmarks.reward_regret [--fleet hetero12] [--lengths heavy-tail] [--load 0.85]
[--seeds test|train|1,2] [--requests 12000] [--objective e2e|slo|e2e-per-token] [--plot PNG] [--json]``

One cell of :mod:`benchmarks.matrix` (the same fleets, length families, capacity calibration,
gateway-only view of ``max_tokens`` and output-length predictor). Per seed, the same plan is routed by ``learned``,
``learned`` with the reward bandit (``learned+reward``: arms ``learned`` and ``--arms``, by default
the three fixed profiles; Thompson sampling on the chosen objective) and the fixed profiles (token-aware, power-of-two,
least-connections). **Regret after N requests** = (mean cost of the policy over requests 1..N −
mean cost of the best fixed profile over the same N, that profile chosen in hindsight for that
N) ÷ the latter, pooled over the seeds; the cost of a request is its e2e as the client saw it, or
the client timeout when it did not complete (as :mod:`benchmarks.learned_goals` defines it). The
curve over N is what "learning from reward" must make fall. Also printed: the bandit's share of
``learned`` decisions per window of requests (exploration shrinking as it learns).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.learned_goals import ProfileRun, regret, run_profile
from benchmarks.matrix import FIXED, FLEETS, SEEDS, _families, calibrate
from inferlb.routing.length import LengthPredictor

__all__ = ["main"]

CHECKPOINTS = (250, 500, 1000, 2000, 4000, 8000, 12000, 20000, 40000)


def _pooled_first(runs: list[ProfileRun], n: int) -> list[float]:
    return [c for r in runs for c in r.cost[:n]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fleet", default="hetero12", choices=list(FLEETS))
    ap.add_argument("--lengths", default="heavy-tail")
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--seeds", default="test")
    ap.add_argument("--requests", type=int, default=12_000)
    ap.add_argument("--objective", default="e2e", choices=["e2e", "slo", "e2e-per-token"])
    ap.add_argument("--arms", default="token-aware,power-of-two,least-connections",
                    help="the arms after learned (profiles without a predictor)")
    ap.add_argument("--plot", type=Path, default=None, metavar="PNG")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    fam = _families()[a.lengths]
    w = fam.workload
    seeds = SEEDS[a.seeds] if a.seeds in SEEDS else tuple(int(x) for x in a.seeds.split(","))
    specs = FLEETS[a.fleet]()
    cap: dict[str, float] = {}
    for s in specs:
        if (s.preset or "?") not in cap:
            cap[s.preset or "?"] = calibrate(s.preset or "?", fam)
    capacity = sum(cap[s.preset or "?"] for s in specs)
    rate = a.load * capacity
    duration = a.requests / rate
    fail = w.timeout_s or 60.0
    reward = {"enabled": True, "objective": a.objective, "arms": ["learned", *a.arms.split(",")],
              "slo_ttft_s": w.slo.ttft_s, "slo_e2e_s": w.slo.e2e_s, "failure_cost_s": fail}
    policies: dict[str, tuple[str, dict[str, Any] | None]] = {
        "learned": ("learned", None), "learned+reward": ("learned", {"reward": reward}),
        **{p: (p, None) for p in FIXED}}
    runs: dict[str, list[ProfileRun]] = {p: [] for p in policies}
    for seed in seeds:
        reqs = fam.plan(seed=seed, rate=rate, duration_s=duration, max_requests=a.requests)
        for name, (base, kw) in policies.items():
            r = run_profile(base, specs, reqs, w, seed=seed, duration_s=duration, failure_cost_s=fail,
                            router_kwargs=kw, lengths=LengthPredictor())
            r.results = None
            runs[name].append(r)
    n_max = min(len(r.cost) for rs in runs.values() for r in rs)
    points = [n for n in CHECKPOINTS if n <= n_max] + ([n_max] if n_max not in CHECKPOINTS else [])
    curve: dict[str, list[dict[str, Any]]] = {"learned": [], "learned+reward": []}
    for n in points:
        fixed = {p: _pooled_first(runs[p], n) for p in FIXED}
        for p in curve:
            g = regret(_pooled_first(runs[p], n), fixed, len(fixed[FIXED[0]]))
            curve[p].append({"n": n, "regret": g["regret"], "best": g["best"]})
    # the bandit's share of learned decisions, per window of its decisions in request order
    share: list[dict[str, Any]] = []
    windows = [(lo, hi) for lo, hi in zip((0, *points[:-1]), points, strict=True)]
    for lo, hi in windows:
        picks = [arm for r in runs["learned+reward"] if r.feedback is not None
                 for row, arm in r.feedback.arms if lo <= row < hi]
        if picks:
            share.append({"from": lo, "to": hi, "learned_share": sum(1 for x in picks if x == "learned") / len(picks),
                          "decisions": len(picks)})
    report = {"fleet": a.fleet, "lengths": a.lengths, "load": a.load, "seeds": list(seeds), "requests": a.requests,
              "objective": a.objective, "offered_rps": rate, "curve": curve, "learned_share": share,
              "mean_cost": {p: sum(_pooled_first(rs, n_max)) / (n_max * len(rs)) for p, rs in runs.items()},
              "wall_s": time.perf_counter() - t0}
    if a.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.4))
        for p, pts in curve.items():
            ax.plot([x["n"] for x in pts], [x["regret"] * 100 for x in pts], marker="o", label=p)
        ax.axhline(5, color="grey", ls="--", lw=0.8, label="goal 5 %")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_xscale("log")
        ax.set_xlabel("requests N (log)")
        ax.set_ylabel("regret after N vs best fixed (%)")
        ax.set_title(f"{a.fleet} / {a.lengths} / load {a.load:.0%}, seeds {list(seeds)}", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        a.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(a.plot, dpi=110)
        plt.close(fig)
        report["plot"] = str(a.plot)
    if a.json:
        json.dump(report, sys.stdout, indent=1)
        print()
        return 0
    print(f"{a.fleet} / {a.lengths} / load {a.load:.0%}: {rate:.1f} req/s offered, seeds {list(seeds)}, "
          f"{a.requests} requests each; objective {a.objective}")
    print(f"{'N':>6} " + " ".join(f"{p:>22}" for p in curve))
    for i, n in enumerate(points):
        print(f"{n:>6} " + " ".join(f"{curve[p][i]['regret']:>+13.2%} vs {curve[p][i]['best'][:6]:6}" for p in curve))
    print("bandit: share of decisions given to the learned arm, per window: "
          + ", ".join(f"{s['from']}-{s['to']}: {s['learned_share']:.0%}" for s in share))
    print("mean cost (s): " + ", ".join(f"{p} {v:.3f}" for p, v in report["mean_cost"].items()))
    if "plot" in report:
        print(f"chart: {report['plot']}")
    print(f"wall {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
