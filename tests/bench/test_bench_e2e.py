"""Short bounded benchmarks end to end over real HTTP: the open-loop client against a real gateway
over simulated batching nodes (in-loop), and ``inferlb bench run`` as a user runs it (subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from inferlb.bench.loadgen.results import summarize
from inferlb.bench.loadgen.runner import run_plan
from inferlb.bench.loadgen.workload import PlannedRequest, Workload, plan
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import BatchSpec, NodeSpec
from tests.support import ROOT, fleet_for, running_gateway, settings_for


def _nodes() -> list[NodeSpec]:
    def node(name: str, step: float, kv: int) -> NodeSpec:
        return NodeSpec(name=name, models=["m", "emb"], batching=BatchSpec(
            kv_tokens=kv, step_base_s=step, step_per_seq_s=0.0001, prefill_s_per_token=0.00001))
    return [node("fast", 0.001, 8192), node("slow", 0.004, 2048)]


WORKLOAD = Workload(model="m", duration_s=2.0, arrival={"kind": "poisson", "rate": 15},
                    prompt_tokens={"dist": "lognormal", "median": 40, "sigma": 0.5, "max": 400},
                    output_tokens={"dist": "pareto", "scale": 4, "alpha": 1.5, "max": 60},
                    stream=0.7, tenants={"a": 1, "b": 1}, priorities={"interactive": 1},
                    # SLOs no answer misses even on a loaded machine: the test checks the accounting,
                    # not the speed (speed is what the benchmark commands print)
                    slo={"ttft_s": 60.0, "e2e_s": 60.0}, timeout_s=60.0)


async def test_open_loop_run_through_the_gateway(tmp_path: Path) -> None:
    reqs = plan(WORKLOAD, seed=5)
    assert 15 <= len(reqs) <= 50
    async with SimFleet(_nodes()) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        settings = settings_for(tmp_path, fleet_for(urls, profile="token-aware", seed=1))
        async with running_gateway(settings) as (base, _app):
            data = await run_plan(reqs, WORKLOAD, [base], label="token-aware", nodes=urls, sample_s=0.2)
        direct = await run_plan(reqs, WORKLOAD, list(urls.values()), label="direct", nodes=urls, sample_s=0.2)
    for d in (data, direct):
        s = summarize(d, WORKLOAD)
        assert s["ok"] == s["sent"] == len(reqs), s["errors"]
        assert s["good"] == s["ok"] and s["goodput_rps"] > 0
        assert s["e2e_s"]["n"] == s["ok"] and 0 < s["ttft_s"]["n"] <= s["ok"]
        assert set(s["share"]) <= {"fast", "slow"} and sum(s["share"].values()) == 1.0
        assert set(s["nodes"]) == {"fast", "slow"}
        assert sum(n["requests"] for n in s["nodes"].values()) >= len(reqs) - 2   # sampled counters
        assert s["lag_p99_s"] >= 0.0
    # "direct" is client-side round robin: request i goes to node i % 2.
    assert abs(summarize(direct, WORKLOAD)["share"]["fast"] - 0.5) <= 1 / len(reqs)


def test_bench_run_command_end_to_end(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("model: sim-llm\nnodes:\n"
                     "  - {name: a, preset: h100, step_base_s: 0.001, kv_tokens: 8192}\n"
                     "  - {name: b, preset: t4, step_base_s: 0.004, kv_tokens: 2048}\n")
    workload = tmp_path / "w.yaml"
    workload.write_text(json.dumps({**WORKLOAD.model_dump(), "model": "sim-llm"}))
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "inferlb.cli.main", "bench", "run", "--fleet", str(fleet), "--workload",
           str(workload), "--rate", "8", "--duration", "2", "--seed", "3", "--profile", "token-aware",
           "--json", str(out), "--markdown", "--quiet", "--workdir", str(tmp_path / "work")]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| target | sent | ok |" in r.stdout and "| node | share %" in r.stdout
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert run["label"] == "token-aware" and run["sent"] > 5 and run["ok"] == run["sent"], run["errors"]
    assert set(run["nodes"]) == {"a", "b"} and report["meta"]["fleet"] == str(fleet)
    assert len(report["outcomes"]["token-aware"]) == run["sent"]
    logs = sorted(p.name for p in (tmp_path / "work").glob("*.log"))
    assert any("sim" in n for n in logs) and any("gateway" in n for n in logs)


def test_bench_capacity_command_steps_until_p99_doubles(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    # One node running at most 4 sequences, 0.4 s each: 20 requests at 2 req/s never queue, at 40 req/s
    # they queue 5 deep.
    fleet.write_text("model: sim-llm\nnodes:\n  - {name: a, preset: t4, step_base_s: 0.02, step_per_seq_s: 0,"
                     " step_per_kv_token_s: 0, max_num_seqs: 4}\n")
    workload = tmp_path / "w.yaml"
    workload.write_text(json.dumps({**WORKLOAD.model_dump(), "model": "sim-llm", "stream": 1.0,
                                    "output_tokens": {"dist": "constant", "value": 20}}))
    out = tmp_path / "cap.json"
    cmd = [sys.executable, "-m", "inferlb.cli.main", "bench", "capacity", "--fleet", str(fleet), "--workload",
           str(workload), "--step-s", "0.5", "--base-rate", "2", "--start-rate", "40", "--factor", "4",
           "--max-steps", "2", "--json", str(out), "--quiet"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    cap = json.loads(out.read_text())["capacity"]
    assert cap["step_s"] == 0.5 and cap["steps"][0]["verdict"] == "baseline"
    # The baseline (10 s at 2 req/s) and the first step (0.5 s at 40 req/s) send the same requests.
    assert cap["steps"][0]["summary"]["sent"] == cap["steps"][1]["summary"]["sent"] > 10
    # The command stops at the first step over capacity, by either of its two rules (p99 more than
    # doubled, or more than 5 % errors); which rule trips first depends on the machine's speed.
    last = cap["steps"][-1]
    assert last["verdict"] == "over"
    assert last["p99_ratio"] > 2 or last["summary"]["error_rate"] > 0.05, last
    assert "capacity:" in r.stdout


async def test_closed_loop_mode_keeps_the_concurrency_and_sends_the_whole_plan() -> None:
    spec = NodeSpec(name="a", models=["sim-llm"], base_ttft_s=0.005, tpot_s=0.001)
    reqs = [PlannedRequest(t=100.0, prompt_tokens=10, output_tokens=5, stream=i % 2 == 0) for i in range(30)]
    w = Workload(model="sim-llm", max_tokens="exact", timeout_s=60.0)
    async with SimFleet([spec]) as sim:
        data = await run_plan(reqs, w, [sim.url("a")], label="closed", concurrency=3)
        stats = sim.nodes["a"].stats
        assert stats.requests_total == 30 and 1 <= stats.max_live <= 3    # never more than 3 in flight
    assert [o.i for o in data.outcomes] == list(range(30)) and all(o.ok for o in data.outcomes)
    assert all(o.t < 100.0 for o in data.outcomes)          # sent when a worker was free, not at plan time
    s = summarize(data, w)
    assert s["ok"] == s["sent"] == 30 and s["ttft_s"]["n"] == 15


def test_overload_cells_use_the_generator_plan_and_a_batching_fleet(tmp_path: Path) -> None:
    from inferlb.bench.overload import MIX, plan_cell, sim_fleet
    from inferlb.simulator.presets import load_sim_fleet

    flows = [(20.0, "B", "key-b"), (5.0, "A", "key-a")]
    p = plan_cell(0, 4.0, seed=41, max_tokens=7, streams=flows)
    assert p == plan_cell(0, 4.0, seed=41, max_tokens=7, streams=flows)            # seeded
    assert [r.t for r in p] == sorted(r.t for r in p) and all(r.t < 4.0 for r in p)
    assert {r.api_key for r in p if r.tenant == "A"} == {"key-a"} and {r.priority for r in p} <= set(MIX)
    assert 40 <= sum(r.tenant == "B" for r in p) <= 120                             # ≈ 80 at 20 req/s
    f = tmp_path / "fleet.yaml"
    f.write_text(json.dumps(sim_fleet(2, 4, 30, 0.02)))
    specs = load_sim_fleet(f)
    assert [s.name for s in specs] == ["sim0", "sim1"]
    assert all(s.batching is not None and s.batching.max_num_seqs == 4 for s in specs)
