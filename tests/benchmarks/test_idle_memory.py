"""Smoke test of ``python -m benchmarks.idle_memory``: structure and plausible figures, no timed
assertions."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.idle_memory import main, rss_mib

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(),
                                reason="CPU and RSS figures are read from /proc (Linux)")


def test_rss_of_this_process_and_of_a_missing_one() -> None:
    mine = rss_mib(os.getpid())
    assert mine is not None and mine > 1.0
    assert rss_mib(2**22 + 12345) is None        # above the kernel's PID limit: never a process


def test_small_run_reports_idle_cpu_and_rss_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "idle.json"
    rc = main(["--idle-s", "0.5", "--settle-s", "0", "--warmup", "10", "--n", "20", "--step", "10",
               "--concurrency", "2", "--max-seconds", "30", "--workdir", str(tmp_path / "work"),
               "--json", str(out_file), "--quiet"])
    report = json.loads(out_file.read_text())
    assert rc == 0 and report["errors"] == 0
    assert [p["requests"] for p in report["rss_mib"]] == [10, 20, 30]
    assert all(p["rss_mib"] > 1.0 for p in report["rss_mib"])
    assert report["idle_cpu_ms_per_s"] >= 0 and report["idle_cpu_ms_per_s_after"] >= 0
    assert report["rss_ratio"] > 0
    assert "RSS final / after warm-up" in capsys.readouterr().out
