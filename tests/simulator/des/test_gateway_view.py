"""Only what a gateway knows: the DES's routing, node views and controller windows never see the
true output length (inferlb/simulator/des/sim.py, "Only what a gateway knows")."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from inferlb.bench.loadgen.workload import PlannedRequest, load_workload, plan
from inferlb.routing.length import LengthPredictor
from inferlb.routing.profiles import build_router
from inferlb.routing.types import Decision, NodeList, RouteRequest
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.presets import preset_spec


class Recorder:
    """A router that logs every decision with the time, the request and the views it was given."""

    def __init__(self, profile: str) -> None:
        self.inner = build_router(profile, seed=5)
        self.sim: Simulation | None = None
        self.log: list[tuple[float, RouteRequest, tuple[tuple[str, int, int], ...], str | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def decide(self, req: RouteRequest, views: NodeList) -> Decision:
        d = self.inner.decide(req, views)
        assert self.sim is not None
        self.log.append((self.sim.now, req, tuple((v.name, v.inflight_tokens, v.inflight_requests) for v in views),
                         d.pick))
        return d


def _specs() -> list[Any]:
    return [preset_spec(f"n{i}", p, ["sim-llm"]) for i, p in enumerate(["h100", "a100", "l4", "l4"])]


def _run(reqs: list[PlannedRequest], profile: str, lengths: LengthPredictor | None = None
         ) -> tuple[Recorder, list[tuple[int, int, int]], float]:
    rec = Recorder(profile)
    windows: list[tuple[int, int, int]] = []

    def controller(sim: Simulation) -> None:
        w = sim.take_window()
        windows.append((w.arrivals, w.prompt_tokens, w.output_tokens))

    sim = Simulation(_specs(), router=rec, seed=5, controller=controller, control_every_s=0.25,  # type: ignore[arg-type]
                     lengths=lengths)
    rec.sim = sim
    res = sim.run(reqs)
    first_end = min(res.t[i] + res.e2e[i] for i in range(len(reqs)) if not math.isnan(res.e2e[i]))
    return rec, windows, first_end


def _mixed(seed: int, rate: float = 80.0, duration_s: float = 6.0) -> list[PlannedRequest]:
    """heavy-tail-mixed at a high rate, answers of 200 tokens or more (so that many decisions come
    before the first answer ends)."""
    w = load_workload("heavy-tail-mixed")
    reqs = plan(w, seed=seed, rate=rate, duration_s=duration_s)
    return [replace(r, output_tokens=200 + r.output_tokens) for r in reqs]


def _other_truth(reqs: list[PlannedRequest]) -> list[PlannedRequest]:
    """The same declared fields, other answers: every true length changed (a loose cap still cuts)."""
    return [replace(r, output_tokens=200 + (r.output_tokens * 7 + 13) % 2000) for r in reqs]


def _before(log: list[Any], t: float) -> list[Any]:
    return [e for e in log if e[0] < t]


def test_changing_the_true_lengths_leaves_every_decision_identical_until_answers_finish() -> None:
    reqs = _mixed(3)
    assert any(r.max_tokens is None for r in reqs) and any(r.max_tokens is not None for r in reqs)
    other = _other_truth(reqs)
    assert sum(a.output_tokens != b.output_tokens for a, b in zip(reqs, other, strict=True)) > 0.9 * len(reqs)
    for profile in ("token-aware", "learned"):
        a, wa, end_a = _run(reqs, profile)
        b, wb, end_b = _run(other, profile)
        cut = min(end_a, end_b)
        seen_a, seen_b = _before(a.log, cut), _before(b.log, cut)
        assert len(seen_a) >= 20, "the test needs decisions before the first answer ends"
        assert seen_a == seen_b, profile     # requests (their budgets), node views, picks
        n = sum(1 for k in range(len(wa)) if (k + 1) * 0.25 < cut)
        assert n >= 1 and wa[:n] == wb[:n]   # what a controller reads
        # ...and the answers do differ afterwards: the runs are not the same run
        assert a.log != b.log


def test_the_budget_routing_sees_is_the_declared_one_or_the_default() -> None:
    reqs = _mixed(4)
    rec, _, _ = _run(reqs, "token-aware")
    declared = {r.t: r.max_tokens for r in reqs}
    for t, req, _, _ in rec.log:
        want = declared[t]
        assert req.output_tokens == (want if want is not None else 256)


def test_with_the_predictor_the_budget_is_learned_from_completions_and_stays_blind_to_the_truth() -> None:
    reqs = _mixed(5, rate=8.0, duration_s=40.0)
    p_a, p_b = LengthPredictor(), LengthPredictor()
    a, _, end_a = _run(reqs, "token-aware", p_a)
    b, _, end_b = _run(_other_truth(reqs), "token-aware", p_b)
    cut = min(end_a, end_b)
    assert _before(a.log, cut) == _before(b.log, cut)
    # it learned: later budgets differ from the declared / default fallback, and calibration was counted
    s = p_a.calibration.summary()
    assert s["n"] == len(reqs) and isinstance(s["learned"], int) and s["learned"] > len(reqs) // 2
    fallback = {r.t: (r.max_tokens if r.max_tokens is not None else 256) for r in reqs}
    learned = [req.output_tokens for t, req, _, _ in a.log if req.output_tokens != fallback[t]]
    assert len(learned) > len(reqs) // 2
