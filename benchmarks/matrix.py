"""The routing scenario matrix in the discrete-event simulator (docs/benchmarks.md, "The scenario
matrix"): loads × fleets × output-length families × seeds, each cell run by every profile on the
same plan, with per-cell goals and a heat map.

``python -m benchmarks.matrix [--loads 0.6,0.75,0.85,0.9,0.95] [--fleets hetero12,homog12,fast2slow10]
[--lengths heavy-tail,lognormal,bimodal] [--seeds test|train|1,2,3] [--requests 3000]
[--profiles learned,token-aware,power-of-two,least-connections] [--plot DIR] [--json]
[--max-seconds 1800]``

What it does, all in virtual time (:class:`~inferlb.simulator.des.sim.Simulation`, seeded):

* **Cells.** A fleet (``hetero12``: 12 nodes h100/a100/l4 in turn; ``homog12``: 12 × a100;
  ``fast2slow10``: 2 × h100 + 10 × l4), a length family (``heavy-tail``: lognormal prompts,
  Pareto answers; ``lognormal``: lognormal prompts and answers; ``bimodal``: 80 % short chat turns
  and 20 % long documents with long answers, two arrival streams merged) and a load (offered rate
  ÷ the fleet's capacity, each preset's saturated throughput measured alone in the DES on that
  length family, as ``benchmarks.learned_goals`` does).
* **Only what a gateway knows.** Every workload declares ``max_tokens`` as real clients do
  (``max_tokens: mix``: most none, many a loose cap, few the exact length; the shares are
  assumptions, :class:`~inferlb.bench.loadgen.workload.MaxTokensMix`): routing sees the declared
  field and the gateway's history, never the true length.
* **Runs.** Per cell and seed, every profile routes the same plan with the gateway's admission
  rules and, as the gateway does by default (``routing.output_length``), counts each request's
  output budget by the output-length predictor trained online from the answers (a fresh one per
  run; ``--declared`` counts the declared budgets instead); ``learned`` starts cold with its
  feedback loop (:mod:`benchmarks.learned_goals`).
* **Figures per cell** (mean over seeds): e2e p99 and mean (completed requests), TTFT p99
  (streams), goodput, SLO share, requests not completed, and the mean *cost* (e2e, or the client
  timeout for a request that did not complete) from which regret is computed: learned's mean cost
  against the best fixed profile's over the same requests, pooled over the cell's seeds.
* **Goals** (issue 22): learned e2e p99 ≤ 0.85 × token-aware's, mean e2e ≤ 1.0 × and goodput ≥
  token-aware's in ≥ 90 % of cells; regret < 5 % in every cell. Each printed per cell and in total.

**Seeds.** ``train`` = 1–5, the seeds any setting of the learned profile may be chosen on;
``test`` = 101–105 (the default), which no tuning touched. Nothing in this script tunes: the
profiles run with their shipped settings, the learned ones told the workload's SLO as a fleet
file would tell them (the reward bandit's ``slo_*``; the ``predicted-latency`` scorer's
``miss_ttft_s`` / ``miss_e2e_s``, read only when its ``miss_weight`` or ``risk_weight`` is on,
both off as shipped).

``--max-seconds`` bounds the wall time: cells not started by then are reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.learned_goals import ProfileRun, regret, run_profile
from inferlb.bench.loadgen.workload import PlannedRequest, Workload, load_workload, plan
from inferlb.routing.length import LengthPredictor
from inferlb.simulator.des.results import OUTCOMES
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.presets import preset_spec
from inferlb.simulator.spec import NodeSpec

__all__ = ["FLEETS", "LENGTHS", "SEEDS", "Family", "calibrate", "main", "run_cell"]

SEEDS = {"train": (1, 2, 3, 4, 5), "test": (101, 102, 103, 104, 105)}
# Variants of a profile run by another name: (profile, build_router keyword arguments).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "learned+reward": ("learned", {"reward": {"enabled": True}}),
    "learned+reward-slo": ("learned", {"reward": {"enabled": True, "objective": "slo"}}),
}
FIXED = ("token-aware", "power-of-two", "least-connections")
_OK = OUTCOMES.index("ok")


def _cycle(n: int, presets: Sequence[str]) -> list[NodeSpec]:
    return [preset_spec(f"{presets[i % len(presets)]}-{i:04d}", presets[i % len(presets)]) for i in range(n)]


FLEETS: dict[str, Callable[[], list[NodeSpec]]] = {
    "hetero12": lambda: _cycle(12, ("h100", "a100", "l4")),
    "homog12": lambda: _cycle(12, ("a100",)),
    "fast2slow10": lambda: _cycle(2, ("h100",)) + [preset_spec(f"l4-{i:04d}", "l4") for i in range(2, 12)],
}


@dataclass(frozen=True)
class Family:
    """An output-length family: one workload, or two merged (``share`` of the first)."""

    name: str
    first: Workload
    second: Workload | None = None
    share: float = 1.0

    @property
    def workload(self) -> Workload:
        """The workload whose SLO, timeout and warm-up the figures use."""
        return self.first

    def plan(self, *, seed: int, rate: float, duration_s: float, max_requests: int) -> list[PlannedRequest]:
        if self.second is None:
            return plan(self.first, seed=seed, rate=rate, duration_s=duration_s, max_requests=max_requests)
        a = plan(self.first, seed=seed, rate=rate * self.share, duration_s=duration_s, max_requests=max_requests)
        b = plan(self.second, seed=seed + 7919, rate=rate * (1 - self.share), duration_s=duration_s,
                 max_requests=max_requests)
        return sorted(a + b, key=lambda r: r.t)[:max_requests]


def _families() -> dict[str, Family]:
    heavy = load_workload("heavy-tail-mixed")
    logn = heavy.model_copy(update={
        "name": "lognormal",
        "output_tokens": heavy.output_tokens.model_copy(update={"dist": "lognormal", "median": 120.0,
                                                                  "sigma": 1.0, "min": 8, "max": 2000})})
    chat = heavy.model_copy(update={
        "name": "bimodal",
        "prompt_tokens": heavy.prompt_tokens.model_copy(update={"median": 300.0, "sigma": 0.6, "max": 2000}),
        "output_tokens": heavy.output_tokens.model_copy(update={"dist": "lognormal", "median": 80.0,
                                                                  "sigma": 0.5, "min": 8, "max": 600})})
    long = chat.model_copy(update={
        "prompt_tokens": heavy.prompt_tokens.model_copy(update={"median": 3000.0, "sigma": 0.3, "max": 6000}),
        "output_tokens": heavy.output_tokens.model_copy(update={"dist": "lognormal", "median": 700.0,
                                                                  "sigma": 0.4, "min": 64, "max": 2000})})
    return {"heavy-tail": Family("heavy-tail", heavy), "lognormal": Family("lognormal", logn),
            "bimodal": Family("bimodal", chat, long, 0.8)}


LENGTHS = tuple(_families())


def calibrate(preset: str, fam: Family, *, seed: int = 1, duration_s: float = 120.0, warm_s: float = 30.0
              ) -> float:
    """Saturated completions per second of one ``preset`` node on ``fam`` (offered more until its
    queue is never empty), as :func:`benchmarks.learned_goals.node_capacity` measures it."""
    offered = 30.0
    for _ in range(6):
        reqs = fam.plan(seed=seed, rate=offered, duration_s=duration_s, max_requests=1_000_000)
        sim = Simulation([preset_spec("cal", preset)], profile="round-robin", seed=seed, model=fam.workload.model)
        res = sim.run(reqs, until=duration_s)
        if sim.nodes_info()[0].waiting > 0:
            done = sum(1 for i in range(len(res.t))
                       if res.outcome[i] == _OK and warm_s <= res.t[i] + res.e2e[i] <= duration_s)
            return done / (duration_s - warm_s)
        offered *= 2
    raise ValueError(f"{preset}: {offered} req/s did not saturate one node")


def _mean(xs: Sequence[float]) -> float:
    ys = [x for x in xs if not math.isnan(x)]
    return sum(ys) / len(ys) if ys else math.nan


def _figures(runs: Sequence[ProfileRun]) -> dict[str, float]:
    s = [r.summary for r in runs]
    return {"e2e_p99": _mean([x["e2e_s"]["p99"] for x in s]), "e2e_mean": _mean([x["e2e_s"]["mean"] for x in s]),
            "ttft_p99": _mean([x["ttft_s"]["p99"] for x in s]), "goodput": _mean([x["goodput_rps"] for x in s]),
            "slo": _mean([x["slo_attainment"] for x in s]),
            "not_ok": _mean([float(x["measured"] - x["outcomes"]["ok"]) for x in s]),
            "cost": _mean([sum(r.cost) / len(r.cost) for r in runs])}


def _with_slo(kw: dict[str, Any], w: Workload) -> dict[str, Any]:
    """``kw`` with this workload's SLO as the predicted-latency scorer's miss budgets
    (``miss_ttft_s``, ``miss_e2e_s``), as a fleet file's ``routing.params`` would give them; a
    variant's own values win."""
    params = kw.get("params") or {}
    pl = {"miss_ttft_s": w.slo.ttft_s, "miss_e2e_s": w.slo.e2e_s, **params.get("predicted-latency", {})}
    return {**kw, "params": {**params, "predicted-latency": pl}}


