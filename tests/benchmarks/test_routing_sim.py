"""The virtual-time routing comparison: deterministic, every request served, sampling engaged."""

from __future__ import annotations

from benchmarks.routing_sim import main, simulate


def test_a_run_is_deterministic_and_serves_every_request() -> None:
    a = simulate("token-aware", nodes=20, rate=20.0, duration_s=5.0, seed=3)
    b = simulate("token-aware", nodes=20, rate=20.0, duration_s=5.0, seed=3)
    assert a.requests > 50 and a.completed == a.requests
    assert (a.e2e_p99_s, a.ttft_p50_s, a.busiest_share) == (b.e2e_p99_s, b.ttft_p50_s, b.busiest_share)
    full = simulate("token-aware:k=0", nodes=20, rate=20.0, duration_s=5.0, seed=3)
    assert a.sampled_share == 1.0 and full.sampled_share == 0.0       # 20 nodes > k = 16
    assert full.completed == full.requests == a.requests


def test_the_command_prints_one_line_per_target(capsys: object) -> None:
    assert main(["--nodes", "6", "--rate", "6", "--duration", "3", "--targets", "round-robin,least-connections"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "round-robin" in out and "least-connections" in out
