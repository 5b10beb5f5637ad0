"""Tables for ``inferlb bench overhead``: the same rows as aligned text or as markdown."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["cpu_ratio_table", "engine_table", "format_table", "overhead_table", "render"]

# The rows every gateway's CPU is divided by, when the cell has them: the least a Python gateway on
# this stack costs, and the two Rust routers users compare inferlb with.
_RATIO_BASES = ("floor", "vllm-router", "sglang-router")

Table = tuple[list[str], list[list[str]]]

_LEGEND = ("added = this row minus direct in the same cell (difference of percentiles); gw CPU = utime+stime "
           "of the gateway process tree over the measured phase, per 1,000 requests; sys busy = share of all "
           "CPUs busy during the measured phase; other load = share of all CPUs used by processes other than "
           "the nodes, the measured gateway and the load generator (idle gateways, other people's jobs).")


_ENGINE_LEGEND = ("CPU = thread CPU of the whole scripted request (gateway bookkeeping, process, service "
                  "operations); process = the same process with every operation stubbed to the result it gave "
                  "on a recorded request (executor, conditions, parameters, data passing); ops = time inside "
                  "the real service operations per request (inferlb/bench/engine.py).")


def _f(v: Any, digits: int = 1, signed: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def overhead_table(rows: Sequence[dict[str, Any]]) -> Table:
    """One line per (mode, concurrency, stream) cell."""
    head = ["mode", "c", "stream", "n", "err", "req/s", "e2e p50 ms", "e2e p99 ms", "TTFT p50 ms",
            "TTFT p99 ms", "added p50 ms", "added p99 ms", "gw CPU s/1k req", "sys busy", "other load"]
    body = []
    for r in rows:
        body.append([r["mode"], str(r["concurrency"]), "yes" if r["stream"] else "no", str(r["n"]),
                     str(r["errors"]), _f(r["rps"], 0), _f(r["e2e_p50_ms"]), _f(r["e2e_p99_ms"]),
                     _f(r["ttft_p50_ms"]), _f(r["ttft_p99_ms"]), _f(r["added_p50_ms"], signed=True),
                     _f(r["added_p99_ms"], signed=True), _f(r["gateway_cpu_s_per_1k"], 2),
                     _f(r["system_busy"], 2), _f(r.get("other_load"), 2)])
    return head, body


def cpu_ratio_table(rows: Sequence[dict[str, Any]]) -> Table:
    """Gateway CPU per request side by side: per (concurrency, stream) cell, each gateway's CPU
    ÷ that of the floor and of each Rust router in the same cell ("-" where a cell lacks one)."""
    bases = [b for b in _RATIO_BASES if any(r["mode"] == b for r in rows)]
    head = ["mode", "c", "stream", "gw CPU ms/req", *[f"÷ {b}" for b in bases]]
    cell: dict[tuple[int, bool], dict[str, float]] = {}
    for r in rows:
        if r["gateway_cpu_s_per_1k"] is not None:
            cell.setdefault((r["concurrency"], r["stream"]), {})[r["mode"]] = r["gateway_cpu_s_per_1k"]
    body = []
    for r in rows:
        cpu = r["gateway_cpu_s_per_1k"]
        if cpu is None:
            continue
        here = cell[(r["concurrency"], r["stream"])]
        ratios = [f"{cpu / here[b]:.2f}×" if here.get(b) else "-" for b in bases]
        body.append([r["mode"], str(r["concurrency"]), "yes" if r["stream"] else "no", _f(cpu, 2), *ratios])
    return head, body


def engine_table(engine: dict[str, Any]) -> Table:
    """One line per (executor, scenario) of the engine-alone measurement: the whole request, then
    the process alone (operations stubbed) and the time inside the service operations (rows from
    before those were measured show "-")."""
    head = ["executor", "scenario", "n", "CPU µs p50", "CPU µs p90", "CPU µs p99", "CPU µs mean",
            "wall µs p50", "process CPU µs p50", "process CPU µs p90", "process CPU µs mean",
            "ops µs p50", "ops µs mean"]
    body = []
    for r in engine["rows"]:
        c, w = r["cpu_us"], r["wall_us"]
        p, o = r.get("process_cpu_us") or {}, r.get("ops_us") or {}
        body.append([r["engine"], r["scenario"], str(r["n"]), _f(c["p50"]), _f(c["p90"]), _f(c["p99"]),
                     _f(c["mean"]), _f(w["p50"]), _f(p.get("p50")), _f(p.get("p90")), _f(p.get("mean")),
                     _f(o.get("p50")), _f(o.get("mean"))])
    return head, body


def format_table(table: Table, markdown: bool) -> str:
    """Render ``(header, rows)`` as a markdown table or as aligned columns."""
    head, body = table
    if markdown:
        lines = ["| " + " | ".join(head) + " |",
                 "|" + "|".join("---" if i < 3 else "---:" for i in range(len(head))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in body]
    return "\n".join(lines)


def render(report: dict[str, Any], *, markdown: bool = False) -> str:
    """The whole report: run facts, notes, the overhead table and the engine-alone table."""
    meta = report["meta"]
    cfg = meta["config"]
    busy = meta.get("system_busy_overall")
    git = ""
    if meta.get("git_commit"):
        git = f", inferlb at {meta['git_commit']}"
        if meta.get("git_modified_files"):
            git += f" + {meta['git_modified_files']} modified files"
    facts = [f"started {meta['started']}, {meta['cpus']} CPUs, Python {meta['python']}{git}",
             f"nodes: {meta.get('nodes', '-')}; {cfg['max_tokens']} output tokens; n={cfg['n']} per cell "
             f"(cap {cfg['max_seconds']:g} s); inferlb routing profile {cfg['profile']}",
             f"whole-run system busy fraction: {_f(busy, 2)} (1.00 = all CPUs busy)"]
    out = []
    if markdown:
        out += [f"- {f}" for f in facts]
    else:
        out += facts
    for note in report.get("notes", []):
        out.append(f"- note: {note}" if markdown else f"note: {note}")
    out.append("")
    if report["rows"]:
        out.append("### Gateway overhead" if markdown else "Gateway overhead")
        out.append("")
        out.append(format_table(overhead_table(report["rows"]), markdown))
        out.append("")
        out.append(_LEGEND)
        out.append("")
        ratios = cpu_ratio_table(report["rows"])
        if len(ratios[0]) > 4 and ratios[1]:
            out.append("### Gateway CPU per request, side by side" if markdown
                       else "Gateway CPU per request, side by side")
            out.append("")
            out.append(format_table(ratios, markdown))
            out.append("")
            out.append("gw CPU ms/req = the gateway's CPU seconds per 1,000 requests (the same figure); "
                       "÷ X = this row's CPU per request over X's in the same cell.")
            out.append("")
    if report.get("engine"):
        out.append("### Engine alone (request process, no HTTP)" if markdown
                   else "Engine alone (request process, in-process, no HTTP; thread CPU per request)")
        out.append("")
        out.append(format_table(engine_table(report["engine"]), markdown))
        out.append("")
        out.append(_ENGINE_LEGEND)
    return "\n".join(out)
