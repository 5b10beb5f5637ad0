"""Smoke tests of ``inferlb bench overhead``: structure and positive figures, no timed assertions."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from inferlb.bench import engine as engine_bench
from inferlb.bench.engine import ENGINES, SCENARIOS, measure_engine
from inferlb.bench.overhead import BenchConfig, main, run_bench
from inferlb.bench.report import cpu_ratio_table, render

_LINUX = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                            reason="process CPU figures and child checks read /proc (Linux)")


def test_engine_alone_measures_both_executors() -> None:
    out = measure_engine(50, warmup=5)
    assert Path(out["process"]).name == "inference_request.bpmn"
    rows = {(r["engine"], r["scenario"]): r for r in out["rows"]}
    assert set(rows) == {(e, s.name) for e in ENGINES for s in SCENARIOS}
    for row in rows.values():
        assert row["n"] == 50
        assert row["records"] == 55          # every request handed its audit record over
        for key in ("cpu_us", "wall_us", "process_cpu_us", "ops_us"):
            stats = row[key]
            assert stats["n"] == 50
            assert 0 < stats["p50"] <= stats["p99"] <= stats["max"]
            assert math.isfinite(stats["mean"])


def test_replay_refuses_a_process_that_calls_something_else() -> None:
    replay = engine_bench._Replay([("request/evaluate", {"ok": True}), ("routing/select", {"ok": True})])
    assert replay.stub("request/evaluate")(None, {}, {}) == {"ok": True}
    with pytest.raises(RuntimeError, match="replay expected 'routing/select'"):
        replay.take("audit/record")


def test_engine_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "engine.json"
    assert engine_bench.main(["--n", "3", "--warmup", "1", "--engines", "compiled", "--scenarios", "retry",
                              "--json", str(out_file), "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert "| executor | scenario |" in printed and "process CPU µs p50" in printed
    rows = json.loads(out_file.read_text())["rows"]
    assert [(r["engine"], r["scenario"], r["process_cpu_us"]["n"]) for r in rows] == [("compiled", "retry", 3)]
    with pytest.raises(SystemExit):
        engine_bench.main(["--scenarios", "nope"])


def test_engine_table_renders() -> None:
    engine = measure_engine(5, warmup=1, engines=["compiled"], scenarios=SCENARIOS[:1])
    report = {"meta": {"started": "now", "cpus": 2, "python": "3", "config": vars(BenchConfig())},
              "engine": engine, "rows": [], "notes": ["a note"]}
    md = render(report, markdown=True)
    assert "| executor | scenario |" in md and "| compiled | ok | 5 |" in md
    assert "- note: a note" in md


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        run_bench(BenchConfig(modes=["direct", "haproxy"], engine_n=0), quiet=True)


@_LINUX
def test_end_to_end_direct_and_compiled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """n=20, c=2, both stream kinds: fake nodes (or ``inferlb sim`` nodes), direct and inferlb."""
    out_file = tmp_path / "bench.json"
    rc = main(["--n", "20", "--concurrency", "2", "--warmup", "4", "--modes", "direct,compiled",
               "--engine-n", "0", "--max-seconds", "10", "--json", str(out_file), "--markdown", "--quiet",
               "--workdir", str(tmp_path / "work")])
    printed = capsys.readouterr().out
    report = json.loads(out_file.read_text())
    assert rc == 0, report["rows"]
    assert report["engine"] is None
    cells = {(r["mode"], r["stream"]): r for r in report["rows"]}
    assert set(cells) == {("direct", False), ("direct", True), ("compiled", False), ("compiled", True)}
    for (mode, stream), row in cells.items():
        assert row["n"] == 20 and row["errors"] == 0
        assert row["rps"] > 0 and 0 < row["e2e_p50_ms"] <= row["e2e_p99_ms"]
        assert (row["ttft_p50_ms"] is not None) == stream
        if mode == "direct":
            assert row["gateway_cpu_s_per_1k"] is None and row["added_p50_ms"] is None
        else:
            assert row["gateway_cpu_s_per_1k"] is not None and row["gateway_cpu_s_per_1k"] >= 0
            assert row["added_p50_ms"] is not None
    assert "| compiled | 2 | yes | 20 | 0 |" in printed
    work = tmp_path / "work"
    assert (work / "inferlb-compiled" / "fleet.yaml").is_file()
    assert not _processes_in(work), "a child process outlived the benchmark"


@_LINUX
def test_without_the_peer_bench_files_it_falls_back(tmp_path: Path) -> None:
    """No fake server, no floor proxy, no nginx, no Rust routers: ``inferlb sim`` nodes, and notes
    for skipped rows."""
    cfg = BenchConfig(n=4, concurrency=[2], max_tokens=4,
                      modes=["direct", "floor", "nginx", "vllm-router", "sglang-router"], streams=[False],
                      warmup=2, engine_n=0, max_seconds=10, fake_server=tmp_path / "absent.py",
                      floor_proxy=tmp_path / "absent_floor.py", nginx=str(tmp_path / "no-nginx"),
                      vllm_router=str(tmp_path / "no-vllm-router"), sglang_python=str(tmp_path / "no-python"),
                      workdir=tmp_path / "work")
    report = run_bench(cfg, quiet=True)
    assert [(r["mode"], r["n"], r["errors"]) for r in report["rows"]] == [("direct", 4, 0)]
    assert "inferlb sim" in report["meta"]["nodes"]
    notes = " ".join(report["notes"])
    assert "floor skipped" in notes and "nginx skipped" in notes and "absent.py not found" in notes
    assert "vllm-router skipped" in notes and "sglang-router skipped" in notes
    assert not _processes_in(tmp_path / "work")


def _processes_in(cwd: Path) -> list[int]:
    """PIDs whose working directory is ``cwd`` (every child of the benchmark runs there)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/cwd") == str(cwd):
                    pids.append(int(name))
            except OSError:
                continue
    return pids


def _overhead_row(mode: str, c: int, stream: bool, cpu: float | None) -> dict[str, object]:
    return {"mode": mode, "concurrency": c, "stream": stream, "gateway_cpu_s_per_1k": cpu}


def test_overhead_cpu_ratios_against_the_floor_and_the_rust_routers() -> None:
    rows = [_overhead_row("direct", 16, False, None), _overhead_row("floor", 16, False, 0.5),
            _overhead_row("vllm-router", 16, False, 0.25), _overhead_row("compiled", 16, False, 1.5),
            _overhead_row("compiled", 16, True, 2.0)]     # a cell without the bases: "-"
    head, body = cpu_ratio_table(rows)
    assert head == ["mode", "c", "stream", "gw CPU ms/req", "÷ floor", "÷ vllm-router"]
    assert body[0] == ["floor", "16", "no", "0.50", "1.00×", "2.00×"]
    assert body[2] == ["compiled", "16", "no", "1.50", "3.00×", "6.00×"]
    assert body[3][-2:] == ["-", "-"]
    assert all(r[0] != "direct" for r in body)
