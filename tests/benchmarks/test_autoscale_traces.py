"""``python -m benchmarks.autoscale_traces`` on cells it already has (a JSON-lines file): it runs
nothing, prints the per-shape table and the goals, honours ``--shape-seeds``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.autoscale_traces import main
from inferlb.bench.autoscale_backtest import BacktestOptions

_D = BacktestOptions()
PREDICTIVE = {"level_shift": None if _D.level_shift is None else list(_D.level_shift), "rise_ratio": _D.rise_ratio,
              "skill_window": _D.skill_window}


def _cell(shape: str, seed: int, policy: str, slo: float, gpu_h: float) -> dict[str, object]:
    return {"shape": shape, "seed": seed, "policy": policy, "slo_attainment": slo, "slo_attainment_bursts": None,
            "gpu_hours": gpu_h, "optimum": {"gpu_hours": 100.0}, "event_lags_s": [], "event_beyond": [],
            "burst_rounds": 0, "requests": 10, "wall_s": 1.0, "cpu_s": 1.0}


def test_the_command_reuses_finished_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = {"peak": 4.0, "cap": 309.4, "forecaster": "holt-winters", "target_utilisation": 0.9,
                "headroom": None, "scale_down_stabilisation_s": None, "burst_factor": 1.0}
    cells = tmp_path / "cells.jsonl"
    rows = [("sine", 11, "reactive", 0.991, 120.0), ("sine", 11, "predictive", 0.995, 110.0),
            ("step", 11, "reactive", 0.99, 100.0), ("step", 11, "predictive", 0.992, 104.0),
            ("step", 12, "reactive", 0.99, 100.0), ("step", 12, "predictive", 0.988, 104.0)]
    with cells.open("w") as f:
        for shape, seed, policy, slo, gpu_h in rows:
            # predictive's own settings (the defaults) are in its key only: reactive's cells stay valid
            key = json.dumps([shape, seed, policy, {**settings, **PREDICTIVE} if policy == "predictive" else settings],
                             sort_keys=True)
            f.write(json.dumps({"key": key, "cell": _cell(shape, seed, policy, slo, gpu_h)}) + "\n")
    assert main(["--shapes", "step,sine", "--seeds", "11,12", "--shape-seeds", "sine=11",
                 "--policies", "reactive,predictive", "--target-utilisation", "0.9", "--cells", str(cells)]) == 0
    out = capsys.readouterr().out
    assert "0 cell(s) run" in out
    assert "goal sine: SLO >= 99 %: 99.50 % — met" in out
    assert "goal sine: GPU-h <= reactive's at equal SLO: 0.917 — met" in out      # more SLO for less
    assert "goal step: SLO >= 99 %: 99.00 % — met" in out                         # mean of 99.2 and 98.8
    assert "goal step: GPU-h <= 1.15 x optimum: 1.040 — met" in out


def test_release_quantile_is_in_predictives_key_only_when_set(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``--release-quantile`` keys predictive's cells (cells made without it keep their key; the
    other policies' cells stay valid across it)."""
    settings = {"peak": 4.0, "cap": 309.4, "forecaster": "holt-winters", "target_utilisation": 0.9,
                "headroom": None, "scale_down_stabilisation_s": None, "burst_factor": 1.0}
    cells = tmp_path / "cells.jsonl"
    with cells.open("w") as f:
        for policy, own in (("reactive", {}), ("predictive", {**PREDICTIVE, "release_quantile": 0.95})):
            key = json.dumps(["sine", 11, policy, {**settings, **own}], sort_keys=True)
            f.write(json.dumps({"key": key, "cell": _cell("sine", 11, policy, 0.995, 110.0)}) + "\n")
    assert main(["--shapes", "sine", "--seeds", "11", "--policies", "reactive,predictive",
                 "--target-utilisation", "0.9", "--release-quantile", "0.95", "--cells", str(cells)]) == 0
    out = capsys.readouterr().out
    assert "0 cell(s) run" in out and "'release_quantile': 0.95" in out
