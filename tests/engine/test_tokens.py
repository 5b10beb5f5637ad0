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
