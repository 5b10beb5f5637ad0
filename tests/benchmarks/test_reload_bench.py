"""``python -m benchmarks.reload`` end to end, small: both phases run, every reload is taken and
no request fails (the figures themselves are for docs/benchmarks.md, never asserted on)."""

from __future__ import annotations

from benchmarks.reload import run


async def test_reload_bench_runs_and_fails_nothing() -> None:
    out = await run(reloads=2, workers=2, phase_s=1.0)
    during = out["with_reloads"]
    assert out["baseline_no_reload"]["served"] > 0 and out["baseline_no_reload"]["failed"] == 0
    assert during["served"] > 0 and during["failed"] == 0
    assert during["reloads"] == 2 and during["reloads_refused"] == 0
    assert during["reload_server_ms"]["max"] is not None
