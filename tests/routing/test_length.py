"""The output-length predictor (inferlb/routing/length.py): fallback, learning, caps, bounds, calibration."""

from __future__ import annotations

import random

import pytest

from inferlb.routing.length import LengthPredictor


def _feed(p: LengthPredictor, values: list[int], *, tenant: str | None = None, prompt: int = 100) -> None:
    for v in values:
        p.observe("m", prompt_tokens=prompt, tokens=v, tenant=tenant)


def test_without_data_the_declared_budget_else_the_default() -> None:
    p = LengthPredictor()
    e = p.estimate("m", prompt_tokens=10, declared=700, default=256)
    assert (e.budget, e.p50, e.p90, e.level) == (700, 700, 700, "declared")
    e = p.estimate("m", prompt_tokens=10, declared=None, default=256)
    assert (e.budget, e.level) == (256, "default")
    _feed(p, [50] * 19)   # one short of min_samples: still the fallback
    assert p.estimate("m", prompt_tokens=100, declared=None, default=256).level == "default"


def test_learns_the_quantiles_and_never_exceeds_the_declared_cap() -> None:
    rng = random.Random(1)
    values = [round(rng.lognormvariate(4.6, 0.8)) for _ in range(1500)]   # median ~100
    p = LengthPredictor()
    _feed(p, values)
    e = p.estimate("m", prompt_tokens=100, declared=None, default=256)
    s = sorted(values)
    assert e.level == "band"
    assert abs(e.p50 - s[len(s) // 2]) / s[len(s) // 2] < 0.12
    assert abs(e.p90 - s[int(0.9 * len(s))]) / s[int(0.9 * len(s))] < 0.12
    assert abs(e.mean - sum(values) / len(values)) / (sum(values) / len(values)) < 0.02
    assert e.budget == e.mean
    capped = p.estimate("m", prompt_tokens=100, declared=80, default=256)
    assert capped.p90 <= 80 and capped.budget <= 80 and capped.p50 <= 80


def test_tenants_and_prompt_bands_are_told_apart_with_coarser_levels_to_fall_back_on() -> None:
    p = LengthPredictor(budget="p50")
    _feed(p, [40] * 50, tenant="short")
    _feed(p, [900] * 50, tenant="long")
    assert p.estimate("m", prompt_tokens=100, declared=None, default=256, tenant="short").p50 < 50
    assert p.estimate("m", prompt_tokens=100, declared=None, default=256, tenant="long").p50 > 800
    # another band of a known tenant: the tenant's level; an unknown tenant: the model's
    assert p.estimate("m", prompt_tokens=5000, declared=None, default=256, tenant="long").level == "tenant"
    unknown = p.estimate("m", prompt_tokens=100, declared=None, default=256, tenant="new")
    assert unknown.level == "model" and 40 <= unknown.p50 <= 900


def test_it_follows_a_shift_in_the_traffic() -> None:
    p = LengthPredictor(budget="p50", window=200)
    _feed(p, [50] * 1000)
    _feed(p, [500] * 600)
    assert p.estimate("m", prompt_tokens=100, declared=None, default=256).p50 > 400


def test_memory_is_bounded_whatever_tenants_clients_send() -> None:
    p = LengthPredictor(max_keys=10)
    for i in range(100):
        p.observe("m", prompt_tokens=10, tokens=5, tenant=f"t{i}")
    assert p.summary()["keys"] == 10


def test_calibration_counts_mae_and_coverage() -> None:
    p = LengthPredictor(budget="p90")
    _feed(p, list(range(1, 201)) * 5)
    for v in (10, 150, 199, 1000):
        e = p.estimate("m", prompt_tokens=100, declared=None, default=256)
        p.observe("m", prompt_tokens=100, tokens=v, estimate=e)
    s = p.calibration.summary()
    assert s["n"] == 4 and s["learned"] == 4
    assert s["cover_p50"] == 0.25          # only 10 is under the p50 (~100)
    assert s["cover_p90"] == 0.5           # 10 and 150 are under the p90 (~180)
    assert s["mae_p50"] is not None and s["mae_p50"] > 200


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        LengthPredictor(min_samples=0)
    with pytest.raises(ValueError):
        LengthPredictor(bands=(10, 5))


def test_state_round_trips_through_json_and_a_damaged_or_foreign_one_changes_nothing() -> None:
    import json
    from collections import deque

    from inferlb.routing.predictor_state import IncompatibleState

    rng = random.Random(3)
    p = LengthPredictor(min_samples=5)
    for _ in range(400):
        prompt, tenant = rng.randrange(10, 6000), rng.choice(["a", "b", None])
        est = p.estimate("m", prompt_tokens=prompt, declared=None, default=256, tenant=tenant)
        p.observe("m", prompt_tokens=prompt, tokens=round(rng.lognormvariate(4, 1)), tenant=tenant, estimate=est)
    state = json.loads(json.dumps(p.state()))
    q = LengthPredictor(min_samples=5)
    q.load(state)
    assert q.state() == p.state() and q.summary() == p.summary() and q.learned == 400
    # The statistics are recomputed from the histograms at first use, where p's cache may lag its
    # newest seven answers (the module docstring): once p refreshes, the estimates are the same.
    probes = [("m", pr, d, t) for pr in (50, 700, 3000, 9000) for d in (None, 40) for t in ("a", "b", "c", None)]
    for h in p._hists.values():
        h.cached = None
    assert [q.estimate(m, prompt_tokens=pr, declared=d, default=256, tenant=t) for m, pr, d, t in probes] == \
        [p.estimate(m, prompt_tokens=pr, declared=d, default=256, tenant=t) for m, pr, d, t in probes]
    before = q.summary()
    row = state["hists"][0]
    for bad in ({**state, "window": 10}, {**state, "learned": -1},
                {**state, "hists": [[*row[:6], [999], [1.0]]]}, {**state, "hists": [[*row[:6], [1], [-1.0]]]},
                {**state, "hists": [[*row[:6], [1], [float("inf")]]]}, {**state, "hists": [[1, *row[1:]]]}):
        with pytest.raises((IncompatibleState, ValueError, TypeError, KeyError)):
            LengthPredictor(min_samples=5).load(bad)
        with pytest.raises((IncompatibleState, ValueError, TypeError, KeyError)):
            q.load(bad)
        assert q.summary() == before
    small = LengthPredictor(min_samples=5, max_keys=3)
    small.load(state)
    assert small.kept() == 3                        # bounded whatever the snapshot holds
    box: deque[object] = deque(maxlen=2)
    p.outbox = box  # type: ignore[assignment]
    p.observe("m", prompt_tokens=1, tokens=5)       # with an outbox: queued, not learned
    assert p.learned == 400 and len(box) == 1