def run_cell(fleet: str, fam: Family, load: float, seeds: Sequence[int], profiles: Sequence[str], *,
             requests: int, capacity: float, lengths: bool = True) -> dict[str, Any]:
    """Every profile on the same plans of one cell; figures, regret and the cell's verdicts."""
    specs = FLEETS[fleet]()
    rate = load * capacity
    duration = requests / rate
    w = fam.workload
    fail_cost = w.timeout_s or 60.0
    runs: dict[str, list[ProfileRun]] = {p: [] for p in profiles}
    t0 = time.perf_counter()
    for seed in seeds:
        reqs = fam.plan(seed=seed, rate=rate, duration_s=duration, max_requests=requests)
        for p in profiles:
            base, kw = VARIANTS.get(p, (p, {}))
            if "reward" in kw:   # the SLO and timeout of this workload
                kw = {**kw, "reward": {**kw["reward"], "slo_ttft_s": w.slo.ttft_s, "slo_e2e_s": w.slo.e2e_s,
                                       "failure_cost_s": fail_cost}}
            if base == "learned":
                kw = _with_slo(kw, w)
            r = run_profile(base, specs, reqs, w, seed=seed, duration_s=duration, failure_cost_s=fail_cost,
                            router_kwargs=kw or None, lengths=LengthPredictor() if lengths else None)
            r.profile = p
            r.results = None             # the figures are kept; the per-request arrays are not needed
            runs[p].append(r)
    cell: dict[str, Any] = {"fleet": fleet, "lengths": fam.name, "load": load, "seeds": list(seeds),
                            "offered_rps": rate, "capacity_rps": capacity,
                            "profiles": {p: _figures(rs) for p, rs in runs.items()},
                            "wall_s": time.perf_counter() - t0}
    fixed = [p for p in profiles if p in FIXED]
    if "learned" in runs and fixed:
        pooled_f = {p: [c for r in runs[p] for c in r.cost] for p in fixed}
        for p in (x for x in runs if x == "learned" or x in VARIANTS):
            g = regret([c for r in runs[p] for c in r.cost], pooled_f, len(pooled_f[fixed[0]]))
            key = "regret" if p == "learned" else f"regret[{p}]"
            cell[key] = {"value": g["regret"], "best": g["best"]}
    if "learned" in runs and "token-aware" in runs:
        lp, tp = cell["profiles"]["learned"], cell["profiles"]["token-aware"]
        cell["ratio"] = {"e2e_p99": lp["e2e_p99"] / tp["e2e_p99"], "e2e_mean": lp["e2e_mean"] / tp["e2e_mean"],
                         "goodput": lp["goodput"] / tp["goodput"] if tp["goodput"] else math.nan}
        cell["verdict"] = {"p99 ≤ 0.85×": cell["ratio"]["e2e_p99"] <= 0.85,
                           "mean ≤ 1.0×": cell["ratio"]["e2e_mean"] <= 1.0,
                           "goodput ≥": lp["goodput"] >= tp["goodput"],
                           "regret < 5 %": cell.get("regret", {}).get("value", math.inf) < 0.05}
    return cell


