"""benchmarks/output_length.py: the calibration figures it prints, and its DES runs' contract."""

from __future__ import annotations

from benchmarks.learned_goals import fleet
from benchmarks.output_length import calibrate, run
from inferlb.bench.loadgen.workload import load_workload, plan


def test_calibration_on_heavy_tail_mixed_covers_its_quantiles() -> None:
    c = calibrate(load_workload("heavy-tail-mixed"), "mean", requests=3000)
    assert c["n"] == 3000 and c["learned"] == 3000 - 20     # the first 20 fall back (min_samples)
    assert isinstance(c["cover_p50"], float) and abs(c["cover_p50"] - 0.5) < 0.05
    assert isinstance(c["cover_p90"], float) and abs(c["cover_p90"] - 0.9) < 0.04
    assert isinstance(c["mae_p50"], float) and 30 < c["mae_p50"] < 90      # a Pareto tail: far from exact
    assert isinstance(c["mae_declared"], float) and c["mae_declared"] > 5 * c["mae_p50"]   # 256 or a loose cap


def test_a_des_run_with_the_predictor_scores_every_completed_request() -> None:
    w = load_workload("heavy-tail-mixed")
    reqs = plan(w, seed=2, rate=20.0, duration_s=20.0)
    out = run("token-aware", fleet(3), reqs, w, seed=2, duration_s=20.0, budget="p50")
    cal = out["calibration"]
    assert cal is not None and cal["n"] == len(out["e2e"]) + sum(1 for r in reqs if r.t < w.warmup_s)
    assert run("token-aware", fleet(3), reqs, w, seed=2, duration_s=20.0, budget=None)["calibration"] is None
