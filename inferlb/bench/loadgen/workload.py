"""Workloads: open-loop arrival processes, heavy-tailed lengths, tenants and priorities → a request plan.

Contract: :func:`plan` is pure and deterministic: the same :class:`Workload`, seed, rate and
duration give the same list of :class:`PlannedRequest` on every machine (``random.Random`` streams
seeded by name, no numpy). Arrival times and request shapes come from separate streams, so the
*i*-th request has the same lengths at any rate: a capacity search or a comparison changes how
often requests come, not what they are.

Arrivals are open loop (a client that does not wait for answers, so overload shows as queueing
instead of being hidden by a fixed number of users). Every process is a non-homogeneous Poisson
process with rate ``λ(t)``, drawn by thinning:

- ``poisson``: ``λ = rate``;
- ``onoff`` (bursty): ``rate × on_factor`` for ``on_s``, then ``rate × off_factor`` for ``off_s``;
- ``diurnal``: a sine between ``rate × (1 - amplitude)`` and ``rate × (1 + amplitude)`` over
  ``period_s`` (a day compressed into minutes);
- ``step``: ``rate`` until ``step_at_s``, then ``rate × step_factor`` (a step to N× capacity).
- ``diurnal-bursty``: days of ``period_s`` (a real day: 86,400 s) shaped like a working day
  (night at ``night_factor`` of the peak, a morning ramp 7–10 h, a lunch dip, the peak mid-afternoon,
  an evening fall), ``rate`` at the weekday peak; day ``d`` is a weekend day when ``d % 7`` is 5
  or 6 (``weekend_factor``); each day's level drifts by up to ``±level_drift``; about
  ``bursts_per_day`` unannounced bursts a day multiply the rate by ``burst_min``–``burst_max`` for
  ``burst_min_s``–``burst_max_s``. Drifts and bursts are drawn per day from ``random.Random`` seeded
  with ``(burst_seed, day)``, so ``λ(t)`` is a pure function of ``t``.

Workload files are YAML or JSON with the fields of :class:`Workload`; unknown keys are refused.

A workload with ``sessions`` (:class:`Sessions`) is multi-turn chat instead: sessions start as a
Poisson process, each reuses one of a few shared system prompts and resends its whole history
with every turn (:mod:`.sessions`), the workload of prefix and session affinity.
"""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "BUILTIN_WORKLOADS",
    "SLO",
    "Arrival",
    "ChatTurn",
    "LengthDist",
    "MaxTokensMix",
    "PlannedRequest",
    "Sessions",
    "Workload",
    "declared_max_tokens",
    "iter_plan",
    "load_workload",
    "plan",
    "workday_shape",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LengthDist(_Strict):
    """A token-length distribution, clipped to ``[min, max]``.

    ``constant`` (``value``), ``uniform`` (``min``..``max``), ``lognormal`` (``median``, ``sigma``:
    the log's standard deviation) or ``pareto`` (``scale`` = the minimum x_m, ``alpha`` = the tail
    index; smaller alpha, heavier tail).
    """

    dist: Literal["constant", "uniform", "lognormal", "pareto"] = "lognormal"
    value: int = Field(128, ge=1)
    median: float = Field(128.0, gt=0)
    sigma: float = Field(1.0, ge=0)
    scale: float = Field(32.0, gt=0)
    alpha: float = Field(1.5, gt=0)
    min: int = Field(1, ge=1)
    max: int = Field(4096, ge=1)

    @model_validator(mode="after")
    def _range(self) -> LengthDist:
        if self.min > self.max:
            raise ValueError("min must be <= max")
        return self

    def sample(self, rng: random.Random) -> int:
        if self.dist == "constant":
            x = float(self.value)
        elif self.dist == "uniform":
            return rng.randint(self.min, self.max)
        elif self.dist == "lognormal":
            x = rng.lognormvariate(math.log(self.median), self.sigma)
        else:
            x = self.scale * rng.paretovariate(self.alpha)
        return int(min(self.max, max(self.min, round(x))))


