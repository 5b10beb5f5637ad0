"""Autoscaling backtests (inferlb/bench/autoscale_backtest.py, autoscale_controller.py, cli_backtest.py):
the controller adapter in virtual time (cold start, no traffic to a cold node, drain before removal,
min held, the observed series), a forecaster with too little history falling back to reactive and
saying so, the diurnal-bursty workload, and the CLI on one simulated day of a small fleet."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from inferlb.autoscale.forecast import make_forecaster
from inferlb.autoscale.policy import Autoscaler
from inferlb.bench.autoscale_backtest import BacktestOptions, make_trace, run_backtest
from inferlb.bench.autoscale_controller import ScalerController
from inferlb.bench.loadgen.workload import PlannedRequest, Workload, load_workload
from inferlb.cli.main import main
from inferlb.config.autoscale import AutoscaleConfig
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.presets import preset_spec

# One simulated day of a small fleet: a tenth of the built-in workload's rate (~22 k requests).
SMALL: dict[str, object] = {
    "name": "small-diurnal-bursty",
    "arrival": {"kind": "diurnal-bursty", "rate": 0.5, "period_s": 86_400, "burst_seed": 3},
    "prompt_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.8, "min": 8, "max": 2000},
    "output_tokens": {"dist": "lognormal", "median": 64, "sigma": 0.7, "min": 4, "max": 512},
    "timeout_s": 60.0,
}
CAP = 300.0   # tokens/s per replica at SLO (about what the calibration finds for l4 / 4 sequences)


def small_opts(**over: object) -> BacktestOptions:
    base: dict[str, object] = {"days": 1.0, "warmup_days": 0.0, "capacity_tokens_s": CAP, "max_replicas": 16}
    base.update(over)
    return BacktestOptions(**base)  # type: ignore[arg-type]


# -- the controller adapter, virtual time ------------------------------------------------------------


def step_load(rate_lo: float, rate_hi: float) -> list[PlannedRequest]:
    """1 h at ``rate_lo``, 1 h at ``rate_hi``, 2 h at ``rate_lo`` req/s, evenly spaced; 300 tokens each
    (each declares its 64-token max_tokens: the controller counts what the gateway knows)."""
    out: list[PlannedRequest] = []
    t = 0.0
    for seconds, rate in ((3600, rate_lo), (3600, rate_hi), (7200, rate_lo)):
        end = t + seconds
        while t < end:
            out.append(PlannedRequest(t, 236, 64, model="sim-llm", stream=True, max_tokens=64))
            t += 1.0 / rate
    return out


def test_controller_scales_up_with_cold_start_and_drains_before_removing() -> None:
    cfg = AutoscaleConfig.model_validate({
        "interval_s": 60, "step_s": 300, "season_s": 86_400, "scale_down_stabilisation_s": 300,
        "burst_factor": None,    # the forecast path alone (the burst path: the test below)
        "pools": [{"model": "sim-llm", "gpu": "l4", "min": 1, "max": 10, "cold_start_s": 240}]})
    scaler = Autoscaler(cfg, make_forecaster("reactive"))
    ctl = ScalerController(scaler, model="sim-llm", gpu="l4", capacity_tokens_s=CAP, start=0.0,
                           make_spec=lambda name: preset_spec(name, "l4", ["sim-llm"], max_num_seqs=4))
    specs = ctl.initial(0.0)
    assert len(specs) == 1                                  # nothing observed yet: min
    reqs = step_load(0.5, 4.0)
    sim = Simulation(specs, seed=1, timeout_s=60, controller=ctl, control_every_s=60)
    res = sim.run(reqs)
    # observe: the closed steps are the arrivals' tokens per second, exactly
    assert ctl.series[0] == pytest.approx(0.5 * 300 * 300 / 300)
    assert ctl.series[13] == pytest.approx(4.0 * 300)      # 65–70 min: inside the high hour
    # the high hour needs 4.0 × 300 / 0.7 / 300 = 5.7 → 6 replicas
    assert max(r.desired for r in ctl.rounds) == 6
    late = [n for n in res.nodes if n.added_at > 0]
    assert len(late) == 5 and all(n.ready_at - n.added_at == pytest.approx(240) for n in late)
    first_up = min(n.added_at for n in late)
    assert 3600 < first_up <= 3600 + 300 + 60               # the step that shows it, then the next round
    index = {n.name: k for k, n in enumerate(res.nodes)}
    for k, n in enumerate(res.nodes):                       # no request ever went to a cold node
        served = [res.t[i] for i in range(len(res.t)) if res.node[i] == k]
        assert all(t >= n.ready_at for t in served), n.name
    # the fall: nodes drained (removed only once idle, newest first), never below min
    removed = [n for n in res.nodes if n.removed_at is not None]
    assert removed and all((n.removed_at or 0.0) >= 7200 + 300 for n in removed)
    assert min(r.desired for r in ctl.rounds) >= 1 and res.nodes[index[specs[0].name]].removed_at is None
    downs = [e for e in ctl.events if e["action"] == "down"]
    assert downs and downs[0]["nodes"][0] == late[-1].name
    for e in downs:
        for name in e["nodes"]:
            k = index[name]
            ends = [res.t[i] + res.e2e[i] for i in range(len(res.t)) if res.node[i] == k and not math.isnan(res.e2e[i])]
            assert (res.nodes[k].removed_at or -1.0) >= max(ends, default=0.0) - 1e-9   # never under a request
    assert res.counts()["failed"] == 0


def test_the_burst_path_scales_up_within_one_round_of_the_jump() -> None:
    """Issue 22, item 7, in virtual time: the load jumps ×8 at 3600 s, mid-step (steps of 300 s).
    With the burst path the first scale-up comes at most two rounds after the jump (the first
    round whose whole window lies in it: within one round), sized for the round's load and the
    backlog queued on the node; without it, only once the step that shows the jump has closed."""
    first: dict[bool, float] = {}
    for burst in (True, False):
        cfg = AutoscaleConfig.model_validate({
            "interval_s": 60, "step_s": 300, "season_s": 86_400, "scale_down_stabilisation_s": 300,
            "burst_factor": 1.0 if burst else None,
            "pools": [{"model": "sim-llm", "gpu": "l4", "min": 1, "max": 10, "cold_start_s": 240}]})
        ctl = ScalerController(Autoscaler(cfg, make_forecaster("reactive")), model="sim-llm", gpu="l4",
                               capacity_tokens_s=CAP, start=0.0,
                               make_spec=lambda name: preset_spec(name, "l4", ["sim-llm"], max_num_seqs=4))
        sim = Simulation(ctl.initial(0.0), seed=1, timeout_s=60, controller=ctl, control_every_s=60)
        # shifted by 30 s: the jump falls inside a round's window, not on its edge
        sim.run([PlannedRequest(r.t + 30, r.prompt_tokens, r.output_tokens, model=r.model, stream=r.stream,
                                max_tokens=r.max_tokens) for r in step_load(0.5, 4.0)])
        ups = [e for e in ctl.events if e["action"] == "up"]
        first[burst] = ups[0]["t"]
        if burst:
            assert ctl.bursts >= 1
            # within one round the replicas asked for serve the jump's load at capacity (4 req/s ×
            # 300 tokens = 1200 tokens/s = 4 replicas); the forecast path adds the target's margin
            # (5.7 → 6) once the step has closed
            assert max(e["after"] for e in ups if e["t"] <= 3630 + 2 * 60) * CAP >= 4.0 * 300
            assert max(r.desired for r in ctl.rounds) >= 6
    jump = 3630.0
    assert jump < first[True] <= jump + 2 * 60
    assert first[False] >= 3600 + 300         # the step [3600, 3900) closes at 3900


# -- too little history: reactive, and said ----------------------------------------------------------


def test_a_forecaster_with_too_little_history_falls_back_to_reactive_in_the_backtest() -> None:
    w = Workload.model_validate(SMALL)
    opts = small_opts(days=0.25)
    trace = make_trace(w, seed=1, duration_s=0.25 * 86_400)
    pred = run_backtest(w, "predictive", opts, trace=trace)
    react = run_backtest(w, "reactive", opts, trace=trace)
    # every forecast fell back, said why, and planned on the reactive forecast
    assert pred["forecasts"] > 0 and pred["forecast_fallbacks"] == pred["forecasts"]
    (why,) = pred["fallback_reasons"]
    assert "holt-winters needs N seasons" in why
    assert {r["method"] for r in pred["series"]} == {"reactive"}
    # so the run is the reactive policy's, to the request
    assert pred["gpu_hours"] == react["gpu_hours"] and pred["slo_attainment"] == react["slo_attainment"]
    assert pred["scale_events"] == react["scale_events"]
    # with a day of history, seasonal-naive has its season: no fallback
    naive = run_backtest(w, "predictive", small_opts(days=0.25, warmup_days=1.0, forecaster="seasonal-naive"))
    assert naive["forecast_fallbacks"] == 0 and {r["method"] for r in naive["series"]} == {"seasonal-naive"}


# -- the workload ------------------------------------------------------------------------------------


def test_diurnal_bursty_is_a_week_with_weekends_ramps_and_bursts() -> None:
    w = load_workload("diurnal-bursty")
    a = w.arrival
    assert w.duration_s == 7 * 86_400 and a.kind == "diurnal-bursty"
    noon_weekday, noon_weekend = a.base_rate_at(0 * 86_400 + 15 * 3600), a.base_rate_at(5 * 86_400 + 15 * 3600)
    d = a.level_drift
    assert a.weekend_factor * (1 - d) / (1 + d) <= noon_weekend / noon_weekday <= a.weekend_factor * (1 + d) / (1 - d)
    assert a.base_rate_at(3 * 3600) < 0.15 * a.rate < a.base_rate_at(11 * 3600)        # night, then the ramp
    bursts = [b for d in range(7) for b in a.bursts(d)]
    assert 5 <= len(bursts) <= 30
    b0, b1, factor = bursts[0]
    mid = (b0 + b1) / 2
    assert a.rate_at(mid) == pytest.approx(a.base_rate_at(mid) * factor)
    assert all(a.rate_at(t) <= a.max_rate() for t in range(0, 7 * 86_400, 600))
    assert a.rate_at(12_345.0) == a.rate_at(12_345.0)   # a pure function of t


# -- the CLI, one simulated day ----------------------------------------------------------------------


def test_backtest_cli_on_one_small_day(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wl = tmp_path / "small.yaml"
    wl.write_text(yaml.safe_dump(SMALL))
    rc = main(["autoscale", "backtest", "--workload", str(wl), "--policy", "static,reactive", "--policy", "oracle",
               "--days", "1", "--warmup-days", "0", "--capacity-tokens-s", str(CAP), "--max-replicas", "16",
               "--json", "--plot", str(tmp_path / "plots")])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    runs = doc["runs"]
    assert list(runs) == ["static", "reactive", "oracle"]
    n = runs["static"]["requests"]
    assert 15_000 < n < 40_000 and all(r["requests"] == n for r in runs.values())   # one plan for all
    for name, r in runs.items():
        assert 0.5 < r["slo_attainment"] <= 1.0 and r["gpu_hours"] > 0 and "series" not in r, name
        assert r["cost"] == pytest.approx(r["gpu_hours"] * 0.8)
        se = r["scale_events"]
        assert se["nodes_added"] >= se["up"] and se["rounds_with_change"] == se["up"] + se["down"]
        assert r["cold"]["total"] <= r["cold"]["routed_to_new_node"] + r["cold"]["waited_on_cold_capacity"]
    assert runs["static"]["scale_events"]["down"] == 0            # static peak never gives a node back
    assert runs["reactive"]["gpu_hours"] < runs["static"]["gpu_hours"]
    assert doc["goals"] == []                                    # no predictive run: nothing to compare
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "backtest_oracle.png", "backtest_reactive.png", "backtest_replicas.png", "backtest_static.png"]


def test_backtest_cli_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["autoscale", "backtest", "--policy", "clairvoyant"]) == 2
    assert "unknown policy 'clairvoyant'" in capsys.readouterr().err
    assert main(["autoscale", "backtest", "--workload", "no-such-workload.yaml"]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["autoscale", "backtest", "--step", "90", "--interval", "60"]) == 2
    assert "multiple of --interval" in capsys.readouterr().err
