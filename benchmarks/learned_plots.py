"""PNG chart of the learned-routing goals (matplotlib, the ``plot`` extra; ``learned_goals --plot PATH``).

Left: the tail of the end-to-end latency distribution of each profile, seeds pooled (complementary
CDF on a log scale, so the slowest 1 % is readable; requests that did not complete are left out
and counted in the legend), with each profile's p99 marked. Right: per seed, the learned profile's
p99 over token-aware's (goal line 0.8) and its regret against the best fixed profile (goal line
5 %), the two figures the goals are read on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inferlb.bench.loadgen.plotting import pyplot

__all__ = ["plot_goals"]


def plot_goals(e2e: Mapping[str, Sequence[float]], failed: Mapping[str, int], per_seed: Sequence[Mapping[str, Any]],
               path: Path) -> Path:
    """Write the chart to ``path``: ``e2e`` the completed requests' e2e seconds per profile (seeds
    pooled), ``failed`` how many did not complete, ``per_seed`` rows with ``seed``, ``p99_ratio``
    (learned / token-aware) and ``regret`` (a fraction). Returns ``path``."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    for name, xs in e2e.items():
        if not xs:
            continue
        s = sorted(xs)
        n = len(s)
        ccdf = [1.0 - i / n for i in range(n)]
        p99 = s[min(n - 1, int(0.99 * n))]
        line = left.plot(s, ccdf, lw=1.2, label=f"{name}: p99 {p99:.1f} s ({failed.get(name, 0)} not completed)")
        left.axvline(p99, color=line[0].get_color(), lw=0.8, ls="--")
    left.set_yscale("log")
    left.set_ylim(1e-4, 1.0)
    left.axhline(0.01, color="grey", lw=0.6)
    left.set_xlabel("end-to-end latency (s)")
    left.set_ylabel("share of requests slower (CCDF)")
    left.set_title("Latency tail, seeds pooled (dashed: p99)")
    left.grid(True, alpha=0.3, which="both")
    left.legend(fontsize=8)
    seeds = [str(r["seed"]) for r in per_seed]
    xs = range(len(seeds))
    width = 0.4
    right.bar([x - width / 2 for x in xs], [r["p99_ratio"] for r in per_seed], width, label="p99 ÷ token-aware")
    right.axhline(0.8, color="C0", lw=0.8, ls="--")
    twin = right.twinx()
    twin.bar([x + width / 2 for x in xs], [r["regret"] * 100 for r in per_seed], width, color="C1",
             label="regret vs best fixed (%)")
    twin.axhline(5.0, color="C1", lw=0.8, ls="--")
    right.set_xticks(list(xs), seeds)
    right.set_xlabel("seed")
    right.set_ylabel("learned p99 ÷ token-aware p99 (goal ≤ 0.8)")
    twin.set_ylabel("regret % (goal < 5)")
    low = min(-2.0, *(r["regret"] * 100 for r in per_seed))   # regret axis: low .. 10 %
    twin.set_ylim(low, 10)
    right.set_ylim(low / 10 * 1.2, 1.2)   # the ratio axis (top 1.2) shares the regret axis's zero line
    twin.axhline(0.0, color="grey", lw=0.5)
    right.set_title("Goals per seed")
    handles = right.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    labels = right.get_legend_handles_labels()[1] + twin.get_legend_handles_labels()[1]
    right.legend(handles, labels, fontsize=8, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
