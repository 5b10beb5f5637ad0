"""The load generator's pure parts: arrival processes, length distributions, plans, traces, figures."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from inferlb.bench.loadgen.report import compare_rows, node_rows, table_markdown
from inferlb.bench.loadgen.results import summarize
from inferlb.bench.loadgen.runner import Outcome, RunData, Sample
from inferlb.bench.loadgen.stack import gateway_fleet
from inferlb.bench.loadgen.trace import load_trace, parse_trace
from inferlb.bench.loadgen.workload import Arrival, LengthDist, Workload, load_workload, plan
from inferlb.simulator.presets import fleet_specs


def test_plan_is_deterministic_and_shapes_do_not_depend_on_rate() -> None:
    w = load_workload("heavy-tail")
    a = plan(w, seed=7, rate=4.0, duration_s=50)
    assert a == plan(w, seed=7, rate=4.0, duration_s=50)
    assert a != plan(w, seed=8, rate=4.0, duration_s=50)
    b = plan(w, seed=7, rate=8.0, duration_s=50)
    n = min(len(a), len(b))
    assert [(r.prompt_tokens, r.output_tokens, r.tenant) for r in a[:n]] == \
           [(r.prompt_tokens, r.output_tokens, r.tenant) for r in b[:n]]
    assert 150 < len(a) < 250 and 330 < len(b) < 470           # ≈ rate × duration
    assert all(0 <= x.t < 50 for x in a) and [x.t for x in a] == sorted(x.t for x in a)
    assert {r.tenant for r in a} == {"team-a", "team-b"} and {r.priority for r in a} == {"interactive", "batch"}


def test_length_distributions_are_heavy_tailed_and_clipped() -> None:
    rng = random.Random(1)
    logn = LengthDist(dist="lognormal", median=200, sigma=1.0, max=100_000)
    xs = [logn.sample(rng) for _ in range(20_000)]
    assert 180 < statistics.median(xs) < 220
    assert statistics.mean(xs) > 1.4 * statistics.median(xs)          # right-skewed
    par = LengthDist(dist="pareto", scale=32, alpha=1.5, min=1, max=10**9)
    ys = sorted(par.sample(rng) for _ in range(20_000))
    assert ys[0] >= 32 and 45 < ys[len(ys) // 2] < 56                 # median = 32 × 2^(1/1.5) ≈ 50.8
    assert ys[int(0.99 * len(ys))] > 10 * ys[len(ys) // 2]            # a heavy tail
    clipped = LengthDist(dist="pareto", scale=32, alpha=1.1, min=40, max=100)
    assert all(40 <= clipped.sample(rng) <= 100 for _ in range(1000))
    assert LengthDist(dist="constant", value=9).sample(rng) == 9
    with pytest.raises(ValueError):
        LengthDist(min=10, max=5)


def test_arrival_processes_shape_the_rate() -> None:
    onoff = Arrival(kind="onoff", rate=10, on_s=5, off_s=5, on_factor=2, off_factor=0)
    assert onoff.rate_at(1) == 20 and onoff.rate_at(6) == 0 and onoff.max_rate() == 20
    step = Arrival(kind="step", rate=2, step_at_s=30, step_factor=3)
    assert step.rate_at(29.9) == 2 and step.rate_at(30) == 6
    day = Arrival(kind="diurnal", rate=10, period_s=100, amplitude=0.5)
    assert day.rate_at(0) == pytest.approx(5) and day.rate_at(50) == pytest.approx(15)
    w = Workload(arrival=step, duration_s=60)
    reqs = plan(w, seed=3)
    before = sum(1 for r in reqs if r.t < 30)
    after = len(reqs) - before
    assert 2.2 < after / before < 4.0                                  # thinning follows λ(t)
    bursty = plan(Workload(arrival=onoff, duration_s=100), seed=3)
    assert all((r.t % 10) < 5 for r in bursty)                         # nothing sent while "off"


def test_workload_files_are_strict(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text("name: x\narrival: {kind: poisson, rate: 3}\noutput_tokens: {dist: pareto, alpha: 1.2}\n"
                 "max_tokens: 512\n")
    w = load_workload(str(f))
    assert w.arrival.rate == 3 and w.output_tokens.dist == "pareto" and w.max_tokens == 512
    f.write_text("arival: {rate: 3}\n")
    with pytest.raises(ValueError, match="arival"):
        load_workload(str(f))
    with pytest.raises(ValueError, match="built-in workloads"):
        load_workload("no-such-workload")
    for name in ("chat", "heavy-tail", "bursty", "diurnal", "step", "long-streams"):
        assert load_workload(name).name == name


def test_traces_jsonl_csv_and_audit_export(tmp_path: Path) -> None:
    jl = tmp_path / "t.jsonl"
    jl.write_text('{"timestamp": 100.5, "prompt_tokens": 10, "output_tokens": 5, "tenant": "a"}\n'
                  '{"timestamp": 100.0, "prompt_tokens": 20, "output_tokens": 7, "priority": "batch", '
                  '"model": "x", "stream": false}\n\n')
    reqs = load_trace(jl)
    assert [(r.t, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0.0, 20, 7), (0.5, 10, 5)]
    assert reqs[0].priority == "batch" and reqs[0].model == "x" and reqs[0].stream is False
    assert reqs[1].tenant == "a" and reqs[1].stream is True
    csv_file = tmp_path / "t.csv"
    csv_file.write_text("timestamp,prompt_tokens,output_tokens,tenant\n0,5,5,a\n2,6,6,b\n4,7,7,\n")
    reqs = load_trace(csv_file, time_scale=2.0, model="m")
    assert [r.t for r in reqs] == [0.0, 1.0, 2.0] and reqs[2].tenant is None and reqs[0].model == "m"
    assert [r.t for r in load_trace(csv_file, rate=1.5)] == pytest.approx([0.0, 1.0, 2.0])
    # A page of GET /audit/requests, newest first; a rejected request has no token counts.
    page = {"data": [
        {"request_id": "b", "received_at": 1767225610.0, "model_requested": "demo-llm", "tenant": "t1",
         "priority": "standard", "prompt_tokens": 30, "completion_tokens": 12, "stream": True},
        {"request_id": "a", "received_at": 1767225600.0, "model_requested": "demo-llm", "tenant": None,
         "prompt_tokens_est": 40, "prompt_tokens": None, "completion_tokens": 9, "stream": False},
        {"request_id": "r", "received_at": 1767225605.0, "model_requested": "demo-llm", "status": "rejected",
         "prompt_tokens": None, "completion_tokens": None},
    ], "next_cursor": None}
    text = json.dumps(page)
    from inferlb.bench.loadgen.trace import TraceInfo
    info = TraceInfo()
    reqs = parse_trace(text, suffix=".json", info=info)
    assert [(r.t, r.prompt_tokens, r.output_tokens, r.model) for r in reqs] == \
           [(0.0, 40, 9, "demo-llm"), (10.0, 30, 12, "demo-llm")]
    assert info.rows == 3 and info.skipped == {"no token counts": 1}
    with pytest.raises(ValueError, match="line 1"):
        parse_trace("not json\n")


def _outcome(i: int, t: float, *, ok: bool = True, e2e: float = 1.0, ttft: float | None = 0.1, node: str = "a",
             error: str | None = None, tokens: int = 11) -> Outcome:
    return Outcome(i, t, 10, 11, True, None, None, ok=ok, e2e=e2e, ttft=ttft, node=node, error=error,
                   tokens=tokens, status=200 if ok else 503)


def test_summarize_goodput_percentiles_errors_and_node_figures() -> None:
    w = Workload(duration_s=10, warmup_s=2, slo={"ttft_s": 0.5, "e2e_s": 2.0})
    outs = [_outcome(0, 1.0, e2e=100.0),                           # in the warm-up: not measured
            _outcome(1, 3.0, e2e=1.0, node="a"),
            _outcome(2, 4.0, e2e=3.0, node="b"),                   # ok but over the e2e SLO
            _outcome(3, 5.0, e2e=1.0, ttft=0.9, node="b"),         # ok but over the TTFT SLO
            _outcome(4, 6.0, ok=False, error="http_503"),
            _outcome(5, 7.0, e2e=1.5, node="a")]
    samples = [Sample(0.0, "a", 0, 0, 0.0, 2, 0, 0, 10, False), Sample(5.0, "a", 3, 1, 0.5, 5, 1, 1, 14, False),
               Sample(9.0, "a", 0, 0, 0.1, 6, 1, 1, 16, False)]
    s = summarize(RunData("x", outs, samples, duration_s=10.0, wall_s=12.0), w)
    assert s["measured"] == 5 and s["ok"] == 4 and s["good"] == 2
    assert s["goodput_rps"] == pytest.approx(2 / 8) and s["errors"] == {"http_503": 1}
    assert s["e2e_s"]["p50"] == pytest.approx(1.25) and s["e2e_s"]["max"] == 3.0
    assert s["share"] == {"a": 0.5, "b": 0.5}
    assert s["tpot_s"]["p50"] == pytest.approx((0.09 + 0.14) / 2)    # (e2e - TTFT) / 10 tokens
    node = s["nodes"]["a"]
    assert (node["preemptions"], node["oom_crashes"], node["requests"]) == (4, 1, 6)
    assert node["kv_usage_max"] == 0.5 and node["waiting_max"] == 1
    assert s["preemptions"] == 4 and s["oom_crashes"] == 1
    head, rows = compare_rows([s, dict(s, label="y")], reference="y")
    assert head[-3:] == ["e2e p99 ÷ ref", "TTFT p99 ÷ ref", "goodput ÷ ref"] and rows[0][-1] == "1.00×"
    md = table_markdown(*node_rows(s))
    assert md.splitlines()[0].startswith("| node | share %") and "| a | 50.0 |" in md
    empty = summarize(RunData("e", [], duration_s=1.0), Workload())
    assert empty["ok"] == 0 and math.isnan(empty["e2e_s"]["p99"])


def test_gateway_fleet_gives_each_node_its_kv_size() -> None:
    specs = fleet_specs("hetero4")
    urls = {s.name: f"http://127.0.0.1:{9000 + i}" for i, s in enumerate(specs)}
    w = load_workload("heavy-tail")
    cfg = gateway_fleet(specs, urls, "least-connections", w, seed=4)
    assert cfg["routing"] == {"profile": "least-connections", "seed": 4}
    assert [n["capacity_tokens"] for n in cfg["nodes"]] == [s.batching.kv_tokens for s in specs if s.batching]
    from inferlb.config.settings import fleet_from_mapping
    assert fleet_from_mapping(cfg).nodes[0].url == urls[specs[0].name]


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from inferlb.bench.loadgen.report import plot_runs

    w = Workload(duration_s=10)
    outs = [_outcome(i, float(i), e2e=0.5 + i / 10, node="ab"[i % 2]) for i in range(10)]
    s = summarize(RunData("token-aware", outs, duration_s=10.0), w)
    compact = {"token-aware": [[o.t, o.node, o.ok, o.e2e, o.ttft, o.error, 1, 1] for o in outs]}
    cap = {"steps": [{"rate": 1.0, "summary": s}, {"rate": 2.0, "summary": s}]}
    paths = plot_runs([s], compact, tmp_path / "charts", cap)
    assert sorted(p.name for p in paths) == ["goodput_vs_offered.png", "latency_cdf.png", "node_share_token-aware.png"]
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_steady_state_cpu_and_running_streams() -> None:
    samples = [Sample(t, n, r, 0, 0.0, 0, 0, 0, 0, False)
               for t, r in ((1.0, 1), (6.0, 10), (8.0, 12)) for n in ("a", "b")]
    cpu = [(1.0, {"sim": 1.0, "loadgen": 0.5}), (5.0, {"sim": 2.0, "loadgen": 1.0}),
           (9.0, {"sim": 4.0, "loadgen": 1.4})]
    s = summarize(RunData("x", [], samples, duration_s=10.0, cpu=cpu), Workload())
    st = s["steady"]
    assert (st["from_s"], st["to_s"]) == (5.0, 10.0)
    assert st["cpu_core_share"] == {"sim": pytest.approx(0.5), "loadgen": pytest.approx(0.1)}
    assert st["running_mean"] == 22 and st["running_max"] == 24


def test_max_tokens_mix_declares_per_request_without_changing_the_requests() -> None:
    from inferlb.bench.loadgen.runner import _body, _expected
    from inferlb.simulator.node import SIM_OUTPUT_FIELD

    exact = load_workload("heavy-tail")
    mixed = load_workload("heavy-tail-mixed")
    a, b = plan(exact, seed=7, duration_s=300), plan(mixed, seed=7, duration_s=300)
    # the same requests (times, lengths, tenants): only what the clients declare differs
    assert [(r.t, r.prompt_tokens, r.output_tokens, r.tenant) for r in a] == \
        [(r.t, r.prompt_tokens, r.output_tokens, r.tenant) for r in b]
    assert all(r.max_tokens == r.output_tokens for r in a)
    n = len(b)
    none = sum(r.max_tokens is None for r in b) / n
    loose = sum(r.max_tokens in (1024, 2048, 4096) and r.max_tokens != r.output_tokens for r in b) / n
    assert abs(none - 0.60) < 0.03 and abs(loose - 0.35) < 0.03
    assert plan(mixed, seed=7, duration_s=300) == b          # seeded
    # what the load generator sends: the declared max_tokens (or none) and the answer for the emulator
    for r in b[:200]:
        body = json.loads(_body(r, mixed))
        assert body.get("max_tokens") == r.max_tokens and body[SIM_OUTPUT_FIELD] == r.output_tokens
        assert _expected(r, mixed) == r.answer_tokens
    cut = Workload(max_tokens="mix", max_tokens_mix={"none": 0, "loose": 1, "exact": 0, "loose_values": [5]},
                   output_tokens=LengthDist(dist="constant", value=50))
    (r, *_) = plan(cut, seed=1, duration_s=5)
    assert (r.max_tokens, r.output_tokens, r.answer_tokens) == (5, 50, 5)   # a cap below the answer cuts it
    with pytest.raises(ValueError):
        Workload(max_tokens="mix", max_tokens_mix={"none": 0, "loose": 0, "exact": 0})
