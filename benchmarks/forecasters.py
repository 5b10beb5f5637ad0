"""Forecaster accuracy and CPU on synthetic load series: how the autoscaler's default was chosen.

``python -m benchmarks.forecasters [--days 14] [--origins 32] [--horizon 6] [--seed 1]
[--series seasonal,diurnal-bursty] [--json]`` (one series per run keeps a run under a minute here)

Two synthetic series of tokens/s at 5-minute steps (288 per day), ``--days`` long:

* ``seasonal``: a daily sine (trough 20 % of the peak) with a weekday/weekend level and 5 %
  Gaussian noise: what the textbook models assume;
* ``diurnal-bursty``: a working-day shape (morning ramp, lunch dip, afternoon peak, evening fall),
  day-to-day level drift of ±15 %, 10 % noise, and unannounced bursts (about two a day, ×1.5–3
  for 15–45 minutes): what an inference fleet sees.

Rolling origin: ``--origins`` forecast origins spread evenly over the last 7 days; at each one
every forecaster sees the 7 days before it and forecasts ``--horizon`` steps (30 min: a cold
start plus a round). Printed per series and forecaster: **WAPE** (Σ|error| / Σ actual over every
forecast step), **peak WAPE** (the same over steps whose actual is in the top quartile: where
under-provisioning hurts), **under** (share of steps forecast more than 10 % below the actual:
each is a step a pure forecast would have under-provisioned), the mean CPU seconds of one forecast
(``time.process_time``, fit included, library import excluded), and how often it fell back.
The oracle is exact by construction and not listed; ``reactive`` (hold the last value) and
``static`` (the history's peak) are the baselines.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from inferlb.autoscale.forecast import make_forecaster

__all__ = ["evaluate", "main", "series_diurnal_bursty", "series_seasonal"]

DAY = 288   # 5-minute steps


def series_seasonal(days: int, rng: random.Random, peak: float = 10_000.0) -> list[float]:
    out = []
    for t in range(days * DAY):
        day = t // DAY
        level = 1.0 if day % 7 < 5 else 0.6
        phase = 2 * math.pi * (t % DAY) / DAY
        shape = 0.6 - 0.4 * math.cos(phase)          # trough 0.2 at midnight, peak 1.0 at noon
        out.append(max(0.0, peak * level * shape * (1 + rng.gauss(0, 0.05))))
    return out


def _workday(x: float) -> float:
    """Relative load over one day, x in [0, 1): night 0.1, ramp 7–10 h, lunch dip, peak ~15 h."""
    h = x * 24
    base = 0.1
    ramp = 1 / (1 + math.exp(-(h - 8.5) * 1.8)) - 1 / (1 + math.exp(-(h - 19.5) * 1.2))
    lunch = 0.15 * math.exp(-((h - 12.5) ** 2) / 0.5)
    afternoon = 0.15 * math.exp(-((h - 15) ** 2) / 3)
    return base + 0.8 * ramp - lunch + afternoon


def series_diurnal_bursty(days: int, rng: random.Random, peak: float = 10_000.0) -> list[float]:
    out: list[float] = []
    burst_until, burst_mult = -1, 1.0
    level = 1.0
    for t in range(days * DAY):
        if t % DAY == 0:
            level = 1.0 + rng.uniform(-0.15, 0.15)
        if t > burst_until and rng.random() < 2 / DAY:
            burst_until, burst_mult = t + rng.randint(3, 9), rng.uniform(1.5, 3.0)
        mult = burst_mult if t <= burst_until else 1.0
        out.append(max(0.0, peak * level * _workday((t % DAY) / DAY) * mult * (1 + rng.gauss(0, 0.1))))
    return out


def evaluate(series: Sequence[float], names: Sequence[str], *, origins: int, horizon: int,
             history_days: int = 7) -> list[dict[str, Any]]:
    n = len(series)
    first = history_days * DAY
    span = n - horizon - first
    if span <= 0:
        raise ValueError("the series is too short for the history and the horizon")
    starts = sorted({first + round(i * span / max(1, origins - 1)) for i in range(origins)})
    actual_all = [series[s + h] for s in starts for h in range(horizon)]
    q3 = sorted(actual_all)[int(0.75 * (len(actual_all) - 1))]
    rows = []
    for name in names:
        fc = make_forecaster(name)
        err = tot = perr = ptot = 0.0
        under = steps = fallbacks = 0
        cpu = 0.0
        for s in starts:
            hist = series[s - first:s]
            t0 = time.process_time()
            f = fc.forecast(hist, horizon, DAY)
            cpu += time.process_time() - t0
            fallbacks += f.fallback is not None
            for h in range(horizon):
                a, p = series[s + h], f.values[h]
                err += abs(p - a)
                tot += a
                steps += 1
                under += p < 0.9 * a
                if a >= q3:
                    perr += abs(p - a)
                    ptot += a
        rows.append({"forecaster": name, "wape": err / tot, "peak_wape": perr / ptot if ptot else None,
                     "under": under / steps, "cpu_ms": cpu / len(starts) * 1000, "fallbacks": fallbacks,
                     "forecasts": len(starts)})
    return rows


def _warm(names: Sequence[str]) -> None:
    """Import the libraries once, outside the timed calls."""
    warm = series_seasonal(15, random.Random(0))
    for name in names:
        make_forecaster(name).forecast(warm[:14 * DAY], 6, DAY)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.forecasters")
    ap.add_argument("--days", type=int, default=14)
    ap.add_argument("--origins", type=int, default=32)
    ap.add_argument("--horizon", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--forecasters", default="seasonal-naive,holt-winters,mstl,reactive,static")
    ap.add_argument("--series", default="seasonal,diurnal-bursty", help="comma-separated: seasonal, diurnal-bursty")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.forecasters.split(",") if n.strip()]
    known: dict[str, Callable[[int, random.Random], list[float]]] = {
        "seasonal": series_seasonal, "diurnal-bursty": series_diurnal_bursty}
    makers = {k: known[k] for k in (x.strip() for x in args.series.split(",")) if k in known}
    t0 = time.perf_counter()
    _warm(names)
    results = {}
    for label, make in makers.items():
        results[label] = evaluate(make(args.days, random.Random(args.seed)), names, origins=args.origins,
                                  horizon=args.horizon)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{args.origins} origins × {args.horizon} steps of 5 min, 7 days of history, seed {args.seed}; "
          f"{time.perf_counter() - t0:.1f} s wall")
    print("| series | forecaster | WAPE | peak WAPE | under (>10 % low) | CPU per forecast | fallbacks |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, rows in results.items():
        for r in rows:
            print(f"| {label} | {r['forecaster']} | {r['wape'] * 100:.1f} % | {r['peak_wape'] * 100:.1f} % | "
                  f"{r['under'] * 100:.1f} % | {r['cpu_ms']:.1f} ms | {r['fallbacks']}/{r['forecasts']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
