"""Autoscaling backtests: a week of traffic in the discrete-event simulator, sized by the autoscaler.

``inferlb autoscale backtest --workload diurnal-bursty|FILE --policy static|reactive|predictive|oracle
[--days 7] [--json] [--plot DIR]`` (inferlb/cli/backtest.py) calls :func:`run_backtest`.

What runs: the workload's plan (:func:`~inferlb.bench.loadgen.workload.iter_plan`) over
``warmup_days + days``; the warm-up days are not simulated, only binned into tokens/s per step
(the history a gateway's audit trail would hold when the week starts); the ``days`` after it run
in :class:`~inferlb.simulator.des.sim.Simulation` (the real routing core, the continuous-batching
node engines) with the :class:`~inferlb.autoscale.policy.Autoscaler` as its controller
(:class:`~.autoscale_controller.ScalerController`: one round every ``interval_s``, cold start on
every new node, scale-down drains before it removes). One pool: the workload's model on one GPU
preset. The policies differ only in the forecaster the same Autoscaler holds:

* ``static``: ``static`` (the history's peak: static peak provisioning);
* ``reactive``: ``reactive`` (the last step held: a target-utilisation rule like the HPA's);
* ``predictive``: ``forecaster`` (default ``holt-winters``; ``mstl`` is the gateway's default, and
  ~9× the CPU per fit: a week's 2,016 fits take ~9 min here, so the backtest default is the
  lighter one, chosen by the same accuracy table in docs/benchmarks.md);
* ``oracle``: the true tokens/s of the coming steps (perfect foresight; comparison only).

``predictive`` alone also gets the **skill gate** (``skill_window`` steps, None: off;
:mod:`inferlb.autoscale.skill`), the **level-shift guard** (``level_shift``: ``(k, z)``, None: off;
:mod:`inferlb.autoscale.shift`), the planner's **rise path** (``rise_ratio``, None: off) and
the forecast's **upper band** (``release_quantile``, None: off; :mod:`inferlb.autoscale.release`); the
other policies' Autoscaler is the plain one (their forecasts are the truth, the last value or
the peak: nothing to re-level).

**Capacity** (one replica's tokens/s at SLO, what the gateway learns from its audit trail,
autoscale/capacity.py) is measured first by :func:`calibrate`: the same node spec and
request shapes at constant Poisson rates on ``calibrate_nodes`` nodes; the highest rate whose SLO
attainment is ≥ ``slo_target`` (bisection), in tokens/s per node.

**Figures** (:func:`summarise`), over the simulated days:

* SLO attainment (good / requests; *good* as ``inferlb bench run`` defines it,
  :mod:`inferlb.bench.des_report`), also over **ramp** requests (arrived while the workload's
  burst-free rate rises by ≥ ``ramp_rise`` of its peak within the next 30 min) and **burst**
  requests (arrived inside one of the workload's bursts; diurnal-bursty only);
* GPU-hours (every node from its start, cold start included, to its removal) and cost;
* scale events (rounds that added or drained nodes; nodes added, drained);
* **requests that met a cold node**: *routed* to a node that became ready less than
  ``cold_window_s`` before (it had just finished its cold start), or *waited on cold capacity*:
  not good, and arrived while at least one node of the pool was still in its cold start
  (the capacity asked for was not serving yet). Both counted, and their union.
"""

from __future__ import annotations

import bisect
import math
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from inferlb.autoscale.forecast import make_forecaster
from inferlb.autoscale.policy import Autoscaler
from inferlb.autoscale.release import ForecastRelease
from inferlb.autoscale.shift import LevelShiftGuard
from inferlb.autoscale.skill import SkillGate
from inferlb.bench.autoscale_controller import ScalerController
from inferlb.bench.autoscale_optimum import offline_optimum
from inferlb.bench.des_report import des_summary
from inferlb.bench.loadgen.workload import PlannedRequest, Workload, iter_plan, plan
from inferlb.config.autoscale import AutoscaleConfig
from inferlb.simulator.des.results import DesResults
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.presets import preset_spec
from inferlb.simulator.spec import NodeSpec

__all__ = ["POLICIES", "BacktestOptions", "Trace", "calibrate", "goals", "make_trace", "run_backtest", "summarise"]

POLICIES = ("static", "reactive", "predictive", "oracle")
DAY_S = 86_400.0


