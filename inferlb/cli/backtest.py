"""``inferlb autoscale backtest``: the autoscaler over simulated days in the discrete-event simulator.

::

    inferlb autoscale backtest --workload diurnal-bursty|FILE --policy static|reactive|predictive|oracle
                               [--policy ...] [--days 7] [--warmup-days 2] [--seed 1]
                               [--forecaster holt-winters] [--preset l4] [--max-num-seqs 4]
                               [--cold-start 300] [--interval 60] [--step 300]
                               [--target-utilisation U] [--headroom H] [--scale-down-stabilisation S]
                               [--capacity-tokens-s C] [--price-per-hour P] [--json] [--plot DIR]

``--policy`` may be repeated or comma-separated (``all``: the four); the policies share one plan
and one capacity calibration. Prints one line of figures per policy and, with ``predictive`` and
the policy it is compared with, the backtest goals (docs/benchmarks.md) and whether each is met (``--json``: the whole
result as JSON, without the per-round series, which the plots show). How the run works and what
each figure means: inferlb/bench/autoscale_backtest.py. Exit 0 when it ran (goals missed
included), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["backtest_command", "format_backtests", "register"]


def register(sub: Any) -> None:
    """Add ``autoscale backtest`` to ``sub`` (the top-level parser's sub-parsers)."""
    a = sub.add_parser("autoscale", help="autoscaling tools (backtest)")
    asub = a.add_subparsers(dest="autoscale_cmd", required=True)
    b = asub.add_parser("backtest", help="the autoscaler over simulated days in the discrete-event simulator")
    b.add_argument("--workload", default="diurnal-bursty", help="a built-in workload or a YAML / JSON file")
    b.add_argument("--policy", action="append", default=[], help="static, reactive, predictive, oracle or all "
                   "(repeatable, comma-separated; default: predictive)")
    b.add_argument("--days", type=float, default=7.0, help="simulated days (after the warm-up)")
    b.add_argument("--warmup-days", dest="warmup_days", type=float, default=2.0,
                   help="earlier days handed over as history only (not simulated)")
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--forecaster", default="holt-winters", help="the predictive policy's forecaster")
    b.add_argument("--preset", default="l4", help="the replicas' GPU preset (h100, a100, l4, t4)")
    b.add_argument("--max-num-seqs", dest="max_num_seqs", type=int, default=4, help="a replica's batch cap")
    b.add_argument("--cold-start", dest="cold_start_s", type=float, default=300.0, help="seconds")
    b.add_argument("--interval", dest="interval_s", type=float, default=60.0, help="seconds between rounds")
    b.add_argument("--step", dest="step_s", type=float, default=300.0, help="the observed series' step (s)")
    b.add_argument("--target-utilisation", dest="target_utilisation", type=float)
    b.add_argument("--headroom", type=float)
    b.add_argument("--scale-down-stabilisation", dest="scale_down_stabilisation_s", type=float)
    b.add_argument("--capacity-tokens-s", dest="capacity_tokens_s", type=float,
                   help="one replica's tokens/s at SLO (default: calibrated in the simulator)")
    b.add_argument("--price-per-hour", dest="price_per_hour", type=float, default=0.8)
    b.add_argument("--min-replicas", dest="min_replicas", type=int, default=1)
    b.add_argument("--max-replicas", dest="max_replicas", type=int, default=128)
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    b.add_argument("--plot", type=Path, help="write PNG charts into this directory")
    b.set_defaults(handler=backtest_command)


def _policies(raw: list[str]) -> list[str]:
    from inferlb.bench.autoscale_backtest import POLICIES

    names: list[str] = []
    for item in raw or ["predictive"]:
        for name in item.split(","):
            name = name.strip()
            for n in (POLICIES if name == "all" else (name,)):
                if n not in POLICIES:
                    raise ValueError(f"--policy: unknown policy {n!r} (known: {', '.join(POLICIES)}, all)")
                if n not in names:
                    names.append(n)
    return names


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.2f} %"


