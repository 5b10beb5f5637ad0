"""Token estimate: byte heuristic calibrated per model from reported usage."""

from __future__ import annotations

from inferlb.engine.tokens import TokenEstimator


def test_default_four_bytes_per_token() -> None:
    assert TokenEstimator().estimate("m", 400) == 100


def test_calibrates_towards_observed_ratio_per_model() -> None:
    est = TokenEstimator()
    for _ in range(60):
        est.observe("m", 300, 100)     # this model's tokenizer: 3 bytes / token
    assert est.estimate("m", 300) == 100
    assert est.estimate("other", 400) == 100   # other models unaffected
    before = est.bytes_per_token("m")
    est.observe("m", 0, 10)
    est.observe("m", 10, 0)                    # junk observations ignored
    assert est.bytes_per_token("m") == before