@dataclass(frozen=True)
class BacktestOptions:
    """Everything a backtest run is made of; defaults are the ones docs/benchmarks.md used."""

    days: float = 7.0
    warmup_days: float = 2.0
    seed: int = 1
    preset: str = "l4"
    max_num_seqs: int = 4              # a small replica: a week is 1–30 nodes at ~1.3 M requests
    price_per_hour: float = 0.8        # per replica (USD)
    forecaster: str = "holt-winters"   # the predictive policy's
    cold_start_s: float = 300.0
    interval_s: float = 60.0
    step_s: float = 300.0
    min_replicas: int = 1
    max_replicas: int = 128
    target_utilisation: float | None = None          # None: the AutoscaleConfig default
    headroom: float | None = None
    scale_down_stabilisation_s: float | None = None
    burst_factor: float | None = 1.0                 # the planner's burst path (None: off)
    # predictive only: the level-shift guard's (k, z) and the planner's rise path (None: off).
    # Off by default, as in the gateway's Autoscaler, so a backtest runs what the gateway runs;
    # the rise path at 1.5 was measured as an option (docs/benchmarks.md, "Autoscaling: a skill
    # gate, a rise path and a level-shift guard").
    level_shift: tuple[int, float] | None = None
    rise_ratio: float | None = None
    skill_window: int | None = None        # the skill gate's window in steps (min_steps: half of it)
    release_quantile: float | None = None  # the forecast's upper band (autoscale/release.py; None: off)
    release_recent: int = 0                # its margin at least the largest of the last N errors
    capacity_tokens_s: float | None = None           # None: calibrate
    calibrate_nodes: int = 8
    calibrate_s: float = 1800.0
    slo_target: float = 0.99
    cold_window_s: float = 60.0
    ramp_rise: float = 0.1
    profile: str = "token-aware"

    def spec(self, name: str, model: str) -> NodeSpec:
        return preset_spec(name, self.preset, [model], max_num_seqs=self.max_num_seqs)

    def autoscale(self, model: str) -> AutoscaleConfig:
        raw: dict[str, Any] = {
            "interval_s": self.interval_s, "step_s": self.step_s, "season_s": DAY_S, "history_s": 7 * DAY_S,
            "pools": [{"model": model, "gpu": self.preset, "min": self.min_replicas, "max": self.max_replicas,
                       "cold_start_s": self.cold_start_s, "price_per_hour": self.price_per_hour}]}
        for key in ("target_utilisation", "headroom", "scale_down_stabilisation_s"):
            v = getattr(self, key)
            if v is not None:
                raw[key] = v
        raw["burst_factor"] = self.burst_factor
        return AutoscaleConfig.model_validate(raw)


