"""benchmarks/lora_des.py runs end to end on a tiny fleet and prints both routings side by side."""

from __future__ import annotations

import pytest

from benchmarks.lora_des import main


def test_a_tiny_run_prints_both_routings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nodes", "2", "--adapters", "4", "--max-lora", "2", "--loads", "0.3", "--train-seeds", "11",
                 "--test-seeds", "1", "--weights", "2", "--duration", "20"]) == 0
    out = capsys.readouterr().out
    assert "chosen (2, " in out
    rows = [line for line in out.splitlines() if line.strip().startswith("2 ")]
    assert [r.split()[2] for r in rows] == ["token-aware", "lora", "lora"], out