def _summary(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    judged = [c for c in cells if "verdict" in c]
    if not judged:
        return {}
    n = len(judged)
    share = {k: sum(bool(c["verdict"][k]) for c in judged) / n for k in judged[0]["verdict"]}
    return {"cells": n, "share_met": share,
            "goal: p99, mean and goodput in ≥ 90 % of cells": all(
                share[k] >= 0.9 for k in ("p99 ≤ 0.85×", "mean ≤ 1.0×", "goodput ≥")),
            "goal: regret < 5 % in every cell": share["regret < 5 %"] == 1.0}


def _f(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _print_cell(c: dict[str, Any]) -> None:
    head = f"{c['fleet']:11} {c['lengths']:10} load {c['load']:.0%}"
    parts = [f"{p} p99 {_f(s['e2e_p99'], '.2f')} mean {_f(s['e2e_mean'], '.2f')} gp {_f(s['goodput'], '.2f')}"
             for p, s in c["profiles"].items()]
    ver = ""
    if "verdict" in c:
        r = c["ratio"]
        extra = "".join(f"; {k} {v['value']:+.1%}" for k, v in c.items() if k.startswith("regret["))
        ver = (f" | learned÷TA p99 {r['e2e_p99']:.3f} mean {r['e2e_mean']:.3f} goodput {r['goodput']:.3f}; "
               f"regret {c['regret']['value']:+.1%} vs {c['regret']['best']}{extra}; "
               + " ".join(f"{k}:{'ok' if v else 'MISS'}" for k, v in c["verdict"].items()))
    print(f"{head} ({c['wall_s']:.0f} s) " + "; ".join(parts) + ver, flush=True)


def plot_matrix(cells: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Heat maps (needs the plot extra): learned ÷ token-aware e2e p99 and regret per cell, one
    panel per length family (rows: fleets, columns: loads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fams = sorted({c["lengths"] for c in cells})
    fleets = sorted({c["fleet"] for c in cells})
    loads = sorted({c["load"] for c in cells})
    paths: list[Path] = []
    for metric, title, goal in (("p99", "learned ÷ token-aware e2e p99 (goal ≤ 0.85)", 0.85),
                                ("regret", "regret vs the best fixed profile (goal < 5 %)", 0.05)):
        fig, axes = plt.subplots(1, len(fams), figsize=(4.2 * len(fams), 3.2), squeeze=False)
        for ax, fam in zip(axes[0], fams, strict=True):
            grid = [[math.nan] * len(loads) for _ in fleets]
            for c in cells:
                if c["lengths"] != fam or "ratio" not in c:
                    continue
                v = c["ratio"]["e2e_p99"] if metric == "p99" else c["regret"]["value"]
                grid[fleets.index(c["fleet"])][loads.index(c["load"])] = v
            lo, hi = (0.6, 1.1) if metric == "p99" else (-0.1, 0.2)
            im = ax.imshow(grid, cmap="RdYlGn_r", vmin=lo, vmax=hi, aspect="auto")
            for i in range(len(fleets)):
                for j in range(len(loads)):
                    v = grid[i][j]
                    if not math.isnan(v):
                        txt = f"{v:.2f}" if metric == "p99" else f"{v:+.0%}"
                        ax.text(j, i, txt + ("" if (v <= goal if metric == "p99" else v < goal) else " ✗"),
                                ha="center", va="center", fontsize=8)
            ax.set_xticks(range(len(loads)), [f"{x:.0%}" for x in loads])
            ax.set_yticks(range(len(fleets)), fleets)
            ax.set_title(fam, fontsize=9)
            fig.colorbar(im, ax=ax, fraction=0.046)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        p = out_dir / f"matrix-{metric}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def _seeds(text: str) -> tuple[int, ...]:
    if text in SEEDS:
        return SEEDS[text]
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loads", default="0.6,0.75,0.85,0.9,0.95")
    ap.add_argument("--fleets", default=",".join(FLEETS))
    ap.add_argument("--lengths", default=",".join(LENGTHS))
    ap.add_argument("--seeds", default="test", help="train (1-5), test (101-105, default) or a list")
    ap.add_argument("--requests", type=int, default=3000, help="requests per run (per seed and profile)")
    ap.add_argument("--profiles", default="learned," + ",".join(FIXED))
    ap.add_argument("--max-seconds", type=float, default=1800.0)
    ap.add_argument("--declared", action="store_true", help="count declared budgets (no output-length predictor)")
    ap.add_argument("--plot", type=Path, default=None, metavar="DIR", help="heat maps (needs the plot extra)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    loads = [float(x) for x in a.loads.split(",")]
    fleets = [x for x in a.fleets.split(",") if x]
    fams = _families()
    lengths = [x for x in a.lengths.split(",") if x]
    for name, table in (("fleet", FLEETS), ("lengths", fams)):
        bad = [x for x in (fleets if name == "fleet" else lengths) if x not in table]
        if bad:
            ap.error(f"unknown {name} {bad}; known: {', '.join(table)}")
    seeds = _seeds(a.seeds)
    profiles = [p for p in a.profiles.split(",") if p]
    say = (lambda *x, **k: None) if a.json else print
    cap_of: dict[tuple[str, str], float] = {}
    cells: list[dict[str, Any]] = []
    skipped: list[str] = []
    for fam_name in lengths:
        fam = fams[fam_name]
        for fleet in fleets:
            specs = FLEETS[fleet]()
            for s in specs:
                key = (s.preset or "?", fam_name)
                if key not in cap_of:
                    cap_of[key] = calibrate(key[0], fam)
            capacity = sum(cap_of[(s.preset or "?", fam_name)] for s in specs)
            for load in loads:
                if time.perf_counter() - t_start > a.max_seconds:
                    skipped.append(f"{fleet}/{fam_name}/{load:g}")
                    continue
                c = run_cell(fleet, fam, load, seeds, profiles, requests=a.requests, capacity=capacity,
                             lengths=not a.declared)
                cells.append(c)
                if not a.json:
                    _print_cell(c)
    report: dict[str, Any] = {"seeds": list(seeds), "requests": a.requests, "profiles": profiles,
                              "budgets": "declared" if a.declared else "output-length predictor",
                              "capacity_rps_per_node": {f"{p}/{f}": v for (p, f), v in cap_of.items()},
                              "cells": cells, "skipped": skipped, "summary": _summary(cells)}
    if a.plot is not None and cells:
        report["plots"] = [str(p) for p in plot_matrix(cells, a.plot)]
    report["wall_s"] = time.perf_counter() - t_start
    if a.json:
        json.dump(report, sys.stdout, indent=1, default=lambda x: None)
        print()
        return 0
    sm = report["summary"]
    if sm:
        say(f"\n{sm['cells']} cells, seeds {list(seeds)}, {a.requests} requests per run: share of cells meeting "
            + ", ".join(f"{k} {v:.0%}" for k, v in sm["share_met"].items()))
        for k in ("goal: p99, mean and goodput in ≥ 90 % of cells", "goal: regret < 5 % in every cell"):
            say(f"{k}: {'met' if sm[k] else 'NOT met'}")
    if skipped:
        say(f"skipped (wall-time bound): {', '.join(skipped)}")
    for p in report.get("plots", []):
        say(f"chart: {p}")
    say(f"wall {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
