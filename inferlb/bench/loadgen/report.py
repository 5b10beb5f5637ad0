"""Rendering run figures: rich tables on the terminal, markdown for docs, PNG charts with matplotlib.

Contract: every function takes the JSON-able summaries of :func:`.results.summarize` (so a saved
``--json`` file can be rendered again) and does no measuring. Charts need the optional ``plot``
extra (``pip install 'inferlb[plot]'``); without matplotlib :func:`plot_runs` raises
:class:`RuntimeError` saying so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferlb.bench.loadgen.plotting import pyplot

__all__ = ["capacity_lines", "compare_rows", "plot_runs", "print_table", "table_markdown"]

Row = list[str]


def _ms(v: Any) -> str:
    """Seconds → a short human figure (ms below 10 s, else s)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v * 1000:.0f} ms" if v < 10 else f"{v:.1f} s"


def _f(v: Any, d: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{d}f}"


def _ratio(a: Any, b: Any) -> str:
    if a is None or b is None or not b or (isinstance(a, float) and math.isnan(a)) or math.isnan(b):
        return "-"
    return f"{a / b:.2f}×"


HEAD = ["target", "sent", "ok", "errors", "goodput/s", "good %", "e2e p50", "e2e p99", "TTFT p50", "TTFT p99",
        "TPOT p99", "router CPU ms/req", "preempt", "OOM", "crashes"]


def _row(s: dict[str, Any]) -> Row:
    errs = ", ".join(f"{k} {v}" for k, v in list(s["errors"].items())[:3])
    return [s["label"], str(s["measured"]), str(s["ok"]), errs or "0", _f(s["goodput_rps"]),
            _f(100 * s["good_share"], 1), _ms(s["e2e_s"]["p50"]), _ms(s["e2e_s"]["p99"]), _ms(s["ttft_s"]["p50"]),
            _ms(s["ttft_s"]["p99"]), _ms(s["tpot_s"]["p99"]), _f(s.get("router_cpu_ms_per_req")),
            str(s["preemptions"]), str(s["oom_crashes"]),
            str(s["crashes"])]


def compare_rows(summaries: Sequence[dict[str, Any]], reference: str | None) -> tuple[Row, list[Row]]:
    """The comparison table: one row per target, ratios against ``reference`` (a target label)."""
    ref = next((s for s in summaries if s["label"] == reference), None)
    head = list(HEAD)
    if ref is not None:
        head += ["e2e p99 ÷ ref", "TTFT p99 ÷ ref", "goodput ÷ ref"]
    rows = []
    for s in summaries:
        row = _row(s)
        if ref is not None:
            row += [_ratio(s["e2e_s"]["p99"], ref["e2e_s"]["p99"]), _ratio(s["ttft_s"]["p99"], ref["ttft_s"]["p99"]),
                    _ratio(s["goodput_rps"], ref["goodput_rps"])]
        rows.append(row)
    return head, rows


def node_rows(s: dict[str, Any]) -> tuple[Row, list[Row]]:
    """Per node of one run: share of answers, engine figures."""
    head = ["node", "share %", "requests", "KV mean %", "KV max %", "queue mean", "queue max", "preempt", "OOM",
            "crashes"]
    rows = []
    for name, n in s["nodes"].items():
        rows.append([name, _f(100 * s["share"].get(name, 0.0), 1), str(n["requests"]), _f(100 * n["kv_usage_mean"], 0),
                     _f(100 * n["kv_usage_max"], 0), _f(n["waiting_mean"], 1), str(n["waiting_max"]),
                     str(n["preemptions"]), str(n["oom_crashes"]), str(n["crashes"])])
    return head, rows


def table_markdown(head: Row, rows: list[Row]) -> str:
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"
    lines = ["| " + " | ".join(head) + " |", rule]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def print_table(title: str, head: Row, rows: list[Row], *, markdown: bool) -> None:
    """Print a table: markdown text, or a rich table on the terminal."""
    if markdown:
        print(f"\n**{title}**\n")
        print(table_markdown(head, rows))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i == 0 else "right", overflow="fold")
    for r in rows:
        t.add_row(*r)
    Console(width=max(160, Console().width)).print(t)


def capacity_lines(cap: dict[str, Any]) -> tuple[Row, list[Row]]:
    head = ["step", "rate req/s", "offered req/s", "e2e p99", "× unloaded p99", "TTFT p99", "goodput req/s",
            "errors %", "verdict"]
    rows = []
    for st in cap["steps"]:
        s = st["summary"]
        rows.append([st["name"], _f(st["rate"]), _f(s["offered_rps"]), _ms(s["e2e_s"]["p99"]), _f(st.get("p99_ratio")),
                     _ms(s["ttft_s"]["p99"]), _f(s["goodput_rps"]), _f(100 * s["error_rate"], 1), st["verdict"]])
    return head, rows


def plot_runs(summaries: Sequence[dict[str, Any]], outcomes: dict[str, list[list[Any]]], out_dir: Path,
              capacity: dict[str, Any] | None = None) -> list[Path]:
    """Write latency_cdf.png, goodput_vs_offered.png, node_share_<target>.png; returns the paths."""
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    curves = [(s["label"], sorted(row[3] for row in outcomes.get(s["label"], []) if row[2])) for s in summaries]
    curves = [(label, e2e) for label, e2e in curves if e2e]
    if curves:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, e2e in curves:
            ax.plot(e2e, [(i + 1) / len(e2e) for i in range(len(e2e))], label=label)
        ax.set_xscale("log")
        ax.set_xlabel("end-to-end latency (s, log scale)")
        ax.set_ylabel("share of successful requests")
        ax.set_title("Latency CDF")
        ax.grid(True, alpha=0.3)
        ax.legend()
        paths.append(_save(fig, out_dir / "latency_cdf.png", plt))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if capacity is not None:
        xs = [st["rate"] for st in capacity["steps"]]
        ax.plot(xs, [st["summary"]["goodput_rps"] for st in capacity["steps"]], "o-", label="goodput")
        ax.plot(xs, xs, "--", color="grey", label="offered")
    for s in summaries:
        ax.plot([s["offered_rps"]], [s["goodput_rps"]], "s", label=s["label"])
    ax.set_xlabel("offered load (req/s)")
    ax.set_ylabel("goodput within SLO (req/s)")
    ax.set_title("Goodput vs offered load")
    ax.grid(True, alpha=0.3)
    ax.legend()
    paths.append(_save(fig, out_dir / "goodput_vs_offered.png", plt))

    for s in summaries:
        tl = s["timeline"]
        if not tl["nodes"]:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        names = list(tl["nodes"])
        totals = [sum(tl["nodes"][n][i] for n in names) or 1 for i in range(len(tl["t"]))]
        ax.stackplot(tl["t"], *[[c / t for c, t in zip(tl["nodes"][n], totals, strict=True)] for n in names],
                     labels=names)
        ax.set_xlabel(f"time (s, {tl['bucket_s']:g} s buckets by send time)")
        ax.set_ylabel("share of answered requests")
        ax.set_title(f"Per-node share over time — {s['label']}")
        ax.set_ylim(0, 1)
        ax.legend(loc="upper right", fontsize="small")
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in s["label"])
        paths.append(_save(fig, out_dir / f"node_share_{safe}.png", plt))
    return paths


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