def format_backtests(runs: dict[str, dict[str, Any]], goal_rows: list[dict[str, Any]]) -> str:
    head = ("policy", "forecaster", "requests", "SLO", "SLO ramps", "SLO bursts", "GPU-h", "cost", "ups/downs",
            "added", "cold routed", "cold waited", "max", "fallbacks", "wall s")
    lines = ["  ".join(f"{h:>11}" for h in head)]
    for name, r in runs.items():
        se, cold = r["scale_events"], r["cold"]
        vals = (name, r["forecaster"], r["requests"], _pct(r["slo_attainment"]), _pct(r["slo_attainment_ramps"]),
                _pct(r["slo_attainment_bursts"]), f"{r['gpu_hours']:.1f}", f"{r['cost']:.2f}",
                f"{se['up']}/{se['down']}", se["nodes_added"], cold["routed_to_new_node"],
                cold["waited_on_cold_capacity"], r["replicas"]["max"], r["forecast_fallbacks"], r["wall_s"])
        lines.append("  ".join(f"{v!s:>11}" for v in vals))
    first = next(iter(runs.values()), None)
    if first is not None:
        cap = first["capacity"]
        lines.append(f"capacity: {cap['tokens_per_s']:.1f} tokens/s per replica at SLO "
                     f"({cap.get('source', 'calibrated')})")
        if "optimum" in first:
            o = first["optimum"]
            lines.append(f"offline optimum (the least schedule at that capacity, cold start included): "
                         f"{o['gpu_hours']:.1f} GPU-h, at most {o['max_replicas']} replicas")
        for name, r in runs.items():
            for why, n in r["fallback_reasons"].items():
                lines.append(f"{name}: {n} forecast(s) fell back: {why}")
    for g in goal_rows:
        v = g["value"]
        shown = (", ".join(f"{k} {x * 100:.2f} %" for k, x in v.items()) if isinstance(v, dict)
                 else f"{v:.3f}" if "x" in g["goal"] or "reactive's" in g["goal"] else f"{v * 100:.2f} %")
        lines.append(f"goal: {g['goal']}: {shown} — {'met' if g['met'] else 'NOT met'}")
    return "\n".join(lines)


def backtest_command(args: argparse.Namespace) -> int:
    from inferlb.bench.autoscale_backtest import BacktestOptions, calibrate, goals, make_trace, run_backtest
    from inferlb.bench.loadgen.workload import load_workload

    try:
        policies = _policies(args.policy)
        w = load_workload(args.workload)
        if args.days <= 0 or args.warmup_days < 0:
            raise ValueError("--days must be > 0 and --warmup-days >= 0")
        fields = ("days", "warmup_days", "seed", "forecaster", "preset", "max_num_seqs", "cold_start_s",
                  "interval_s", "step_s", "target_utilisation", "headroom", "scale_down_stabilisation_s",
                  "capacity_tokens_s", "price_per_hour", "min_replicas", "max_replicas")
        opts = BacktestOptions(**{k: getattr(args, k) for k in fields})
        if opts.step_s % opts.interval_s > 1e-9:
            raise ValueError("--step must be a multiple of --interval (a round closes each step)")
        opts.autoscale(w.model)   # validates the autoscale settings before anything runs
        opts.spec("check", w.model)
    except ValueError as exc:
        print(f"inferlb: error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    start = round(opts.warmup_days * 86_400 / opts.step_s) * opts.step_s
    trace = make_trace(w, seed=opts.seed, duration_s=start + opts.days * 86_400)
    if opts.capacity_tokens_s:
        capacity: dict[str, Any] = {"tokens_per_s": opts.capacity_tokens_s, "source": "given"}
    else:
        capacity = {**calibrate(w, opts), "source": "calibrated"}
    print(f"plan: {len(trace.t):,} requests over {opts.warmup_days:g} + {opts.days:g} days; capacity "
          f"{capacity['tokens_per_s']:.1f} tokens/s per replica ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    runs: dict[str, dict[str, Any]] = {}
    for name in policies:
        runs[name] = run_backtest(w, name, opts, trace=trace, capacity=capacity)
        print(f"{name}: done in {runs[name]['wall_s']} s", file=sys.stderr)
    goal_rows = goals(runs)
    if args.plot is not None:
        from inferlb.bench.autoscale_plots import plot_backtests

        for p in plot_backtests(list(runs.values()), args.plot):
            print(f"wrote {p}", file=sys.stderr)
    if args.json:
        doc = {"workload": w.name, "runs": {k: {kk: vv for kk, vv in v.items() if kk != "series"}
                                            for k, v in runs.items()}, "goals": goal_rows}
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(format_backtests(runs, goal_rows))
    return 0
