"""Autoscaling on six trace shapes × held-out seeds against the offline optimum (issue 22, item 7).

``python -m benchmarks.autoscale_traces [--split test|train] [--seeds 11,12] [--shapes diurnal,...]
[--shape-seeds SHAPE=S1,S2] [--policies reactive,predictive,oracle] [--peak 4] [--target-utilisation U] [--headroom H]
[--scale-down-stabilisation S] [--burst-factor B|off] [--skill-window N|off] [--level-shift K,Z|off]
[--rise-ratio R|off] [--release-quantile Q[,N]|off] [--reactive-targets 0.8,0.85]
[--jobs 1] [--cells FILE.jsonl] [--plot docs/autoscale-traces.png]
[--json]``

``--skill-window``, ``--level-shift``, ``--rise-ratio`` and ``--release-quantile`` are
``predictive``'s alone (the skill gate, :mod:`inferlb.autoscale.skill`; the level-shift guard,
:mod:`inferlb.autoscale.shift`; the planner's rise path; the forecast's upper band that releases
a scale-down before the stabilisation window ends, :mod:`inferlb.autoscale.release`; defaults:
:class:`~inferlb.bench.autoscale_backtest.BacktestOptions`'), so they are part of the reuse key
of ``predictive`` cells only: the other policies' cells stay valid across them (and
``--release-quantile`` is in the key only when set, so cells made before it existed stay valid).

Every (shape, seed, policy) cell is one discrete-event backtest
(:mod:`inferlb.bench.autoscale_traces`, the shapes in :mod:`inferlb.bench.autoscale_shapes`);
printed per shape and policy, means over the seeds: SLO attainment (and its worst seed), SLO
over the shape's events (flash crowds, steps, bumps), GPU-hours, the offline optimum, the ratio
to it and to reactive's, the longest lag from an event beyond the replicas in place to its first
scale-up; then the goals per shape for ``predictive``, met or not. ``--reactive-targets`` adds
``reactive`` runs at other target utilisations (``reactive@U``): the points that "GPU-hours ≤
reactive's at equal SLO" interpolates between (:func:`inferlb.bench.autoscale_traces.reactive_at`).

**Seeds are split**: ``train`` seeds (1, 2) are the only ones any setting was tuned on;
``test`` seeds (11, 12) are the ones reported (docs/benchmarks.md says which was run).
``--cells FILE.jsonl`` appends each finished cell as one JSON line and reuses the cells already
in it with the same settings (a run cut short resumes). Bounded run time: at ``--peak 4`` one seed
of the six shapes is ~3.5 M requests, ~4.5 min of CPU per policy (Holt-Winters' fits add ~5 min to
``predictive``); ``--jobs N`` runs N cells at once; ``--shape-seeds`` gives a shape its own seeds
(docs/benchmarks.md, "Autoscaling on six trace shapes", ran the 7-day shapes on one test seed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from inferlb.bench.autoscale_backtest import BacktestOptions
from inferlb.bench.autoscale_shapes import SHAPES
from inferlb.bench.autoscale_traces import cell, format_table, summarise_cells, verdicts

__all__ = ["SPLITS", "main"]

SPLITS = {"train": (1, 2), "test": (11, 12)}
# One replica's tokens/s at SLO for diurnal-bursty's request lengths on an l4 with 4 sequences
# (calibrated by `inferlb autoscale backtest`, docs/benchmarks.md "Autoscaling backtests").
CAPACITY_TOKENS_S = 309.4


def _list(raw: str, known: tuple[str, ...] | None = None) -> list[str]:
    out = [x.strip() for x in raw.split(",") if x.strip()]
    if known is not None:
        bad = [x for x in out if x not in known]
        if bad:
            raise SystemExit(f"unknown: {', '.join(bad)} (known: {', '.join(known)})")
    return out


def _key(shape: str, seed: int, policy: str, settings: dict[str, Any]) -> str:
    return json.dumps([shape, seed, policy, settings], sort_keys=True)


def _run(args: tuple[str, int, str, BacktestOptions, float, float]) -> dict[str, Any]:
    shape, seed, label, opts, peak, cap = args
    t0 = time.process_time()
    out = cell(shape, seed, label.partition("@")[0], opts, peak=peak, capacity_tokens_s=cap)
    out["policy"] = label
    out["cpu_s"] = round(time.process_time() - t0, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.autoscale_traces", description=__doc__.split("\n")[0])
    ap.add_argument("--split", choices=sorted(SPLITS), default="test")
    ap.add_argument("--seeds", help="comma-separated seeds (default: the split's)")
    ap.add_argument("--shape-seeds", dest="shape_seeds", action="append", default=[],
                    help="SHAPE=S1,S2: that shape's seeds instead (repeatable)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--policies", default="reactive,predictive,oracle")
    ap.add_argument("--peak", type=float, default=4.0, help="the shapes' peak, requests/s")
    ap.add_argument("--capacity-tokens-s", dest="cap", type=float, default=CAPACITY_TOKENS_S)
    ap.add_argument("--forecaster", default="holt-winters")
    ap.add_argument("--target-utilisation", dest="target_utilisation", type=float)
    ap.add_argument("--headroom", type=float)
    ap.add_argument("--scale-down-stabilisation", dest="scale_down_stabilisation_s", type=float)
    ap.add_argument("--burst-factor", dest="burst_factor", default=None, help="a factor, or off")
    ap.add_argument("--level-shift", dest="level_shift", default=None,
                    help="predictive's level-shift guard: K,Z (K steps beyond Z sigma), or off")
    ap.add_argument("--skill-window", dest="skill_window", default=None,
                    help="predictive's skill gate: its window in steps, or off")
    ap.add_argument("--rise-ratio", dest="rise_ratio", default=None,
                    help="predictive's rise path: the last round over the last step's load, or off")
    ap.add_argument("--release-quantile", dest="release_quantile", default=None,
                    help="predictive's upper band that releases a scale-down before the stabilisation "
                         "window ends: Q (a quantile of its one-step errors)[,N (at least the largest of "
                         "the last N)], or off")
    ap.add_argument("--reactive-targets", dest="reactive_targets", default="",
                    help="comma-separated target utilisations of extra reactive runs (reactive@U)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--cells", type=Path, help="a JSON-lines file of finished cells (appended, reused)")
    ap.add_argument("--plot", type=Path, help="write the per-shape chart (PNG) here")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in _list(a.seeds)] if a.seeds else list(SPLITS[a.split])
    shapes = _list(a.shapes, SHAPES)
    policies = _list(a.policies, ("static", "reactive", "predictive", "oracle"))
    opts = BacktestOptions(forecaster=a.forecaster, target_utilisation=a.target_utilisation, headroom=a.headroom,
                           scale_down_stabilisation_s=a.scale_down_stabilisation_s)
    if a.burst_factor is not None:
        opts = replace(opts, burst_factor=None if a.burst_factor == "off" else float(a.burst_factor))
    if a.level_shift is not None:
        if a.level_shift == "off":
            opts = replace(opts, level_shift=None)
        else:
            k, _, z = a.level_shift.partition(",")
            opts = replace(opts, level_shift=(int(k), float(z or 3.0)))
    if a.skill_window is not None:
        opts = replace(opts, skill_window=None if a.skill_window == "off" else int(a.skill_window))
    if a.rise_ratio is not None:
        opts = replace(opts, rise_ratio=None if a.rise_ratio == "off" else float(a.rise_ratio))
    if a.release_quantile is not None:
        q, _, recent = a.release_quantile.partition(",")
        opts = replace(opts, release_quantile=None if q == "off" else float(q), release_recent=int(recent or 0))
    settings = {"peak": a.peak, "cap": a.cap, "forecaster": a.forecaster, "target_utilisation": a.target_utilisation,
                "headroom": a.headroom, "scale_down_stabilisation_s": a.scale_down_stabilisation_s,
                "burst_factor": opts.burst_factor}
    # predictive's own settings: in its cells' key only (the other policies do not use them)
    own_settings = {"level_shift": None if opts.level_shift is None else list(opts.level_shift),
                    "rise_ratio": opts.rise_ratio, "skill_window": opts.skill_window}
    if opts.release_quantile is not None:
        own_settings["release_quantile"] = opts.release_quantile
        if opts.release_recent:
            own_settings["release_recent"] = opts.release_recent

    def settings_of(label: str) -> dict[str, Any]:
        return {**settings, **own_settings} if label == "predictive" else settings
    done: dict[str, dict[str, Any]] = {}
    if a.cells is not None and a.cells.exists():
        for line in a.cells.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done[row["key"]] = row["cell"]
    labels = policies + [f"reactive@{float(u):g}" for u in _list(a.reactive_targets)]

    def opts_of(label: str) -> BacktestOptions:
        _, _, u = label.partition("@")
        return replace(opts, target_utilisation=float(u)) if u else opts

    own: dict[str, list[int]] = {}
    for item in a.shape_seeds:
        name, _, raw = item.partition("=")
        own[_list(name, SHAPES)[0]] = [int(x) for x in _list(raw)]

    def seeds_of(shape: str) -> list[int]:
        return own.get(shape, seeds)

    todo = [(sh, sd, po) for sh in shapes for sd in seeds_of(sh) for po in labels
            if _key(sh, sd, po, settings_of(po)) not in done]
    t0 = time.perf_counter()
    work = [(sh, sd, po, opts_of(po), a.peak, a.cap) for sh, sd, po in todo]
    results: list[dict[str, Any]] = []

    def keep(c: dict[str, Any]) -> None:
        k = _key(c["shape"], c["seed"], c["policy"], settings_of(c["policy"]))
        done[k] = c
        print(f"  {c['shape']}/{c['seed']}/{c['policy']}: SLO {c['slo_attainment'] * 100:.2f} %, "
              f"{c['gpu_hours']:.1f} GPU-h (optimum {c['optimum']['gpu_hours']:.1f}), cpu {c['cpu_s']} s",
              file=sys.stderr, flush=True)
        if a.cells is not None:
            with a.cells.open("a") as f:
                f.write(json.dumps({"key": k, "cell": c}) + "\n")

    if a.jobs > 1 and len(work) > 1:
        with ProcessPoolExecutor(max_workers=a.jobs) as pool:
            for c in pool.map(_run, work):
                keep(c)
    else:
        for wk in work:
            keep(_run(wk))
    results = [done[_key(sh, sd, po, settings_of(po))] for sh in shapes for sd in seeds_of(sh) for po in labels]
    summary = summarise_cells(results)
    rows = verdicts(summary, interval_s=opts.interval_s)
    wall = time.perf_counter() - t0
    if a.json:
        print(json.dumps({"settings": {**settings, **own_settings}, "seeds": seeds, "shape_seeds": own,
                          "summary": summary, "goals": rows},
                         indent=1,
                         default=str))
    else:
        print(f"seeds {seeds} ({a.split if not a.seeds else 'given'}; own: {own}), settings {settings}, "
              f"predictive's {own_settings}, "
              f"{len(todo)} cell(s) run in {wall:.0f} s")
        print(format_table(summary, rows))
    if a.plot is not None:
        from inferlb.bench.autoscale_plots import plot_traces

        plot_traces(results, summary, a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
