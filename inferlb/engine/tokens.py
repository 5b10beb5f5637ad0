"""Prompt-token estimation: a line fitted per model and endpoint to the usage nodes report, or a
Hugging Face ``tokenizers`` tokenizer.json when the model config names one.

A prompt of ``b`` bytes is estimated as ``a + b / bpt`` tokens. ``bpt`` (bytes per token) starts at
4 (the English BPE average) and ``a`` (the fixed tokens a server adds: a chat template's role
markers and default system prompt, a BOS token) at 0; both are refitted by least squares on the
reports, the older ones weighing less (a forgetting factor), with a weak prior that keeps ``bpt``
near 4 until prompts of different lengths have been seen. The intercept matters: in front of a real
chat server (llama.cpp serving SmolLM2-135M-Instruct, tests/integration/test_real_engine.py) a
6-byte message is 31 prompt tokens, almost all of them template, so a bytes-per-token ratio alone
learned 0.2 bytes a token from short prompts and then estimated a 18,000-byte prompt at 5× its real
size, refusing it as over the context window. Chat and completions are fitted apart (only chat has
a template). Estimates feed routing (tokens in flight vs capacity), admission and the context check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["TokenEstimator"]

_DEFAULT_BYTES_PER_TOKEN = 4.0
# Forgetting factor per report: the fit follows a server whose template or tokenizer changed.
_FORGET = 0.98
# Prior strengths: the slope is held near 1/4 token a byte by about one 32-byte report's worth of
# evidence (Σx² = 1,000), so a few short prompts cannot tilt it far; the intercept is nearly free.
_PRIOR_SLOPE = 1000.0
_PRIOR_INTERCEPT = 0.1


@dataclass(slots=True)
class _Fit:
    """Decayed sums for the least-squares line tokens = a + b · bytes."""

    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    a: float = 0.0
    b: float = 1.0 / _DEFAULT_BYTES_PER_TOKEN

    def add(self, x: float, y: float) -> None:
        f = _FORGET
        self.n = f * self.n + 1.0
        self.sx = f * self.sx + x
        self.sy = f * self.sy + y
        self.sxx = f * self.sxx + x * x
        self.sxy = f * self.sxy + x * y
        # Minimise Σ(y − a − b·x)² + κa·a² + κb·(b − b0)²: the 2 × 2 normal equations.
        b0 = 1.0 / _DEFAULT_BYTES_PER_TOKEN
        m11, m12, m22 = self.n + _PRIOR_INTERCEPT, self.sx, self.sxx + _PRIOR_SLOPE
        r1, r2 = self.sy, self.sxy + _PRIOR_SLOPE * b0
        det = m11 * m22 - m12 * m12
        if det <= 0.0:
            return
        a = (r1 * m22 - m12 * r2) / det
        b = (m11 * r2 - m12 * r1) / det
        if a < 0.0:   # a server adds tokens, never removes them: the best line through the origin
            a, b = 0.0, r2 / m22
        if b > 0.0:   # a tokenizer never gives fewer tokens for more bytes
            self.a, self.b = a, b


class TokenEstimator:
    """Per (model, endpoint) prompt-token estimates (see the module docstring)."""

    def __init__(self) -> None:
        self._fits: dict[tuple[str, str], _Fit] = {}
        self._tokenizers: dict[str, Callable[[str], int]] = {}

    def use_tokenizer(self, model: str, path: str) -> None:
        """Count exactly with a tokenizer.json (needs the ``tokenizers`` extra)."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        self._tokenizers[model] = lambda text: len(tok.encode(text).ids)

    def wants_text(self, model: str) -> bool:
        return model in self._tokenizers

    def estimate(self, model: str, prompt_bytes: int, text: str | None = None, endpoint: str = "") -> int:
        """Tokens of a prompt of ``prompt_bytes`` bytes (``text`` when a tokenizer counts exactly)."""
        count = self._tokenizers.get(model)
        if count is not None and text is not None:
            return count(text)
        fit = self._fits.get((model, endpoint))
        if fit is None:
            return max(1, round(prompt_bytes / _DEFAULT_BYTES_PER_TOKEN))
        return max(1, round(fit.a + fit.b * prompt_bytes))

    def observe(self, model: str, prompt_bytes: int, prompt_tokens: int, endpoint: str = "") -> None:
        """Calibrate from a node's reported ``usage.prompt_tokens`` for a prompt of ``prompt_bytes``."""
        if prompt_tokens <= 0 or prompt_bytes <= 0:
            return
        key = (model, endpoint)
        fit = self._fits.get(key)
        if fit is None:
            fit = self._fits[key] = _Fit()
        fit.add(float(prompt_bytes), float(prompt_tokens))

    def bytes_per_token(self, model: str, endpoint: str = "") -> float:
        """The fitted bytes per token (the slope's inverse; 4 before any report)."""
        fit = self._fits.get((model, endpoint))
        return _DEFAULT_BYTES_PER_TOKEN if fit is None else 1.0 / fit.b

    def overhead_tokens(self, model: str, endpoint: str = "") -> float:
        """The fitted fixed tokens a prompt costs on top of its bytes (0 before any report)."""
        fit = self._fits.get((model, endpoint))
        return 0.0 if fit is None else fit.a
