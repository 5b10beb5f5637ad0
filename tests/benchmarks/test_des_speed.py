"""The DES speed benchmark's shape (benchmarks/des_speed.py), not its speed."""

from __future__ import annotations

import math

import pytest

from benchmarks import des_speed
from inferlb.bench.loadgen.workload import load_workload
from tests.support import ROOT


def test_speed_benchmark_reports_its_figures() -> None:
    out = des_speed.run(nodes=30, requests=600, rate=90.0, profile="token-aware", workload="chat", max_seconds=30)
    assert out["requests_simulated"] == 600 and out["complete"]
    assert out["outcomes"]["ok"] == 600 and out["events"] > 600
    assert out["router_decide_us_baseline"] > 0 and not math.isnan(out["e2e_p50_s"])
    assert load_workload("chat").name == "chat"


def test_speed_benchmark_compares_two_trees_and_checks_they_agree(capsys: pytest.CaptureFixture[str]) -> None:
    """``--baseline-tree``: both trees in alternating subprocesses; here the baseline is this very
    tree, so the runs must agree (the shape of the comparison, not a speed)."""
    rc = des_speed.main(["--nodes", "6", "--requests", "150", "--rate", "30", "--max-seconds", "30",
                         "--baseline-tree", str(ROOT), "--rounds", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "round 1 baseline" in out and "round 1 this" in out and "load average before" in out
    assert "same simulation in both trees (events, outcomes, latency percentiles): yes" in out


def test_the_count_mode_runs_the_simulation_and_says_how_far(capsys: pytest.CaptureFixture[str]) -> None:
    assert des_speed.main(["--count", "--requests", "200", "--nodes", "12"]) == 0
    events, end = capsys.readouterr().out.split()[1::2]
    assert int(events) >= 200 and float(end) > 0
