"""Autoscaling on traces it was not shaped on (issue 22, item 7): every shape of
:mod:`.autoscale_shapes` × seeds × policies in the discrete-event simulator, against the offline
optimum of each run.

``python -m benchmarks.autoscale_traces`` drives it. One **cell** is (shape, seed, policy):
:func:`shape_trace` draws the shape's requests (a thinned Poisson process on its rate, the
request lengths of ``diurnal-bursty``), and :func:`~.autoscale_backtest.run_backtest` runs the
policy over the shape's days after two warm-up days handed over as history, with the capacity
given (one replica's tokens/s at SLO, calibrated once for these request shapes) and the shape's
events (flash crowds, steps, bumps) as the "burst" windows. Each run's offline optimum
(:mod:`.autoscale_optimum`) is the reference.

**Goals per shape** (:func:`verdicts`, for the ``predictive`` policy; the figures are means over
the seeds given):

* SLO attainment ≥ 99 % (``flash``: ≥ reactive's and ≥ 98 %, and a **burst path that reacts
  within one round**: every crowd's first scale-up is at most ``2 × interval_s`` after the crowd
  starts, i.e. at the latest the first round whose whole window lies in the crowd);
* GPU-hours ≤ 1.15 × the optimum;
* GPU-hours ≤ reactive's **at equal SLO** (:func:`reactive_at`): reactive is run at several
  target utilisations (``reactive`` and ``reactive@U``), giving points (SLO, GPU-hours); the
  goal is met when predictive costs no more than reactive's GPU-hours interpolated at
  predictive's SLO (linear between the two points that bracket it), or when a reactive point
  with no more SLO costs at least as much (predictive dominates it); NOT met when a reactive
  point with at least predictive's SLO costs less; otherwise (predictive's SLO outside reactive's
  range, no dominance) not judged (``None``, said).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import replace
from statistics import mean
from typing import Any

from inferlb.bench.autoscale_backtest import DAY_S, BacktestOptions, Trace, run_backtest
from inferlb.bench.autoscale_shapes import SHAPES, Shape, make_shape
from inferlb.bench.loadgen.workload import Workload, load_workload

__all__ = ["cell", "format_table", "reactive_at", "shape_trace", "summarise_cells", "traces_workload", "verdicts"]

SLO_GOAL = 0.99
FLASH_SLO_GOAL = 0.98
OPTIMUM_GOAL = 1.15


def traces_workload(peak: float) -> Workload:
    """``diurnal-bursty``'s request lengths and SLO with a constant arrival (so the backtest's ramp
    and burst detection, built for that workload's shape, stays out of the way)."""
    w = load_workload("diurnal-bursty")
    return w.model_copy(update={"arrival": w.arrival.model_copy(update={"kind": "poisson", "rate": peak})})


def shape_trace(shape: Shape, w: Workload, *, seed: int) -> Trace:
    """The requests of ``shape`` over its warm-up and days: thinned Poisson arrivals, ``w``'s lengths."""
    end = (shape.warmup_days + shape.days) * DAY_S
    arrivals = random.Random(f"{seed}:{shape.name}:arrivals")
    shapes = random.Random(f"{seed}:{shape.name}:shapes")
    lam = shape.max_rate
    tr = Trace(model=w.model)
    t = 0.0
    rate = shape.rate
    while True:
        t += arrivals.expovariate(lam)
        if t >= end:
            break
        if arrivals.random() * lam > rate(t):
            continue
        tr.t.append(t)
        tr.prompt.append(w.prompt_tokens.sample(shapes))
        tr.output.append(w.output_tokens.sample(shapes))
        tr.stream.append(shapes.random() < w.stream)
    return tr


