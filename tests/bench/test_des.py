"""The DES glue in bench: figures by bench run's definitions, the gateway's admission controller,
and ``inferlb sim des`` (the speed benchmark's shape: tests/benchmarks/test_des_speed.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferlb.bench.des_admission import GatewayAdmission
from inferlb.bench.des_report import des_summary
from inferlb.bench.loadgen.results import is_good
from inferlb.bench.loadgen.runner import Outcome
from inferlb.bench.loadgen.workload import Workload, plan
from inferlb.config.admission import AdmissionPolicy
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.presets import preset_spec
from inferlb.simulator.spec import BatchSpec, NodeSpec
from tests.support import ROOT


def test_summary_counts_good_as_bench_runs_is_good() -> None:
    w = Workload(model="sim-llm", duration_s=30, arrival={"rate": 12}, warmup_s=3.0, stream=0.6,
                 slo={"ttft_s": 0.3, "e2e_s": 4.0}, timeout_s=20.0)
    reqs = plan(w, seed=4)
    res = Simulation([preset_spec("a", "l4"), preset_spec("b", "t4")], seed=4, timeout_s=w.timeout_s).run(reqs)
    s = des_summary(res, w, duration_s=w.duration_s)
    outcomes = [Outcome(r.i, r.t, r.prompt_tokens, r.output_tokens, r.stream, None, r.priority, ok=r.outcome == "ok",
                        ttft=r.ttft, e2e=r.e2e if r.e2e is not None else 0.0, tokens=r.tokens, node=r.node)
                for r in res.rows()]
    measured = [o for o in outcomes if o.t >= w.warmup_s]
    good = sum(is_good(o, w) for o in measured)
    assert 0 < good < len(measured)            # the SLO bites: a meaningful comparison
    assert s["good"] == good and s["measured"] == len(measured)
    assert s["slo_attainment"] == pytest.approx(good / len(measured))
    assert s["goodput_rps"] == pytest.approx(good / (w.duration_s - w.warmup_s))
    assert s["e2e_s"]["n"] == sum(o.ok for o in measured)
    assert sum(s["share"].values()) == pytest.approx(1.0)
    assert s["gpu_hours_total"] == pytest.approx(2 * res.end_s / 3600)


def _tiny(name: str, seqs: int) -> NodeSpec:
    return NodeSpec(name=name, models=["m"], max_concurrency=seqs,
                    batching=BatchSpec(max_num_seqs=seqs, step_base_s=0.1, step_per_seq_s=0.0, prefill_s_per_token=0.0))


def test_gateway_admission_queues_grants_and_sheds_like_the_controller() -> None:
    """One node, 2 slots; 1-s requests. The 3rd and 4th arrivals queue (no service time known yet:
    the queue holds one round of slots), the 5th is shed; the queued ones get the freed slots in
    order; a later burst, once the service time is known, is partly shed on expected wait."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class R:
        t: float
        prompt_tokens: int = 10
        output_tokens: int = 10
        model: str | None = "m"
        priority: str | None = None
        stream: bool = True

    adm = GatewayAdmission(AdmissionPolicy())
    sim = Simulation([_tiny("a", 2)], model="m", admission=adm)
    res = sim.run([R(0.0), R(0.01), R(0.02), R(0.03), R(0.04)] + [R(5.0 + i * 0.001) for i in range(6)])
    rows = list(res.rows())
    assert [r.outcome for r in rows[:5]] == ["ok", "ok", "ok", "ok", "rejected"]
    # slots free when the first two end: 1.0 s, and 1.1 s (the second joined the node's next step at 0.1 s)
    assert rows[2].queue == pytest.approx(1.0 - 0.02) and rows[3].queue == pytest.approx(1.1 - 0.03)
    assert "503" in (rows[4].reason or "")
    later = [r.outcome for r in rows[5:]]
    assert later.count("ok") >= 2 and "rejected" in later
    assert adm.ctl.holds == {} and adm.ctl.pools["m"].admitted == 0   # everything was released


def test_sim_des_command(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "inferlb.cli.main", "sim", "des", "--workload", "heavy-tail", "--nodes", "6",
           "--profile", "least-connections", "--rate", "15", "--duration", "20", "--json"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["profile"] == "least-connections" and s["workload"] == "heavy-tail"
    assert s["requests"] > 100 and sum(s["outcomes"].values()) == s["measured"] < s["requests"]   # warm-up out
    assert 0.0 < s["slo_attainment"] <= 1.0 and set(s["gpu_hours"]) == {"h100", "a100", "l4"}
    text = subprocess.run(cmd[:-1], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert text.returncode == 0 and "SLO" in text.stdout and "GPU-hours" in text.stdout
    bad = subprocess.run([*cmd[:5], "--nodes", "2", "--presets", "h200"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--presets: unknown h200" in bad.stderr and "Traceback" not in bad.stderr


def test_sim_des_routes_on_the_predictor_as_the_gateway_does(capsys: pytest.CaptureFixture[str]) -> None:
    from inferlb.cli.main import main

    argv = ["sim", "des", "--workload", "heavy-tail-mixed", "--nodes", "3", "--rate", "8", "--duration", "30",
            "--json"]
    assert main([*argv, "--output-length", "p50"]) == 0
    s = json.loads(capsys.readouterr().out)
    cal = s["output_length"]
    assert cal["budget"] == "p50" and cal["n"] > 100 and cal["learned"] > 50
    assert main(argv) == 0                               # the default, as the gateway's routing.output_length
    assert json.loads(capsys.readouterr().out)["output_length"]["budget"] == "mean"
    assert main([*argv, "--output-length", "off"]) == 0  # the declared budgets
    assert "output_length" not in json.loads(capsys.readouterr().out)
