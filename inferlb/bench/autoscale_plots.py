"""PNG charts of autoscaling backtests (matplotlib, the ``plot`` extra; ``--plot DIR``).

Per policy, ``backtest_<policy>.png``: tokens/s observed (the last closed step), forecast (its
first step, as planned on) and capacity at SLO of the ready nodes, over the simulated days; below
it, replicas ready / starting (cold) / draining and the plan's desired. With several policies,
``backtest_replicas.png`` overlays their replicas (ready + starting) over the same days.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferlb.bench.loadgen.plotting import pyplot

__all__ = ["plot_backtests", "plot_traces"]


def plot_backtests(runs: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Write the charts of ``runs`` (results of :func:`~.autoscale_backtest.run_backtest`); their paths."""
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for run in runs:
        rows = run["series"]
        if not rows:
            continue
        start = run["start_s"]
        days = [(r["t"] - start) / 86_400 for r in rows]
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True,
                                          gridspec_kw={"height_ratios": [3, 2]})
        top.plot(days, [r["actual"] for r in rows], lw=0.8, label="actual (last 5-min step)")
        top.plot(days, [r["forecast"] if r["forecast"] is not None else float("nan") for r in rows], lw=0.8,
                 label=f"forecast ({run['forecaster']}, next step)")
        top.plot(days, [r["capacity"] for r in rows], lw=1.0, label="capacity at SLO (ready nodes)")
        top.set_ylabel("tokens/s")
        top.set_title(f"Backtest — {run['policy']}: SLO {run['slo_attainment'] * 100:.2f} %, "
                      f"{run['gpu_hours']:.0f} GPU-h")
        top.grid(True, alpha=0.3)
        top.legend(loc="upper right", fontsize="small")
        bottom.stackplot(days, [r["ready"] for r in rows], [r["starting"] for r in rows],
                         [r["draining"] for r in rows], labels=["ready", "starting (cold)", "draining"],
                         alpha=0.7)
        bottom.step(days, [r["desired"] for r in rows], where="post", lw=0.8, color="black", label="desired")
        bottom.set_ylabel("replicas")
        bottom.set_xlabel("simulated day")
        bottom.grid(True, alpha=0.3)
        bottom.legend(loc="upper right", fontsize="small")
        paths.append(_save(fig, out_dir / f"backtest_{run['policy']}.png", plt))
    if len(runs) > 1:
        fig, ax = plt.subplots(figsize=(11, 4))
        for run in runs:
            start = run["start_s"]
            rows = run["series"]
            ax.step([(r["t"] - start) / 86_400 for r in rows], [r["ready"] + r["starting"] for r in rows],
                    where="post", lw=0.8, label=f"{run['policy']} ({run['gpu_hours']:.0f} GPU-h)")
        ax.set_xlabel("simulated day")
        ax.set_ylabel("replicas held (ready + starting)")
        ax.set_title("Replicas over time per policy")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
        paths.append(_save(fig, out_dir / "backtest_replicas.png", plt))
    return paths


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_traces(cells: Sequence[dict[str, Any]], summary: dict[str, dict[str, dict[str, Any]]], path: Path) -> Path:
    """The trace set's chart (``python -m benchmarks.autoscale_traces --plot``): per shape, the
    replicas (starting + ready) of each policy over the first seed's days (top), and GPU-hours ÷
    the offline optimum per policy, means over the seeds, labelled with the SLO attainment (bottom)."""
    plt = pyplot()
    order = ("diurnal", "weekly", "step", "flash", "sine", "noisy")
    shapes = sorted(summary, key=lambda n: order.index(n) if n in order else len(order))
    colour: dict[str, str] = {}
    for c in cells:                     # one colour per policy, the same in both rows
        colour.setdefault(c["policy"], f"C{len(colour)}")
    fig, axes = plt.subplots(2, len(shapes), figsize=(3.2 * len(shapes), 6.5), squeeze=False)
    for k, shape in enumerate(shapes):
        top, bottom = axes[0][k], axes[1][k]
        seeds = sorted({c["seed"] for c in cells if c["shape"] == shape})
        for c in cells:
            if c["shape"] == shape and c["seed"] == seeds[0]:
                xs = [(t - c["start_s"]) / 86_400 for t, _ in c["replicas_series"]]
                top.plot(xs, [n for _, n in c["replicas_series"]], lw=0.7, label=c["policy"], color=colour[c["policy"]])
        top.set_title(f"{shape} (seed {seeds[0]})", fontsize=9)
        top.set_xlabel("day", fontsize=8)
        top.grid(True, alpha=0.3)
        pols = sorted(summary[shape], key=lambda p: list(colour).index(p) if p in colour else len(colour))
        vals = [summary[shape][p]["x_optimum"] for p in pols]
        bars = bottom.bar(range(len(pols)), vals, color=[colour.get(p, "C9") for p in pols])
        for b, p in zip(bars, pols, strict=True):
            bottom.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{summary[shape][p]['slo'] * 100:.1f}%",
                        ha="center", va="bottom", fontsize=7)
        bottom.axhline(1.15, color="k", lw=0.8, ls="--")
        bottom.set_xticks(range(len(pols)), pols, fontsize=7, rotation=20)
        bottom.set_ylim(0.8, max([1.6, *vals]) + 0.1)
        bottom.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("replicas (starting + ready)")
    axes[1][0].set_ylabel("GPU-h ÷ offline optimum (--- 1.15)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Autoscaling on six trace shapes: replicas, and GPU-hours vs the offline optimum "
                 "(label: SLO attainment)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