class Arrival(_Strict):
    """An open-loop arrival process (see the module docstring); ``rate`` in requests per second."""

    kind: Literal["poisson", "onoff", "diurnal", "step", "diurnal-bursty"] = "poisson"
    rate: float = Field(1.0, gt=0)
    on_s: float = Field(5.0, gt=0)
    off_s: float = Field(5.0, gt=0)
    on_factor: float = Field(1.8, ge=0)
    off_factor: float = Field(0.2, ge=0)
    period_s: float = Field(120.0, gt=0)
    amplitude: float = Field(0.5, ge=0, le=1)
    step_at_s: float = Field(30.0, ge=0)
    step_factor: float = Field(2.0, ge=0)
    # diurnal-bursty (period_s is the day)
    night_factor: float = Field(0.1, ge=0, le=1)
    weekend_factor: float = Field(0.5, ge=0, le=1)
    level_drift: float = Field(0.1, ge=0, lt=1)
    bursts_per_day: float = Field(2.0, ge=0)
    burst_min: float = Field(1.5, ge=1)
    burst_max: float = Field(2.5, ge=1)
    burst_min_s: float = Field(900.0, gt=0)
    burst_max_s: float = Field(2700.0, gt=0)
    burst_seed: int = 0

    @model_validator(mode="after")
    def _bursts(self) -> Arrival:
        if self.burst_min > self.burst_max or self.burst_min_s > self.burst_max_s:
            raise ValueError("burst_min must be <= burst_max and burst_min_s <= burst_max_s")
        return self

    def day_level(self, day: int) -> float:
        """diurnal-bursty: the level of day ``day`` (weekend factor and drift)."""
        level, _ = _day_draws(self.burst_seed, day, self.level_drift, self.bursts_per_day, self.burst_min,
                              self.burst_max, self.burst_min_s, self.burst_max_s, self.period_s)
        return level * (self.weekend_factor if day % 7 >= 5 else 1.0)

    def bursts(self, day: int) -> tuple[tuple[float, float, float], ...]:
        """diurnal-bursty: the bursts of day ``day``: (start, end, factor), times in seconds of the run."""
        return _day_draws(self.burst_seed, day, self.level_drift, self.bursts_per_day, self.burst_min,
                          self.burst_max, self.burst_min_s, self.burst_max_s, self.period_s)[1]

    def base_rate_at(self, t: float, scale: float = 1.0) -> float:
        """diurnal-bursty: the rate without its bursts (the shape a forecaster can learn)."""
        day = math.floor(t / self.period_s)
        x = (t - day * self.period_s) / self.period_s
        return self.rate * scale * self.day_level(day) * workday_shape(x, self.night_factor)

    def rate_at(self, t: float, scale: float = 1.0) -> float:
        r = self.rate * scale
        if self.kind == "diurnal-bursty":
            base = self.base_rate_at(t, scale)
            day = math.floor(t / self.period_s)
            for d in (day - 1, day):    # a burst may run past midnight
                for start, end, factor in self.bursts(d):
                    if start <= t < end:
                        return base * factor
            return base
        if self.kind == "onoff":
            return r * (self.on_factor if (t % (self.on_s + self.off_s)) < self.on_s else self.off_factor)
        if self.kind == "diurnal":
            return r * (1.0 + self.amplitude * math.sin(2 * math.pi * t / self.period_s - math.pi / 2))
        if self.kind == "step":
            return r * (self.step_factor if t >= self.step_at_s else 1.0)
        return r

    def max_rate(self, scale: float = 1.0) -> float:
        r = self.rate * scale
        if self.kind == "diurnal-bursty":
            return r * (1.0 + self.level_drift) * self.burst_max
        if self.kind == "onoff":
            return r * max(self.on_factor, self.off_factor)
        if self.kind == "diurnal":
            return r * (1.0 + self.amplitude)
        if self.kind == "step":
            return r * max(1.0, self.step_factor)
        return r


