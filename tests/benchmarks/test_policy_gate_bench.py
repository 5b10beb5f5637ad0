"""``python -m benchmarks.policy_gate`` runs end to end on a small log and prints one row per judgement."""

from __future__ import annotations

import pytest

from benchmarks.policy_gate import main, synthetic_log


def test_the_bench_prints_a_row_per_judgement(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--decisions", "80", "--bootstrap", "10"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [r.split()[:2] for r in rows] == [["80", "measured"], ["80", "estimate"]]
    assert all(r.split()[-1] in ("passed", "refused") for r in rows)
    log = synthetic_log(5)
    assert len(log) == 5 and all(0 < d.learned["propensity"] <= 1 and d.reward > 0 for d in log)