def cell(shape_name: str, seed: int, policy: str, opts: BacktestOptions, *, peak: float,
         capacity_tokens_s: float) -> dict[str, Any]:
    """One (shape, seed, policy) run: the backtest's figures (without the per-round series) and,
    per event of the shape, whether its first round of load was beyond the replicas in place and
    the lag to the first scale-up after its start."""
    shape = make_shape(shape_name, seed=seed, peak=peak, warmup_days=opts.warmup_days)
    w = traces_workload(peak)
    o = replace(opts, days=shape.days, seed=seed, capacity_tokens_s=capacity_tokens_s)
    trace = shape_trace(shape, w, seed=seed)
    windows = [(a, b) for a, b, _ in shape.events]
    r = run_backtest(w, policy, o, trace=trace, capacity={"tokens_per_s": capacity_tokens_s, "source": "given"},
                     windows=windows or None)
    ups = sorted(r["up_times"])
    series = r.pop("series")
    lags: list[float | None] = []
    beyond: list[bool] = []
    for a, _, _ in shape.events:
        # Beyond the replicas in place: the event's first round of load (tokens/s of its arrivals
        # in [a, a + interval)) above what the pool's starting and ready replicas serve at SLO.
        before = [row for row in series if row["t"] <= a]
        in_place = (before[-1]["starting"] + before[-1]["ready"]) * capacity_tokens_s if before else 0.0
        lo, hi = bisect.bisect_left(trace.t, a), bisect.bisect_left(trace.t, a + o.interval_s)
        load = sum(trace.prompt[i] + trace.output[i] for i in range(lo, hi)) / o.interval_s
        beyond.append(load > in_place)
        later = [u for u in ups if u >= a]
        lags.append(later[0] - a if later else None)
    r["replicas_series"] = [(row["t"], row["starting"] + row["ready"]) for row in series[::5]]
    r.update({"shape": shape_name, "seed": seed, "events": [list(e) for e in shape.events], "event_lags_s": lags,
              "event_beyond": beyond})
    return r


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def summarise_cells(cells: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """shape → policy → means over the seeds: SLO, events' SLO, GPU-hours, optimum, ratios, lags."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in cells:
        by.setdefault((c["shape"], c["policy"]), []).append(c)
    for (shape, policy), cs in sorted(by.items()):
        react = {c["seed"]: c for c in cells if c["shape"] == shape and c["policy"] == "reactive"}
        # the lag counts only for events whose load was beyond the replicas in place (else no
        # scale-up was due)
        lags = [lag for c in cs for lag, due in zip(c["event_lags_s"], c["event_beyond"], strict=True) if due]
        ev = [c["slo_attainment_bursts"] for c in cs if c["slo_attainment_bursts"] is not None]
        row = {
            "seeds": sorted(c["seed"] for c in cs),
            "slo": mean(c["slo_attainment"] for c in cs),
            "slo_min": min(c["slo_attainment"] for c in cs),
            "slo_events": mean(ev) if ev else None,
            "gpu_hours": mean(c["gpu_hours"] for c in cs),
            "optimum": mean(c["optimum"]["gpu_hours"] for c in cs),
            "x_optimum": mean(_ratio(c["gpu_hours"], c["optimum"]["gpu_hours"]) for c in cs),
            "x_reactive": (mean(_ratio(c["gpu_hours"], react[c["seed"]]["gpu_hours"]) for c in cs)
                           if all(c["seed"] in react for c in cs) else None),
            "events": sum(len(c["event_lags_s"]) for c in cs),
            "events_beyond": len(lags),
            "max_lag_s": (None if not lags else math.inf if any(x is None for x in lags)
                          else max(x for x in lags if x is not None)),
            "burst_rounds": sum(c["burst_rounds"] for c in cs),
            "requests": sum(c["requests"] for c in cs),
            "wall_s": sum(c["wall_s"] for c in cs),
        }
        out.setdefault(shape, {})[policy] = row
    return out


def verdicts(summary: dict[str, dict[str, dict[str, Any]]], *, interval_s: float,
             policy: str = "predictive") -> list[dict[str, Any]]:
    """One row per (shape, goal) for ``policy`` (module docstring): goal, value, met (True, False or None: n/a)."""
    rows: list[dict[str, Any]] = []
    for shape, pols in summary.items():
        p, r = pols.get(policy), pols.get("reactive")
        if p is None:
            continue
        if shape == "flash":
            goal = FLASH_SLO_GOAL if r is None else max(FLASH_SLO_GOAL, r["slo"])
            rows.append({"shape": shape, "goal": "SLO >= reactive's and >= 98 %", "value": p["slo"],
                         "target": goal, "met": p["slo"] >= goal - 1e-12})
            lag = p["max_lag_s"]
            rows.append({"shape": shape, "goal": "every crowd's first scale-up within one round",
                         "value": lag, "target": 2 * interval_s,
                         "met": lag is not None and lag <= 2 * interval_s + 1e-9})
        else:
            rows.append({"shape": shape, "goal": "SLO >= 99 %", "value": p["slo"], "target": SLO_GOAL,
                         "met": p["slo"] >= SLO_GOAL})
        rows.append({"shape": shape, "goal": "GPU-h <= 1.15 x optimum", "value": p["x_optimum"],
                     "target": OPTIMUM_GOAL, "met": p["x_optimum"] <= OPTIMUM_GOAL})
        points = [(v["slo"], v["gpu_hours"]) for k, v in pols.items() if k == "reactive" or k.startswith("reactive@")]
        if points:
            met, ref = reactive_at(p["slo"], p["gpu_hours"], points)
            rows.append({"shape": shape, "goal": "GPU-h <= reactive's at equal SLO",
                         "value": p["x_reactive"] if ref is None else p["gpu_hours"] / ref, "target": 1.0, "met": met,
                         "reactive_points": sorted(points)})
    return rows


def reactive_at(slo: float, gpu_hours: float,
                points: Sequence[tuple[float, float]]) -> tuple[bool | None, float | None]:
    """(met, reactive's GPU-hours at ``slo``) by the rule of the module docstring; the GPU-hours
    are None where they are not interpolated (dominance decided it, or nothing brackets ``slo``)."""
    pts = sorted(points)
    for a, b in itertools.pairwise(pts):
        if a[0] <= slo <= b[0]:
            ref = a[1] if b[0] == a[0] else a[1] + (b[1] - a[1]) * (slo - a[0]) / (b[0] - a[0])
            return gpu_hours <= ref + 1e-9, ref
    if any(ps >= slo and pg < gpu_hours for ps, pg in pts):
        return False, None
    if any(ps <= slo and pg >= gpu_hours for ps, pg in pts):
        return True, None
    if len(pts) == 1 and pts[0][0] == slo:
        return gpu_hours <= pts[0][1], pts[0][1]
    return None, None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.2f} %"


def format_table(summary: dict[str, dict[str, dict[str, Any]]], rows: list[dict[str, Any]]) -> str:
    """The per-shape table and the verdicts, as printed by ``python -m benchmarks.autoscale_traces``."""
    head = ("shape", "policy", "seeds", "SLO", "SLO min", "SLO events", "GPU-h", "optimum", "x opt", "x react",
            "max lag s", "bursts", "requests", "wall s")
    lines = ["  ".join(f"{h:>10}" for h in head)]
    for shape in SHAPES:
        for policy, r in summary.get(shape, {}).items():
            lag = r["max_lag_s"]
            vals = (shape, policy, ",".join(map(str, r["seeds"])), _pct(r["slo"]), _pct(r["slo_min"]),
                    _pct(r["slo_events"]), f"{r['gpu_hours']:.1f}", f"{r['optimum']:.1f}", f"{r['x_optimum']:.3f}",
                    "-" if r["x_reactive"] is None else f"{r['x_reactive']:.3f}",
                    "-" if lag is None else f"{lag:.0f}", r["burst_rounds"], r["requests"], f"{r['wall_s']:.0f}")
            lines.append("  ".join(f"{v!s:>10}" for v in vals))
    for g in rows:
        v = g["value"]
        shown = ("-" if v is None else f"{v * 100:.2f} %" if g["goal"].startswith("SLO") else f"{v:.0f} s"
                 if "round" in g["goal"] else f"{v:.3f}")
        word = "met" if g["met"] else "not judged (outside reactive's SLO range)" if g["met"] is None else "NOT met"
        lines.append(f"goal {g['shape']}: {g['goal']}: {shown} — {word}")
    return "\n".join(lines)