def workday_shape(x: float, night: float = 0.1) -> float:
    """Relative load over one day, ``x`` in [0, 1) (0 = midnight), peak 1.0: ``night`` until 6 h, a
    morning ramp (most of it 7–10 h), a dip at lunch, the peak mid-afternoon, an evening fall 18–22 h."""
    h = x * 24
    up = 1 / (1 + math.exp(-(h - 8.5) * 2.2))
    down = 1 / (1 + math.exp(-(h - 19.5) * 1.4))
    lunch = 0.15 * math.exp(-((h - 12.5) ** 2) / 0.5)
    afternoon = 0.12 * math.exp(-((h - 15.0) ** 2) / 3.0)
    day = max(0.0, up - down) * (1.0 - lunch + afternoon) / 1.12
    return night + (1.0 - night) * min(1.0, day)


@functools.lru_cache(maxsize=4096)
def _day_draws(seed: int, day: int, drift: float, per_day: float, f_min: float, f_max: float, s_min: float,
               s_max: float, day_s: float) -> tuple[float, tuple[tuple[float, float, float], ...]]:
    rng = random.Random(f"{seed}:day:{day}")
    level = 1.0 + rng.uniform(-drift, drift)
    bursts: list[tuple[float, float, float]] = []
    n = 0
    # a Poisson number of bursts (mean per_day), each at a uniform time of the day
    budget = rng.expovariate(1.0) if per_day > 0 else math.inf
    while budget < per_day and n < 50:
        start = day * day_s + rng.uniform(0, day_s)
        bursts.append((start, start + rng.uniform(s_min, s_max), rng.uniform(f_min, f_max)))
        budget += rng.expovariate(1.0)
        n += 1
    return level, tuple(sorted(bursts))


class SLO(_Strict):
    """A request is *good* when it succeeded within both limits (TTFT only counts for streams)."""

    ttft_s: float = Field(2.0, gt=0)
    e2e_s: float = Field(30.0, gt=0)


class Sessions(_Strict):
    """Multi-turn chat: ``system_prompts`` shared system prompts of ``system_tokens`` each (a
    session picks one at random), ``turns`` turns a session, each a new user message of
    ``user_tokens`` answered with the workload's ``output_tokens``, ``think_s`` (mean,
    exponential) between a turn's send and the next (the load generator's open-loop plan; the
    DES's closed-loop sessions, ``sessions.session_plan``, draw their think time after each
    answer instead). Every turn resends the system prompt and the
    whole history, as chat clients do. ``send_session``: the session id goes in the body's
    ``user`` field (the gateway's session affinity reads it)."""

    system_prompts: int = Field(8, ge=1, le=10_000)
    system_tokens: LengthDist = LengthDist(dist="constant", value=2000, max=16_000)
    turns: LengthDist = LengthDist(dist="uniform", min=4, max=10)
    user_tokens: LengthDist = LengthDist(median=300, sigma=0.5, max=2000)
    think_s: float = Field(2.0, gt=0)
    send_session: bool = True


class MaxTokensMix(_Strict):
    """``max_tokens: mix``: what each client declares, drawn per request (its own random stream,
    so the lengths and arrivals are those of the same workload without the mix).

    ``none``: the share of requests without ``max_tokens`` (the gateway assumes the model's
    ``default_max_tokens``); ``loose``: the share with a generous cap, one of ``loose_values``
    at random (answers longer than it are cut there, as a server does); ``exact``: the share
    that declares exactly the answer's length (the old benchmark default, unrealistic: no client
    knows it). The default shares are ASSUMPTIONS, not measurements: no published study of how
    many production clients send ``max_tokens`` was found; OpenAI-compatible SDKs send none
    unless the caller sets it, and chat front ends that do set it use round caps such as 1,024
    to 4,096. Set your own from your audit trail (the share of requests whose ``max_tokens`` was
    null)."""

    none: float = Field(0.6, ge=0)
    loose: float = Field(0.35, ge=0)
    exact: float = Field(0.05, ge=0)
    loose_values: tuple[int, ...] = (1024, 2048, 4096)

    @model_validator(mode="after")
    def _shares(self) -> MaxTokensMix:
        if self.none + self.loose + self.exact <= 0:
            raise ValueError("the max_tokens shares must have a positive sum")
        if not self.loose_values or min(self.loose_values) < 1:
            raise ValueError("loose_values must be integers >= 1")
        return self


