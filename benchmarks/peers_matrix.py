"""inferlb's profiles and the peer routers over seeds and loads: ``inferlb bench compare`` per cell, one table.

``python -m benchmarks.peers_matrix run --out DIR [--seeds 1,2,3] [--loads 0.70,0.85,0.95] [compare options]``
runs one ``inferlb bench compare`` per (seed, load) cell, each in its own process with its own fresh
fleet per target (``--targets``, default: inferlb token-aware and learned, vllm-router cache_aware
and power_of_two, sglang-router cache_aware and power_of_two, LiteLLM least-busy), and writes
``DIR/s{seed}-l{load}.json`` (and its tables, ``.md``); a cell whose file exists is not run
again. Options after ``--`` go to every compare (e.g. ``--vllm-router PATH --litellm-bin PATH``).

``python -m benchmarks.peers_matrix table DIR/*.json [--chart PNG]`` prints one markdown table
per load (a row per router; with several seeds the mean and, for SLO share and e2e p99, the
range) and, with ``--chart``, draws SLO share and e2e p99 against load (needs matplotlib).

The figures are those of ``bench compare``: SLO share = requests answered within the workload's
TTFT and e2e SLOs ÷ requests measured; goodput = those per second; router CPU = the router's CPU
over the run per request sent; sys busy = the share of the machine's CPUs busy over the run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

TARGETS = ("inferlb:token-aware,inferlb:learned,vllm-router:cache_aware,vllm-router:power_of_two,"
           "sglang-router:cache_aware,sglang-router:power_of_two,litellm:least-busy")


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def run(args: argparse.Namespace, extra: list[str]) -> int:
    """One ``bench compare`` per (seed, load); returns the number of cells that failed."""
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for seed in [int(s) for s in _floats(args.seeds)]:
        for load in _floats(args.loads):
            out = args.out / f"s{seed}-l{load:.2f}.json"
            if out.exists():
                continue
            cmd = [sys.executable, "-m", "inferlb.cli.main", "bench", "compare", "--fleet", args.fleet,
                   "--on-kv-full", "preempt", "--workload", args.workload, "--capacity", str(args.capacity),
                   "--load", str(load), "--duration", str(args.duration), "--seed", str(seed),
                   "--targets", args.targets, "--json", str(out), "--quiet", *extra]
            print(f"seed {seed}, load {load:.2f}: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
            # The cell's tables go next to its JSON, as markdown (a terminal table would be folded).
            with out.with_suffix(".md").open("w") as md:
                r = subprocess.run([*cmd, "--markdown"], stdout=md, check=False, timeout=args.cell_timeout)
            failed += r.returncode != 0
    return failed


def _cells(files: list[Path]) -> dict[float, dict[str, list[dict[str, Any]]]]:
    """``{load: {router: [run summary per seed]}}`` (the load as a share of the given capacity)."""
    out: dict[float, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for f in files:
        rep = json.loads(f.read_text())
        argv = rep["meta"]["argv"]
        load = float(argv[argv.index("--load") + 1]) if "--load" in argv else float("nan")
        for s in rep["runs"]:
            s = dict(s, seed=rep["meta"]["seed"])
            out[round(load, 2)][s["label"]].append(s)
    return out


def _mean(xs: list[float | None]) -> float:
    vals = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.fmean(vals) if vals else float("nan")


def _num(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def _span(xs: list[float], fmt: str) -> str:
    m = _mean(list(xs))
    if math.isnan(m):
        return "-"
    if len(xs) < 2:
        return fmt.format(m)
    return f"{fmt.format(m)} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def _row(label: str, runs: list[dict[str, Any]]) -> list[str]:
    share = [100 * r["good_share"] for r in runs]
    e2e99 = [r["e2e_s"]["p99"] for r in runs]
    errors = sum(sum(r["errors"].values()) for r in runs)
    sent = sum(r["measured"] for r in runs)
    busy = _mean([(r.get("cpu_core_share") or {}).get("system_busy") for r in runs])
    return [label, ",".join(str(r["seed"]) for r in runs), _span(share, "{:.1f}"),
            _num(_mean([r["ttft_s"]["p50"] for r in runs])), _num(_mean([r["ttft_s"]["p99"] for r in runs])),
            _num(_mean([r["e2e_s"]["p50"] for r in runs])), _span(e2e99, "{:.1f}"),
            _num(_mean([r["goodput_rps"] for r in runs])), f"{errors}/{sent}",
            _num(_mean([r.get("router_cpu_ms_per_req") for r in runs])), _num(busy)]


HEAD = ["router", "seeds", "SLO share %", "TTFT p50 s", "TTFT p99 s", "e2e p50 s", "e2e p99 s", "goodput/s",
        "errors", "router CPU ms/req", "sys busy"]


def table(files: list[Path], chart: Path | None) -> str:
    """The markdown tables (one per load) of the compare reports in ``files``."""
    cells = _cells(files)
    lines: list[str] = []
    for load in sorted(cells):
        lines += [f"**load {100 * load:.0f} %**", "", "| " + " | ".join(HEAD) + " |",
                  "|---|" + "---:|" * (len(HEAD) - 1)]
        for label, runs in cells[load].items():
            lines.append("| " + " | ".join(_row(label, sorted(runs, key=lambda r: r["seed"]))) + " |")
        lines.append("")
    if chart is not None:
        _chart(cells, chart)
    return "\n".join(lines)


def _chart(cells: dict[float, dict[str, list[dict[str, Any]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = sorted(cells)
    labels = list(dict.fromkeys(label for load in loads for label in cells[load]))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
    for label in labels:
        xs = [100 * lo for lo in loads if label in cells[lo]]
        a.plot(xs, [_mean([100 * r["good_share"] for r in cells[lo][label]]) for lo in loads if label in cells[lo]],
               "o-", label=label)
        b.plot(xs, [_mean([r["e2e_s"]["p99"] for r in cells[lo][label]]) for lo in loads if label in cells[lo]],
               "o-", label=label)
    a.set(xlabel="load (% of the fleet's capacity)", ylabel="SLO share % (mean over seeds)",
          title="Requests within the SLO")
    b.set(xlabel="load (% of the fleet's capacity)", ylabel="e2e p99, s (mean over seeds)", title="e2e p99")
    for ax in (a, b):
        ax.grid(True, alpha=0.3)
    a.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers_matrix", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one bench compare per (seed, load)")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--seeds", default="1,2,3")
    r.add_argument("--loads", default="0.70,0.85,0.95")
    r.add_argument("--targets", default=TARGETS)
    r.add_argument("--fleet", default="hetero4")
    r.add_argument("--workload", default="heavy-tail")
    r.add_argument("--capacity", type=float, default=15.26, help="req/s at 100 %% (bench capacity's figure)")
    r.add_argument("--duration", type=float, default=30.0, help="arrival window per target, s (30)")
    r.add_argument("--cell-timeout", type=float, default=1800.0)
    t = sub.add_parser("table", help="markdown tables of the cells' JSON files")
    t.add_argument("files", type=Path, nargs="+")
    t.add_argument("--chart", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return 1 if run(args, extra) else 0
    print(table(args.files, args.chart))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
