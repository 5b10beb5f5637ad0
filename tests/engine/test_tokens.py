"""Token estimate: a line fitted per model and endpoint to reported usage, or a tokenizer."""

from __future__ import annotations

import pytest

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


def test_tokenizer_json_counts_exactly(tmp_path: object) -> None:
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = Path(str(tmp_path)) / "tokenizer.json"
    tok.save(str(path))
    est = TokenEstimator()
    est.use_tokenizer("m", str(path))
    assert est.wants_text("m") and not est.wants_text("other")
    assert est.estimate("m", 10_000, "hello world hello unknownword") == 4   # counts tokens, ignores bytes
    assert est.estimate("m", 400, None) == 100                             # no text: byte heuristic


def test_fits_a_servers_fixed_overhead_as_well_as_its_bytes_per_token() -> None:
    # A chat server's template adds about 30 tokens to every prompt; its tokenizer packs 4.7 bytes a
    # token (the shape SmolLM2-135M-Instruct under llama.cpp reported: tests/integration/test_real_engine.py).
    est = TokenEstimator()

    def truth(n: int) -> int:
        return round(30 + n / 4.7)

    for n in [6, 2400, 40, 900, 12, 18000, 300, 6, 5000, 60] * 3:
        est.observe("m", n, truth(n), "chat")
    for n in (6, 120, 3000, 18000):
        assert abs(est.estimate("m", n, endpoint="chat") - truth(n)) <= max(2, 0.05 * truth(n))
    assert est.overhead_tokens("m", "chat") == pytest.approx(30, abs=2)
    assert est.estimate("m", 400, endpoint="completions") == 100   # endpoints are fitted apart


def test_one_short_report_does_not_blow_up_long_estimates() -> None:
    # The old ratio learned 6 bytes / 31 tokens from one short chat and then estimated 18,000 bytes
    # at 93,000 tokens; the fit keeps the slope near its prior until lengths vary.
    est = TokenEstimator()
    est.observe("m", 6, 31, "chat")
    assert est.estimate("m", 18000, endpoint="chat") < 5000
    assert est.estimate("m", 6, endpoint="chat") >= 25
