"""The learned success model (tiers/learned.py): a stable held-out split, learning a boundary that
the base rate cannot, readiness gated by the held-out log loss; outcomes read back from audit rows."""

from __future__ import annotations

import random
from typing import Any

from inferlb.config.tiers import TierLearnedConfig
from inferlb.tiers.learned import Example, TierModel, examples_from_rows, in_test


def test_the_split_is_stable_salted_and_near_its_share() -> None:
    ids = [f"r{i}" for i in range(5000)]
    held = [in_test(i, 0, 0.2) for i in ids]
    assert held == [in_test(i, 0, 0.2) for i in ids]
    assert 0.17 < sum(held) / len(held) < 0.23
    assert held != [in_test(i, 1, 0.2) for i in ids]


def test_it_learns_that_long_code_prompts_fail_and_only_then_is_ready() -> None:
    rng = random.Random(7)
    m = TierModel(TierLearnedConfig(enabled=True, min_samples=200, learning_rate=0.2))
    assert not m.ready and m.predict({}) == 0.5
    for i in range(3000):
        hard = rng.random() < 0.4
        feats = {"prompt_tokens": rng.uniform(0.5, 1.0) if hard else rng.uniform(0.0, 0.3),
                 "code": 1.0 if hard and rng.random() < 0.7 else 0.0}
        m.learn(Example(f"r{i}", "small", feats, success=not hard if rng.random() < 0.95 else hard))
        if i == 150:
            assert not m.ready                        # too few training outcomes yet
    model, base = m.losses()
    assert m.ready and model is not None and base is not None and model < base
    assert m.predict({"prompt_tokens": 0.1}) > 0.8 > 0.2 > m.predict({"prompt_tokens": 0.9, "code": 1.0})
    assert m.trained + m.tested == 3000 and 0.15 < m.tested / 3000 < 0.25


def test_a_model_no_better_than_the_base_rate_is_not_ready() -> None:
    rng = random.Random(3)
    m = TierModel(TierLearnedConfig(enabled=True, min_samples=50))
    for i in range(2000):   # success at random, whatever the features
        m.learn(Example(f"r{i}", "small", {"prompt_tokens": rng.random()}, success=rng.random() < 0.5))
    assert not m.ready


def test_outcomes_from_audit_rows() -> None:
    tier = {"alias": "auto", "model": "small", "features": {"prompt_tokens": 0.2}}
    rows: list[dict[str, Any]] = [
        {"request_id": "a", "status": "ok", "tags": {"tier": tier}, "received_at": 0.0, "last_byte_at": 1.0},
        {"request_id": "b", "status": "ok", "tags": {"tier": tier}, "received_at": 0.0, "last_byte_at": 9.0},
        {"request_id": "c", "status": "upstream_error", "tags": {"tier": tier}},
        {"request_id": "d", "status": "client_closed", "tags": {"tier": tier}},
        {"request_id": "e", "status": "ok", "tags": {}},
    ]
    ex = examples_from_rows(rows, e2e_max_s=5.0)
    assert [(e.request_id, e.success) for e in ex] == [("a", True), ("b", False), ("c", False)]
    assert ex[0].features == {"prompt_tokens": 0.2} and ex[0].tier == "small"
