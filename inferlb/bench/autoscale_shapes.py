"""Six seeded traffic shapes for autoscaling backtests (issue 22, item 7): what the autoscaler must
hold on, beyond the one week it was first shaped on.

Each shape is a rate function ``rate(t)`` in requests/s over the run's seconds (``t = 0`` is the
start of the warm-up days the autoscaler only sees as history), drawn from ``seed`` and scaled
by ``peak`` (the weekday peak, in requests/s, before crowds and noise). Times are real seconds;
a day is 86,400 s. The request shapes (prompt and output lengths) are the caller's workload's.

* ``diurnal`` (7 days): the working-day shape of ``diurnal-bursty``
  (:func:`~inferlb.bench.loadgen.workload.workday_shape`, night at 10 %) every day, weekends
  included, each day's level drawn ±10 %; no bursts. The shape a daily-seasonal forecaster fits.
* ``weekly`` (7 days): Monday to Friday the working day (Monday +10 %, Friday's afternoon falling
  from 15 h); Saturday and Sunday a leisure day at 35 % of the peak (a broad hump 11–23 h). The
  warm-up days are the weekend before, so Monday's ramp comes after two low days.
* ``step`` (1 day): a flat level (55 % of the peak) that steps up to ×1.6–2.0 at a time drawn in
  2–8 h, holds 3–6 h, steps back, and steps up once more (×1.3–1.6) for 2–4 h in the evening;
  every change within one second. Warm-up: the flat level.
* ``flash`` (2 days): the working day at half its amplitude (night at 30 %), plus flash crowds
  (Poisson, 4 a day, not in the warm-up): the rate jumps at once to ×2.5–4 of the base, then
  decays exponentially back (time constant 5–15 min, cut after 4 constants).
  :func:`flash_crowds` lists them (start, end, factor) for the per-crowd figures.
* ``sine`` (2 days): ``peak × (0.55 + 0.45 sin(2π t / 6 h))``: four cycles a day, a period that
  divides the forecasters' daily season.
* ``noisy`` (3 days): the working day × a slow multiplicative noise (log-AR(1) per 5 min,
  φ = 0.9, σ = 0.08, stationary σ ≈ 0.18) × each day's level ±15 %, plus small unannounced
  bumps (×1.2–1.5 for 10–40 min, 3 a day): the "real-shaped" trace, like a production day
  whose level wanders.

Every shape is a pure function of (``seed``, ``t``): the same seed gives the same trace, and a
different seed moves the steps, crowds, levels and noise. :func:`make_shape` returns a
:class:`Shape` (its days, its rate function and its events).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from inferlb.bench.loadgen.workload import workday_shape

__all__ = ["SHAPES", "Shape", "flash_crowds", "make_shape"]

DAY_S = 86_400.0
SHAPES = ("diurnal", "weekly", "step", "flash", "sine", "noisy")
DAYS = {"diurnal": 7.0, "weekly": 7.0, "step": 1.0, "flash": 2.0, "sine": 2.0, "noisy": 3.0}


@dataclass(frozen=True)
class Shape:
    """One trace shape: ``rate(t)`` req/s, ``max_rate`` its bound (for thinning), ``days`` simulated
    after ``warmup_days``; ``events``: (start, end, factor) of its crowds or steps, run seconds."""

    name: str
    days: float
    warmup_days: float
    rate: Callable[[float], float]
    max_rate: float
    events: tuple[tuple[float, float, float], ...] = field(default_factory=tuple)


def _levels(seed: int, name: str, days: int, spread: float) -> list[float]:
    rng = random.Random(f"{seed}:{name}:levels")
    return [1.0 + rng.uniform(-spread, spread) for _ in range(days)]


def _leisure(x: float) -> float:
    """A weekend day, peak 1.0: low until 9 h, a broad hump 11–23 h."""
    h = x * 24
    up = 1 / (1 + math.exp(-(h - 10.5) * 1.2))
    down = 1 / (1 + math.exp(-(h - 23.0) * 1.5))
    return 0.15 + 0.85 * max(0.0, up - down)


def flash_crowds(seed: int, *, start: float, end: float,
                 per_day: float = 4.0) -> tuple[tuple[float, float, float], ...]:
    """The ``flash`` shape's crowds in ``[start, end)``: (start, end, peak factor), sorted."""
    rng = random.Random(f"{seed}:flash:crowds")
    out: list[tuple[float, float, float]] = []
    t = start
    while True:
        t += rng.expovariate(per_day / DAY_S)
        if t >= end:
            break
        factor = rng.uniform(2.5, 4.0)
        tau = rng.uniform(300.0, 900.0)
        out.append((t, t + 4 * tau, factor))
    return tuple(out)