class Workload(_Strict):
    """Everything about the load except where it goes."""

    name: str = "custom"
    model: str = "sim-llm"
    arrival: Arrival = Arrival()
    duration_s: float = Field(60.0, gt=0)
    warmup_s: float = Field(0.0, ge=0)            # requests sent before this are not in the figures
    prompt_tokens: LengthDist = LengthDist(median=400, sigma=1.0, max=6000)
    output_tokens: LengthDist = LengthDist(median=120, sigma=1.0, max=2000)
    stream: float = Field(1.0, ge=0, le=1)         # share of streaming requests
    tenants: dict[str, float] = Field(default_factory=lambda: {"default": 1.0})
    priorities: dict[str, float] = Field(default_factory=dict)   # empty: no priority header
    # What clients declare: "exact" (the answer's length: an oracle no real client is), "none",
    # an integer cap for every request, or "mix" (max_tokens_mix, per request).
    max_tokens: Literal["exact", "none", "mix"] | int = "exact"
    max_tokens_mix: MaxTokensMix = MaxTokensMix()
    slo: SLO = SLO()
    timeout_s: float = Field(120.0, gt=0)          # the client gives up after this (not a success)
    deadline_s: float | None = Field(None, gt=0)   # x-inferlb-deadline-ms sent (default: timeout_s)
    sessions: Sessions | None = None               # multi-turn chat sessions (module docstring)

    @model_validator(mode="after")
    def _mixes(self) -> Workload:
        for name, mix in (("tenants", self.tenants), ("priorities", self.priorities)):
            if any(w < 0 for w in mix.values()) or (mix and sum(mix.values()) <= 0):
                raise ValueError(f"{name} weights must be >= 0 with a positive sum")
        if isinstance(self.max_tokens, int) and self.max_tokens < 1:
            raise ValueError("max_tokens must be 'exact', 'none', 'mix' or an integer >= 1")
        return self


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """A turn of a chat session: its system prompt and every turn so far as (user tokens,
    assistant tokens), this one last (its assistant part is what it will get back)."""

    session: str
    system: int
    system_tokens: int
    turns: tuple[tuple[int, int], ...]
    send_session: bool = True


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of a plan: when (seconds from the start), how big, whose."""

    t: float
    prompt_tokens: int
    output_tokens: int
    tenant: str | None = None
    priority: str | None = None
    model: str | None = None
    stream: bool = True
    api_key: str | None = None      # sent as a bearer token (the key names the tenant)
    chat: ChatTurn | None = None    # a turn of a multi-turn session (Workload.sessions)
    # What the client declares as max_tokens (None: it sends none). The answer is
    # min(output_tokens, max_tokens): output_tokens is what the model would write, which only the
    # node knows; the gateway (and the DES's routing) sees this field, never output_tokens.
    max_tokens: int | None = None

    @property
    def answer_tokens(self) -> int:
        """The answer's true length: what the model writes, cut at a declared ``max_tokens``."""
        m = self.max_tokens
        return self.output_tokens if m is None or m >= self.output_tokens else max(1, m)


