"""Smoke test of ``python -m benchmarks.forecasters``: structure and the known answers of the
baselines on the generated series (no timing assertions)."""

from __future__ import annotations

import json
import random

import pytest

from benchmarks.forecasters import DAY, evaluate, main, series_seasonal


def test_bench_prints_one_row_per_series_and_forecaster(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--days", "8", "--origins", "3", "--forecasters", "seasonal-naive,reactive,static", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"seasonal", "diurnal-bursty"}
    for rows in out.values():
        assert [r["forecaster"] for r in rows] == ["seasonal-naive", "reactive", "static"]
        assert all(r["forecasts"] == 3 and r["fallbacks"] == 0 for r in rows)
        static = rows[2]
        assert static["under"] == 0.0     # the history's peak is never far below a normal step


def test_seasonal_naive_is_exact_on_a_series_that_repeats() -> None:
    day = series_seasonal(1, random.Random(3))
    rows = evaluate(day * 9, ["seasonal-naive"], origins=4, horizon=6)
    assert rows[0]["wape"] == 0.0 and len(day) == DAY
