"""Prompt-token estimation: a byte heuristic calibrated per model from the usage nodes report,
or a Hugging Face ``tokenizers`` tokenizer.json when the model config names one.

The heuristic starts at 4 bytes/token (English BPE average) and tracks the observed ratio with
an EWMA, so a model whose tokenizer packs fewer bytes per token is estimated correctly after a
few requests. Estimates feed routing (tokens in flight vs capacity) and admission.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["TokenEstimator"]

_DEFAULT_BYTES_PER_TOKEN = 4.0
_ALPHA = 0.1


class TokenEstimator:
    def __init__(self) -> None:
        self._bpt: dict[str, float] = {}
        self._tokenizers: dict[str, Callable[[str], int]] = {}

    def use_tokenizer(self, model: str, path: str) -> None:
        """Count exactly with a tokenizer.json (needs the ``tokenizers`` extra)."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        self._tokenizers[model] = lambda text: len(tok.encode(text).ids)

    def wants_text(self, model: str) -> bool:
        return model in self._tokenizers

    def estimate(self, model: str, prompt_bytes: int, text: str | None = None) -> int:
        count = self._tokenizers.get(model)
        if count is not None and text is not None:
            return count(text)
        return max(1, round(prompt_bytes / self._bpt.get(model, _DEFAULT_BYTES_PER_TOKEN)))

    def observe(self, model: str, prompt_bytes: int, prompt_tokens: int) -> None:
        """Calibrate from a node's reported ``usage.prompt_tokens``."""
        if prompt_tokens <= 0 or prompt_bytes <= 0:
            return
        ratio = prompt_bytes / prompt_tokens
        old = self._bpt.get(model)
        self._bpt[model] = ratio if old is None else (1 - _ALPHA) * old + _ALPHA * ratio

    def bytes_per_token(self, model: str) -> float:
        return self._bpt.get(model, _DEFAULT_BYTES_PER_TOKEN)
