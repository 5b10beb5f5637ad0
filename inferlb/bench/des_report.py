"""The figures of a discrete-event run, by the definitions of ``inferlb bench run``.

Contract: :func:`des_summary` is pure (``DesResults`` + ``Workload`` → a JSON-able dict) and uses
the definitions of :mod:`inferlb.bench.loadgen.results`: *good* = completed, ``e2e ≤ slo.e2e_s``
and, for streams, ``TTFT ≤ slo.ttft_s`` (``is_good``; tests/bench/test_des.py holds the two
to the same count); SLO attainment = good / measured, goodput = good / the measured window; the
measured requests are those that arrived after ``warmup_s``; latency percentiles (``pcts``) are
over the completed ones. It reads the columns directly, so a million rows take about a second.
Added for the DES: GPU-hours per preset (cold starts included) and, with ``price_per_hour``
(preset → currency per hour), the cost; per node: requests, busy share, preemptions.
"""

from __future__ import annotations

import math
from typing import Any

from inferlb.bench.loadgen.results import pcts
from inferlb.bench.loadgen.workload import Workload
from inferlb.simulator.des.results import OUTCOMES, DesResults

__all__ = ["des_summary"]


def des_summary(res: DesResults, w: Workload, *, duration_s: float | None = None,
                price_per_hour: dict[str, float] | None = None, wall_s: float | None = None) -> dict[str, Any]:
    """See the module docstring. ``duration_s``: the arrival window (default: to the last arrival)."""
    warm = w.warmup_s
    slo_ttft, slo_e2e = w.slo.ttft_s, w.slo.e2e_s
    t, out, e2e, ttft, stream, node = res.t, res.outcome, res.e2e, res.ttft, res.stream, res.node
    ok_code = OUTCOMES.index("ok")
    measured = good = 0
    counts = dict.fromkeys(OUTCOMES, 0)
    e2e_ok: list[float] = []
    ttft_ok: list[float] = []
    tokens = 0
    served = [0] * len(res.nodes)
    last_arrival = 0.0
    for i in range(len(t)):
        ti = t[i]
        last_arrival = ti
        if ti < warm:
            continue
        measured += 1
        o = out[i]
        if o < 0:
            continue
        counts[OUTCOMES[o]] += 1
        if o != ok_code:
            continue
        e = e2e[i]
        f = ttft[i]
        e2e_ok.append(e)
        tokens += res.tokens[i]
        served[node[i]] += 1
        s = stream[i]
        if s:
            ttft_ok.append(f)
        if e <= slo_e2e and (not s or (not math.isnan(f) and f <= slo_ttft)):
            good += 1
    window = max(1e-9, (duration_s if duration_s is not None else last_arrival) - warm)
    gpu_h = res.gpu_hours()
    end = res.end_s
    nodes: dict[str, dict[str, Any]] = {n.name: {
        "preset": n.preset, "requests": served[k], "busy_share": round(n.busy_s / max(1e-9, n.up_s(end)), 4),
        "preemptions": n.preemptions, "added_at": n.added_at, "ready_at": n.ready_at,
        "removed_at": n.removed_at} for k, n in enumerate(res.nodes)}
    completed = counts["ok"]
    out_d: dict[str, Any] = {
        "requests": len(t), "measured": measured, "outcomes": counts, "good": good,
        "slo_attainment": good / measured if measured else math.nan,
        "window_s": window, "virtual_s": end,
        "offered_rps": measured / window, "throughput_rps": completed / window, "goodput_rps": good / window,
        "output_tokens_per_s": tokens / window,
        "ttft_s": pcts(ttft_ok), "e2e_s": pcts(e2e_ok),
        "share": {n: served[k] / completed for k, n in enumerate(nodes)} if completed else {},
        "gpu_hours": gpu_h, "gpu_hours_total": sum(gpu_h.values()),
        "nodes": nodes, "slo": w.slo.model_dump(),
    }
    if price_per_hour is not None:
        out_d["cost"] = sum(h * price_per_hour.get(k, 0.0) for k, h in gpu_h.items())
    if wall_s is not None:
        out_d["wall_s"] = wall_s
    return out_d