@dataclass
class Trace:
    """The plan of a whole run as columns (a week of request objects would take ~400 MB)."""

    t: array[float] = field(default_factory=lambda: array("d"))
    prompt: array[int] = field(default_factory=lambda: array("l"))
    output: array[int] = field(default_factory=lambda: array("l"))
    stream: array[int] = field(default_factory=lambda: array("b"))
    model: str = "sim-llm"

    def requests(self, start: float) -> Iterator[PlannedRequest]:
        """The requests arriving at or after ``start``, as the simulation reads them."""
        i = bisect.bisect_left(self.t, start)
        t, p, o, s, m = self.t, self.prompt, self.output, self.stream, self.model
        for k in range(i, len(t)):
            # diurnal-bursty declares max_tokens "exact" (the Workload default): the DES routes on it
            yield PlannedRequest(t[k], p[k], o[k], model=m, stream=bool(s[k]), max_tokens=o[k])

    def steps(self, step_s: float, end: float) -> list[float]:
        """Tokens/s (prompt + output) of the arrivals per step of ``step_s`` in [0, ``end``)."""
        n = max(0, math.ceil(end / step_s - 1e-9))
        out = [0.0] * n
        for ti, pi, oi in zip(self.t, self.prompt, self.output, strict=True):
            k = int(ti // step_s)
            if k < n:
                out[k] += pi + oi
        return [x / step_s for x in out]


def make_trace(w: Workload, *, seed: int, duration_s: float) -> Trace:
    tr = Trace(model=w.model)
    for r in iter_plan(w, seed=seed, duration_s=duration_s):
        tr.t.append(r.t)
        tr.prompt.append(r.prompt_tokens)
        tr.output.append(r.output_tokens)
        tr.stream.append(r.stream)
    return tr


def calibrate(w: Workload, opts: BacktestOptions, *, seed: int = 7) -> dict[str, Any]:
    """One replica's tokens/s at SLO (see the module docstring) and how it was found."""
    n = opts.calibrate_nodes
    pois = w.model_copy(update={"arrival": w.arrival.model_copy(update={"kind": "poisson", "rate": 1.0}),
                                "warmup_s": 60.0})

    def attainment(rate: float) -> tuple[float, float]:
        reqs = plan(pois, seed=seed, rate=rate, duration_s=opts.calibrate_s, max_requests=200_000)
        sim = Simulation([opts.spec(f"cal-{i}", w.model) for i in range(n)], profile=opts.profile, seed=seed,
                         timeout_s=w.timeout_s, model=w.model)
        res = sim.run(reqs)
        s = des_summary(res, pois, duration_s=opts.calibrate_s)
        tokens = sum(r.prompt_tokens + r.output_tokens for r in reqs) / opts.calibrate_s
        return float(s["slo_attainment"]), tokens

    lo, hi = 0.05 * n, 10.0 * n
    best = (0.0, 0.0)
    tries = []
    for _ in range(10):
        mid = math.sqrt(lo * hi)
        att, tok = attainment(mid)
        tries.append({"rate": round(mid, 4), "slo_attainment": round(att, 5), "tokens_per_s": round(tok, 1)})
        if att >= opts.slo_target:
            lo, best = mid, (mid, tok)
        else:
            hi = mid
        if hi / lo < 1.05:
            break
    if best[1] <= 0:
        raise ValueError(f"calibration: even {lo:.3g} req/s on {n} nodes misses the SLO target; "
                         "the node spec cannot serve this workload's requests within its SLO")
    return {"tokens_per_s": best[1] / n, "rate_per_node": best[0] / n, "nodes": n, "tries": tries}


def _forecaster(policy: str, opts: BacktestOptions, truth: list[float], ctl: list[ScalerController]) -> Any:
    if policy == "static":
        return make_forecaster("static")
    if policy == "reactive":
        return make_forecaster("reactive")
    if policy == "predictive":
        return make_forecaster(opts.forecaster)
    if policy == "oracle":
        def future(n: int, h: int) -> list[float]:
            first = ctl[0].first if ctl else 0   # the history handed over starts at series[first]
            return truth[first + n:first + n + h]
        return make_forecaster("oracle", future=future)
    raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")


def run_backtest(w: Workload, policy: str, opts: BacktestOptions, *, trace: Trace | None = None,
                 capacity: dict[str, Any] | None = None,
                 windows: list[tuple[float, float]] | None = None) -> dict[str, Any]:
    """One policy over ``opts.days`` (module docstring): the figures and the per-round series.
    ``windows`` (start, end), run seconds: the "burst" requests are those arriving inside one
    (instead of the workload's own bursts), for traces whose events the caller knows."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
    start = round(opts.warmup_days * DAY_S / opts.step_s) * opts.step_s
    end = start + opts.days * DAY_S
    t0 = time.perf_counter()
    if trace is None:
        trace = make_trace(w, seed=opts.seed, duration_s=end)
    if capacity is None:
        capacity = ({"tokens_per_s": opts.capacity_tokens_s, "source": "given"} if opts.capacity_tokens_s
                    else calibrate(w, opts))
    cap = float(capacity["tokens_per_s"])
    truth = trace.steps(opts.step_s, end + DAY_S)
    cfg = opts.autoscale(w.model)
    release = (ForecastRelease(quantile=opts.release_quantile, recent=opts.release_recent)
               if policy == "predictive" and opts.release_quantile is not None else None)
    holder: list[ScalerController] = []
    guard = (LevelShiftGuard(k=opts.level_shift[0], z=opts.level_shift[1])
             if policy == "predictive" and opts.level_shift is not None else None)
    gate = (SkillGate(window=opts.skill_window, min_steps=max(1, opts.skill_window // 2))
            if policy == "predictive" and opts.skill_window is not None else None)
    scaler = Autoscaler(cfg, _forecaster(policy, opts, truth, holder), level_shift=guard,
                        rise_ratio=opts.rise_ratio if policy == "predictive" else None, skill_gate=gate,
                        release=release)
    ctl = ScalerController(scaler, model=w.model, gpu=opts.preset, capacity_tokens_s=cap,
                           make_spec=lambda name: opts.spec(name, w.model), start=start,
                           warm=truth[:round(start / opts.step_s)])
    holder.append(ctl)
    specs = ctl.initial(start)
    sim = Simulation(specs, profile=opts.profile, seed=opts.seed, timeout_s=w.timeout_s, model=w.model,
                     controller=ctl, control_every_s=opts.interval_s, start=start)
    t1 = time.perf_counter()
    res = sim.run(trace.requests(start), until=None)
    wall = time.perf_counter() - t1
    out = summarise(res, w, ctl, opts, start=start, end=end, windows=windows)
    s0, s1 = round(start / opts.step_s), round(end / opts.step_s)
    opt = offline_optimum(truth[s0:s1], cap, step_s=opts.step_s, cold_start_s=opts.cold_start_s,
                          min_replicas=opts.min_replicas, max_replicas=opts.max_replicas, ready_at_start=len(specs))
    out["optimum"] = {"gpu_hours": opt["gpu_hours"], "max_replicas": max(opt["need"], default=0)}
    out["level_shifts"] = guard.detections(w.model) if guard is not None else 0
    out["stabilisation_releases"] = scaler.releases
    out["band_releases"] = scaler.band_releases
    out["skill_closed_steps"] = gate.closed_steps(w.model) if gate is not None else 0
    out.update({"policy": policy, "forecaster": scaler.forecaster.name, "capacity": capacity,
                "wall_s": round(time.perf_counter() - t0, 1), "sim_wall_s": round(wall, 1),
                "options": {k: getattr(opts, k) for k in BacktestOptions.__dataclass_fields__},
                "autoscale": cfg.model_dump(exclude={"pools", "actuator"})})
    return out


def _cold(res: DesResults, start: float, window_s: float, good: list[bool]) -> dict[str, int]:
    """Requests that met a cold node (module docstring)."""
    late = {k for k, n in enumerate(res.nodes) if n.ready_at > start}
    merged: list[list[float]] = []      # when at least one node was in its cold start, disjoint
    for a, b in sorted((n.added_at, n.ready_at) for n in res.nodes if n.ready_at > n.added_at):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    starts = [a for a, _ in merged]
    routed = waited = both = 0
    node, nodes, ts = res.node, res.nodes, res.t
    for i in range(len(ts)):
        t = ts[i]
        k = node[i]
        r = k in late and 0 <= t - nodes[k].ready_at < window_s
        wt = False
        if not good[i]:
            j = bisect.bisect_right(starts, t) - 1
            wt = j >= 0 and t < merged[j][1]
        routed += r
        waited += wt
        both += r or wt
    return {"routed_to_new_node": routed, "waited_on_cold_capacity": waited, "total": both}


def summarise(res: DesResults, w: Workload, ctl: ScalerController, opts: BacktestOptions, *, start: float,
              end: float, windows: list[tuple[float, float]] | None = None) -> dict[str, Any]:
    s = des_summary(res, w, price_per_hour={opts.preset: opts.price_per_hour})
    ok = 0
    slo_t, slo_e = w.slo.ttft_s, w.slo.e2e_s
    good: list[bool] = []
    for i in range(len(res.t)):
        o = res.outcome[i]
        g = o == ok and res.e2e[i] <= slo_e and (not res.stream[i] or res.ttft[i] <= slo_t)
        good.append(bool(g))
    a = w.arrival
    base = a.base_rate_at if a.kind == "diurnal-bursty" else a.rate_at
    peak = a.rate * (1.0 + (a.level_drift if a.kind == "diurnal-bursty" else 0.0))
    ramp_n = ramp_good = burst_n = burst_good = 0
    bursts: list[tuple[float, float]] = []
    if a.kind == "diurnal-bursty":
        for d in range(int(start // a.period_s) - 1, int(end // a.period_s) + 1):
            bursts.extend((b0, b1) for b0, b1, _ in a.bursts(d))
        bursts.sort()
    if windows is not None:
        bursts = sorted(windows)
    ramp_cache: dict[int, bool] = {}
    for i in range(len(res.t)):
        t = res.t[i]
        k = int(t // 60)
        r = ramp_cache.get(k)
        if r is None:
            r = ramp_cache[k] = base(k * 60 + 1800) - base(k * 60) >= opts.ramp_rise * peak
        if r:
            ramp_n += 1
            ramp_good += good[i]
        if bursts:
            j = bisect.bisect_right(bursts, (t, math.inf))
            if any(b0 <= t < b1 for b0, b1 in bursts[max(0, j - 4):j]):
                burst_n += 1
                burst_good += good[i]
    ups = [e for e in ctl.events if e["action"] == "up"]
    downs = [e for e in ctl.events if e["action"] == "down"]
    gpu_h = s["gpu_hours_total"]
    return {
        "requests": s["requests"], "outcomes": s["outcomes"], "slo_attainment": s["slo_attainment"],
        "slo_attainment_ramps": ramp_good / ramp_n if ramp_n else None, "ramp_requests": ramp_n,
        "slo_attainment_bursts": burst_good / burst_n if burst_n else None, "burst_requests": burst_n,
        "gpu_hours": gpu_h, "cost": s.get("cost", 0.0), "currency": "USD",
        "scale_events": {"rounds_with_change": len(ctl.events), "up": len(ups), "down": len(downs),
                         "nodes_added": sum(len(e["nodes"]) for e in ups),
                         "nodes_drained": sum(len(e["nodes"]) for e in downs)},
        "cold": _cold(res, start, opts.cold_window_s, good),
        "replicas": {"max": max((r.desired for r in ctl.rounds), default=0),
                     "mean_held": gpu_h / max(1e-9, (res.end_s - start) / 3600.0)},
        "up_times": [e["t"] for e in ups], "burst_rounds": ctl.bursts,
        "forecasts": ctl.forecasts, "forecast_fallbacks": ctl.fallbacks,
        "fallback_reasons": ctl.fallback_reasons,
        "ttft_s": s["ttft_s"], "e2e_s": s["e2e_s"], "start_s": start, "end_s": res.end_s,
        "series": [{"t": r.t, "actual": r.actual, "forecast": r.forecast, "method": r.method,
                    "capacity": r.capacity, "starting": r.starting, "ready": r.ready, "draining": r.draining,
                    "desired": r.desired} for r in ctl.rounds],
    }


def goals(runs: dict[str, dict[str, Any]], *, slo_goal: float = 0.99) -> list[dict[str, Any]]:
    """Issue 11's goals, each with its measured value, for the policies present in ``runs``:
    predictive SLO attainment ≥ 99 %; its GPU-hours ≤ 1.15 × the oracle's and ≤ 0.75 × static
    peak's; its SLO attainment during ramps above reactive's. Issue 22's: GPU-hours ≤ 1.15 × the
    offline optimum (bench/autoscale_optimum.py, the least schedule in the planner's capacity
    model) and ≤ reactive's."""
    p = runs.get("predictive")
    if p is None:
        return []
    out: list[dict[str, Any]] = [{"goal": f"predictive SLO attainment >= {slo_goal * 100:g} %",
                                  "value": p["slo_attainment"], "met": p["slo_attainment"] >= slo_goal}]
    if "oracle" in runs:
        ratio = p["gpu_hours"] / runs["oracle"]["gpu_hours"]
        out.append({"goal": "predictive GPU-hours <= 1.15 x oracle", "value": ratio, "met": ratio <= 1.15})
    if p.get("optimum", {}).get("gpu_hours"):
        ratio = p["gpu_hours"] / p["optimum"]["gpu_hours"]
        out.append({"goal": "predictive GPU-hours <= 1.15 x the offline optimum", "value": ratio, "met": ratio <= 1.15})
    if "reactive" in runs:
        ratio = p["gpu_hours"] / runs["reactive"]["gpu_hours"]
        out.append({"goal": "predictive GPU-hours <= reactive's", "value": ratio, "met": ratio <= 1.0})
    if "static" in runs:
        ratio = p["gpu_hours"] / runs["static"]["gpu_hours"]
        out.append({"goal": "predictive GPU-hours <= 0.75 x static peak", "value": ratio, "met": ratio <= 0.75})
    if "reactive" in runs and p["slo_attainment_ramps"] is not None:
        r = runs["reactive"]["slo_attainment_ramps"]
        out.append({"goal": "predictive SLO attainment during ramps > reactive's",
                    "value": {"predictive": p["slo_attainment_ramps"], "reactive": r},
                    "met": r is not None and p["slo_attainment_ramps"] > r})
    return out