def declared_max_tokens(w: Workload, output_tokens: int, rng: random.Random) -> int | None:
    """What a client of ``w`` declares for an answer of ``output_tokens`` (see ``Workload.max_tokens``);
    ``rng`` is drawn from only under ``mix``."""
    mode = w.max_tokens
    if mode == "exact":
        return output_tokens
    if mode == "none":
        return None
    if isinstance(mode, int):
        return mode
    mix = w.max_tokens_mix
    x = rng.random() * (mix.none + mix.loose + mix.exact)
    if x < mix.none:
        return None
    if x < mix.none + mix.loose:
        return mix.loose_values[rng.randrange(len(mix.loose_values))]
    return output_tokens


def _pick(rng: random.Random, mix: dict[str, float]) -> str | None:
    if not mix:
        return None
    x = rng.random() * sum(mix.values())
    for name, w in mix.items():
        x -= w
        if x < 0:
            return name
    return next(reversed(mix))


def plan(w: Workload, *, seed: int, rate: float | None = None, duration_s: float | None = None,
         max_requests: int = 1_000_000) -> list[PlannedRequest]:
    """The requests of ``w`` (``rate`` overrides ``w.arrival.rate``), at most ``max_requests``."""
    return list(iter_plan(w, seed=seed, rate=rate, duration_s=duration_s, max_requests=max_requests))


def iter_plan(w: Workload, *, seed: int, rate: float | None = None, duration_s: float | None = None,
              max_requests: int | None = None) -> Iterator[PlannedRequest]:
    """:func:`plan` one request at a time (the same requests), for plans too big to hold as objects
    (a week of traffic): bounded by the duration and, when given, ``max_requests``."""
    duration = duration_s if duration_s is not None else w.duration_s
    if w.sessions is not None:
        from inferlb.bench.loadgen.sessions import plan_sessions

        yield from plan_sessions(w, w.sessions, seed=seed, rate=rate if rate is not None else w.arrival.rate,
                                 duration_s=duration,
                                 max_requests=max_requests if max_requests is not None else 1_000_000)
        return
    scale = 1.0 if rate is None else rate / w.arrival.rate
    arrivals = random.Random(f"{seed}:arrivals")
    shapes = random.Random(f"{seed}:shapes")
    declares = random.Random(f"{seed}:max_tokens")
    lam_max = w.arrival.max_rate(scale)
    t = 0.0
    n = 0
    if lam_max <= 0:
        return
    cap = math.inf if max_requests is None else max_requests
    while n < cap:   # bounded by max_requests and by the duration
        t += arrivals.expovariate(lam_max)
        if t >= duration:
            break
        if arrivals.random() * lam_max > w.arrival.rate_at(t, scale):
            continue   # thinned out
        n += 1
        prompt, output = w.prompt_tokens.sample(shapes), w.output_tokens.sample(shapes)
        yield PlannedRequest(
            t=t, prompt_tokens=prompt, output_tokens=output,
            tenant=_pick(shapes, w.tenants), priority=_pick(shapes, w.priorities), model=w.model,
            stream=shapes.random() < w.stream, max_tokens=declared_max_tokens(w, output, declares))


