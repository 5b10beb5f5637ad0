"""The routing CPU-cost benchmark's shape (not its speed): both measurements per cell, and the
interleaved comparison with a baseline tree."""

from __future__ import annotations

import pytest

from benchmarks import routing_cost
from tests.support import ROOT


def test_measure_times_every_decision_in_cpu_and_wall_time() -> None:
    out = routing_cost.measure("token-aware", 20, 30)
    assert set(out) == {"decide_cpu", "decide_wall", "select_cpu", "select_wall"}
    assert all(len(v) == 30 and all(x >= 0 for x in v) for v in out.values())
    assert sum(out["select_wall"]) > 0


def test_the_comparison_runs_both_trees(capsys: pytest.CaptureFixture[str]) -> None:
    rc = routing_cost.main(["--sizes", "10", "--iters", "40", "--rounds", "1", "--baseline-tree", str(ROOT)])
    out = capsys.readouterr().out
    assert rc == 0 and "load average before" in out
    rows = [line.split() for line in out.splitlines() if "token-aware/10" in line]
    assert {(r[0], r[2]) for r in rows} == {(t, k) for t in ("baseline", "this")
                                             for k in ("decide_cpu", "decide_wall", "select_cpu", "select_wall")}


@pytest.mark.parametrize("kind", ["select", "decide", "fleet"])
def test_the_count_mode_makes_its_decisions_and_prints_nothing(kind: str, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``--count`` (for callgrind) runs its loop inside functools.reduce, the region counted."""
    import functools

    calls: list[int] = []
    real = functools.reduce

    def spy(fn, seq, init):  # type: ignore[no-untyped-def]
        calls.append(len(seq))
        return real(fn, seq, init)

    monkeypatch.setattr(functools, "reduce", spy)
    assert routing_cost.main(["--count", kind, "--decisions", "7", "--profiles", "round-robin", "--sizes", "40"]) == 0
    assert calls == [7] and capsys.readouterr().out == ""
