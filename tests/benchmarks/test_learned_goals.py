"""The learned-routing goals benchmark: regret as defined, capacity calibration, the report's shape,
and off-policy evaluation against a policy's measured on-policy value in the DES (small case)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import learned_goals as lg
from inferlb.bench.loadgen.workload import load_workload, plan
from inferlb.routing.ope_replay import evaluate


def test_regret_is_relative_to_the_best_fixed_profile_over_the_first_n() -> None:
    fixed = {"a": [2.0, 2.0, 9.0], "b": [1.0, 3.0, 0.0]}
    got = lg.regret([2.2, 2.2, 100.0], fixed, 2)
    assert got["n"] == 2 and got["best"] in ("a", "b") and got["best_mean"] == pytest.approx(2.0)
    assert got["regret"] == pytest.approx(0.1)
    assert lg.regret([1.0, 1.0], {"a": [2.0, 2.0]}, 10)["regret"] == pytest.approx(-0.5)
    with pytest.raises(ValueError):
        lg.regret([1.0], {}, 1)


def test_capacity_is_measured_per_preset_and_summed_over_the_fleet() -> None:
    w = load_workload("heavy-tail")
    specs = lg.fleet(4)
    assert [s.preset for s in specs] == ["h100", "a100", "l4", "h100"]
    cap, per = lg.fleet_capacity(specs, w, duration_s=40.0, warm_s=10.0)
    assert set(per) == {"h100", "a100", "l4"}
    assert per["h100"] > per["a100"] > per["l4"] > 0          # the presets' speeds, as measured
    assert cap == pytest.approx(2 * per["h100"] + per["a100"] + per["l4"])
    with pytest.raises(ValueError, match="saturate"):
        lg.node_capacity("h100", w, duration_s=20.0, warm_s=5.0, offered_rps=0.5)


def test_costs_count_what_did_not_complete_at_the_failure_cost() -> None:
    w = load_workload("heavy-tail")
    specs = lg.fleet(1, ["l4"])
    reqs = plan(w, seed=2, rate=20.0, duration_s=3.0)
    run = lg.run_profile("round-robin", specs, reqs, w, seed=2, duration_s=3.0, failure_cost_s=99.0)
    res = run.results
    assert res is not None and len(run.cost) == len(reqs)
    for i, c in enumerate(run.cost):
        assert c == (res.e2e[i] if res.outcome[i] == 0 else 99.0)


def test_the_report_names_every_goal(capsys: pytest.CaptureFixture[str]) -> None:
    rc = lg.main(["--nodes", "3", "--requests", "400", "--seeds", "1", "--cal-duration", "40", "--cal-warm", "10",
                  "--profiles", "learned,token-aware,round-robin", "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert set(r["profiles"]) == {"learned", "token-aware", "round-robin", "token-aware~softmax(0.1)"}
    assert r["offered_rps"] == pytest.approx(0.85 * r["capacity_rps"])
    reg = r["regret"]["pooled"]
    means = reg["means"]
    assert reg["best"] == min(means, key=means.get) and set(means) == {"token-aware", "round-robin"}
    assert reg["regret"] == pytest.approx((reg["learned"] - reg["best_mean"]) / reg["best_mean"])
    assert {"regret < 5 %", "learned e2e p99 ≤ 0.8 × token-aware", "learned goodput ≥ token-aware"} <= set(r["goals"])
    for target in ("token-aware", "token-aware~softmax(0.1)"):
        entry = r["ope"][0][target]
        if entry["refused"]:       # refused: the goal says so instead of judging a withheld number
            assert r["goals"][f"OPE of {target} within ±5 %"].startswith("refused")
        else:
            assert {f"OPE (SNIPS) of {target} within ±5 %", f"OPE (DR) of {target} within ±5 %"} <= set(r["goals"])
    ope = r["ope"][0]
    # The logging policy evaluated as itself: every weight is 1, the estimate is its own mean.
    assert ope["learned"]["snips"]["value"] == pytest.approx(ope["learned"]["measured"])


def test_the_goals_chart_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "charts" / "goals.png"
    rc = lg.main(["--nodes", "3", "--requests", "300", "--seeds", "1,2", "--cal-duration", "40", "--cal-warm", "10",
                  "--profiles", "learned,token-aware,round-robin", "--no-ope", "--json", "--plot", str(out)])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r["plot"] == str(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


@pytest.mark.parametrize("seed", [1, 2])
def test_ope_of_token_aware_lands_within_5_percent_of_its_measured_value(seed: int) -> None:
    """Small case where the estimate is expected to hold: 3 nodes at 40 % of their measured
    capacity (a request's cost hardly depends on where the others went), logged by a learned
    policy that explores half the time (ε = 0.5, softmax temperature 0.2). Doubly robust estimate
    of token-aware from that log vs token-aware's own run of the same plan, on the same rows.

    The logging policy's tail reservation is off: a reservation exists to change what the *next*
    requests find (fast nodes kept light for long outputs), which breaks the premise above that a
    per-decision estimate rests on; with the shipped reservation on, the estimate lands ~25 % low
    here (docs/benchmarks.md, "sixth pass").

    The logging policy keeps the latency weight this case was written with (predicted-latency ×3,
    outstanding-tokens ×1): the softmax spreads its exploration over the *total* score, so the
    shipped ×7 at the same temperature explores less evenly, and on these two seeds the estimate
    then lands 8 % high (docs/benchmarks.md, "The learned profile's latency weight, chosen on the
    train seeds")."""
    w = load_workload("heavy-tail")
    specs = lg.fleet(3)
    cap, _ = lg.fleet_capacity(specs, w, duration_s=60.0, warm_s=15.0)
    rate = 0.4 * cap
    n = 2000
    reqs = plan(w, seed=seed, rate=rate, duration_s=n / rate, max_requests=n)
    logging = lg.run_profile("learned", specs, reqs, w, seed=seed, duration_s=n / rate, failure_cost_s=60.0, log=True,
                             router_kwargs={"scorers": {"predicted-latency": 3.0, "outstanding-tokens": 1.0},
                                            "params": {"softmax-bandit": {"epsilon": 0.5, "temperature": 0.2},
                                                       "predicted-latency": {"reserve": 0.0}}})
    fb = logging.feedback
    assert fb is not None and len(fb.logged) > 0.9 * n
    on_policy = lg.run_profile("token-aware", specs, reqs, w, seed=seed, duration_s=n / rate, failure_cost_s=60.0)
    measured = sum(on_policy.cost[i] for i in fb.logged_rows) / len(fb.logged_rows)
    est = evaluate(fb.logged, "token-aware", n_boot=50, seed=seed)   # DR's reward model fitted on the costs
    assert est["ess"] > 200 and "refused" not in est
    assert est["dr"]["value"] == pytest.approx(measured, rel=0.05)