def _flash_factor(t: float, crowds: tuple[tuple[float, float, float], ...]) -> float:
    f = 1.0
    for a, b, k in crowds:
        if a <= t < b:
            tau = (b - a) / 4
            f = max(f, 1.0 + (k - 1.0) * math.exp(-(t - a) / tau))
    return f


def make_shape(name: str, *, seed: int, peak: float, warmup_days: float = 2.0) -> Shape:
    """The shape ``name`` (one of :data:`SHAPES`) for ``seed`` (module docstring)."""
    if name not in DAYS:
        raise ValueError(f"unknown trace shape {name!r} (known: {', '.join(SHAPES)})")
    days = DAYS[name]
    total = math.ceil(warmup_days + days) + 1
    w0 = warmup_days * DAY_S
    if name == "diurnal":
        lv = _levels(seed, name, total, 0.10)

        def _diurnal(t: float) -> float:
            d = int(t // DAY_S)
            return peak * lv[d] * workday_shape(t / DAY_S - d)

        return Shape(name, days, warmup_days, _diurnal, peak * 1.1)
    if name == "weekly":
        monday = round(warmup_days)            # the warm-up days are the weekend before Monday

        def _weekly(t: float) -> float:
            d = int(t // DAY_S)
            x = t / DAY_S - d
            wd = (d - monday) % 7                     # 0 = Monday ... 5, 6 = the weekend
            if wd >= 5:
                return peak * 0.35 * _leisure(x)
            v = workday_shape(x)
            if wd == 0:
                v *= 1.1
            if wd == 4 and x * 24 > 15:
                v *= max(0.4, 1.0 - 0.15 * (x * 24 - 15))
            return peak * v

        return Shape(name, days, warmup_days, _weekly, peak * 1.1)
    if name == "step":
        rng = random.Random(f"{seed}:step")
        up1 = w0 + rng.uniform(2, 8) * 3600
        down1 = up1 + rng.uniform(3, 6) * 3600
        k1 = rng.uniform(1.6, 2.0)
        up2 = w0 + rng.uniform(17, 19) * 3600
        down2 = up2 + rng.uniform(2, 4) * 3600
        k2 = rng.uniform(1.3, 1.6)
        base = 0.55 * peak
        events = ((up1, down1, k1), (up2, down2, k2))

        def _step(t: float) -> float:
            for a, b, k in events:
                if a <= t < b:
                    return base * k
            return base

        return Shape(name, days, warmup_days, _step, base * 2.0, events)
    if name == "flash":
        crowds = flash_crowds(seed, start=w0, end=w0 + days * DAY_S)
        lv = _levels(seed, name, total, 0.10)

        def _flash(t: float) -> float:
            d = int(t // DAY_S)
            b = 0.5 * peak * lv[d] * workday_shape(t / DAY_S - d, 0.3)
            return b * _flash_factor(t, crowds)

        return Shape(name, days, warmup_days, _flash, 0.5 * peak * 1.1 * 4.0, crowds)
    if name == "sine":
        def _sine(t: float) -> float:
            return peak * (0.55 + 0.45 * math.sin(2 * math.pi * t / (6 * 3600)))

        return Shape(name, days, warmup_days, _sine, peak)
    # noisy
    rng = random.Random(f"{seed}:noisy")
    lv = _levels(seed, name, total, 0.15)
    steps = total * 288
    noise = [0.0] * steps
    x = 0.0
    for i in range(steps):
        x = 0.9 * x + rng.gauss(0.0, 0.08)
        noise[i] = x
    bumps: list[tuple[float, float, float]] = []
    t = 0.0
    while True:
        t += rng.expovariate(3.0 / DAY_S)
        if t >= total * DAY_S:
            break
        bumps.append((t, t + rng.uniform(600, 2400), rng.uniform(1.2, 1.5)))

    top = peak * 1.15 * math.exp(4 * 0.18) * 1.5

    def _noisy(t: float) -> float:
        d = int(t // DAY_S)
        i = min(steps - 1, int(t // 300))
        # between two 5-min noise values, linearly (no step every 5 min)
        j = min(steps - 1, i + 1)
        frac = t / 300 - int(t // 300)
        n = noise[i] * (1 - frac) + noise[j] * frac
        v = peak * lv[d] * workday_shape(t / DAY_S - d) * math.exp(n)
        for a, b, k in bumps:
            if a <= t < b:
                v *= k
        return min(v, top)     # a 4-sigma excursion is clipped (the thinning's bound)

    return Shape(name, days, warmup_days, _noisy, top, tuple(b for b in bumps if b[0] >= w0))