BUILTIN_WORKLOADS: dict[str, dict[str, Any]] = {
    # Chat: lognormal prompts and answers (ShareGPT-like medians), all streamed.
    "chat": {"name": "chat"},
    # Heavy tails: lognormal prompts with a wide spread, Pareto answers (a few very long ones),
    # two tenants and a priority mix. The workload of the strategy comparison.
    "heavy-tail": {
        "name": "heavy-tail",
        "prompt_tokens": {"dist": "lognormal", "median": 400, "sigma": 1.0, "min": 16, "max": 4000},
        "output_tokens": {"dist": "pareto", "scale": 32, "alpha": 1.4, "min": 8, "max": 1024},
        "tenants": {"team-a": 0.7, "team-b": 0.3},
        "priorities": {"interactive": 0.6, "batch": 0.4},
        "slo": {"ttft_s": 2.0, "e2e_s": 20.0},
        "warmup_s": 5.0,
        "timeout_s": 60.0,
    },
    # heavy-tail as real clients send it: most declare no max_tokens, many a loose cap, few the
    # exact length (Workload.max_tokens_mix: the shares are assumptions, see MaxTokensMix).
    "heavy-tail-mixed": {
        "name": "heavy-tail-mixed",
        "prompt_tokens": {"dist": "lognormal", "median": 400, "sigma": 1.0, "min": 16, "max": 4000},
        "output_tokens": {"dist": "pareto", "scale": 32, "alpha": 1.4, "min": 8, "max": 1024},
        "tenants": {"team-a": 0.7, "team-b": 0.3},
        "priorities": {"interactive": 0.6, "batch": 0.4},
        "slo": {"ttft_s": 2.0, "e2e_s": 20.0},
        "warmup_s": 5.0,
        "timeout_s": 60.0,
        "max_tokens": "mix",
    },
    # Bursty on/off traffic with short answers.
    "bursty": {"name": "bursty", "arrival": {"kind": "onoff", "on_s": 5, "off_s": 10, "on_factor": 2.5,
                                             "off_factor": 0.25},
               "output_tokens": {"dist": "lognormal", "median": 64, "sigma": 0.8, "max": 1000}},
    # A compressed day: the rate swings ±60 % over two minutes.
    "diurnal": {"name": "diurnal", "arrival": {"kind": "diurnal", "period_s": 120, "amplitude": 0.6},
                "duration_s": 120},
    # A step to 2× the rate half-way through.
    "step": {"name": "step", "arrival": {"kind": "step", "step_at_s": 30, "step_factor": 2.0}},
    # Multi-turn chat: 8 shared 2,000-token system prompts, 4-10 turns a session of ~300 tokens
    # asked and ~100 answered, the history resent every turn (prompts grow to ~6k tokens; the
    # shape of SGLang's multi-turn benchmark): the prefix / session affinity benchmark. Sessions
    # take ~20 s to reach a steady mix: warm-up 15 s.
    "chat-sessions": {"name": "chat-sessions", "sessions": {},
                      "output_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.5, "max": 600},
                      "slo": {"ttft_s": 2.0, "e2e_s": 30.0}, "warmup_s": 15.0, "duration_s": 45.0,
                      "timeout_s": 60.0},
    # A week of a working day's traffic at real time scale (autoscaling backtests, `inferlb autoscale
    # backtest`): weekday peak ``rate`` req/s, weekends at half, morning ramps, about two unannounced
    # bursts a day at ×1.5–2.5 for 15–45 min. Short chat turns, so a week stays ~1.5 M requests.
    "diurnal-bursty": {
        "name": "diurnal-bursty",
        "arrival": {"kind": "diurnal-bursty", "rate": 5.0, "period_s": 86_400},
        "duration_s": 7 * 86_400,
        "prompt_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.8, "min": 8, "max": 2000},
        "output_tokens": {"dist": "lognormal", "median": 64, "sigma": 0.7, "min": 4, "max": 512},
        "slo": {"ttft_s": 2.0, "e2e_s": 20.0},
        "timeout_s": 60.0,
    },
    # Long streams of equal length: the emulator-cost measurement (many concurrent streams).
    "long-streams": {"name": "long-streams", "prompt_tokens": {"dist": "constant", "value": 64},
                     "output_tokens": {"dist": "constant", "value": 600, "max": 600},
                     "slo": {"ttft_s": 5.0, "e2e_s": 120.0}, "timeout_s": 180.0},
}


def load_workload(name_or_path: str) -> Workload:
    """A built-in workload by name (:data:`BUILTIN_WORKLOADS`) or a YAML / JSON file."""
    raw: Any = BUILTIN_WORKLOADS.get(name_or_path)
    source = name_or_path
    if raw is None:
        path = Path(name_or_path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"{path}: cannot read ({exc.strerror}); built-in workloads: "
                             f"{', '.join(BUILTIN_WORKLOADS)}") from exc
        try:
            raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise ValueError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: a workload is a mapping")
    try:
        return Workload.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise ValueError(f"{source}: {loc}: {first['msg']}") from exc
