"""The emulator's timing model: pure arithmetic, no I/O, time injected.

Contract: token ``i`` (0-based) of a request that started at ``t0`` is due at
``t0 + ttft_s(prompt_tokens) + i * tpot_s``. The HTTP layer sleeps *until* each deadline rather
than sleeping ``tpot_s`` after each write, so event-loop overshoot does not accumulate over a long
generation.

Kept apart from the HTTP layer on purpose: the later fleet simulator (continuous batching, KV
cache, discrete-event mode) replaces or subclasses :class:`LatencyModel` without touching the
server code, and the model is unit-tested with a :class:`~inferlb.types.ManualClock`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferlb.types import Clock

__all__ = ["LatencyModel", "TokenSchedule", "estimate_tokens"]


def estimate_tokens(text_bytes: int) -> int:
    """Tokens for ``text_bytes`` UTF-8 bytes of text: ``ceil(bytes / 4)`` (about 4 bytes per token)."""
    return math.ceil(max(0, text_bytes) / 4)


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """Time to first token grows with the prompt (prefill); every later token costs ``tpot_s``."""

    base_ttft_s: float
    prefill_s_per_token: float
    tpot_s: float

    def __post_init__(self) -> None:
        for name in ("base_ttft_s", "prefill_s_per_token", "tpot_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def ttft_s(self, prompt_tokens: int) -> float:
        """Seconds from request arrival to the first output token."""
        return self.base_ttft_s + max(0, prompt_tokens) * self.prefill_s_per_token

    def token_offset_s(self, prompt_tokens: int, index: int) -> float:
        """Seconds from request arrival until output token ``index`` (0-based) is due."""
        return self.ttft_s(prompt_tokens) + max(0, index) * self.tpot_s

    def e2e_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """Seconds from arrival until the last of ``output_tokens`` tokens (the non-stream latency)."""
        if output_tokens <= 0:
            return self.ttft_s(prompt_tokens)
        return self.token_offset_s(prompt_tokens, output_tokens - 1)


class TokenSchedule:
    """The absolute deadlines of one request's tokens, anchored at ``clock.monotonic()`` on creation.

    ``delay_s(i)`` is how long to wait *now* for token ``i``; it is 0 when the deadline has passed,
    so a late loop catches up instead of drifting.
    """

    __slots__ = ("_clock", "_model", "output_tokens", "prompt_tokens", "start")

    def __init__(self, model: LatencyModel, clock: Clock, *, prompt_tokens: int, output_tokens: int) -> None:
        self._model = model
        self._clock = clock
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.start = clock.monotonic()

    def deadline(self, index: int) -> float:
        """Monotonic time at which token ``index`` is due."""
        return self.start + self._model.token_offset_s(self.prompt_tokens, index)

    def done_at(self) -> float:
        """Monotonic time at which the whole generation is complete."""
        return self.start + self._model.e2e_s(self.prompt_tokens, self.output_tokens)

    def delay_s(self, index: int) -> float:
        """Seconds to wait from now until token ``index`` is due (never negative)."""
        return max(0.0, self.deadline(index) - self._clock.monotonic())

    def delay_until_done_s(self) -> float:
        """Seconds to wait from now until the whole generation is complete (never negative)."""
        return max(0.0, self.done_at() - self._clock.monotonic())

    def tokens_due(self) -> int:
        """How many tokens are due by now (0 … ``output_tokens``)."""
        elapsed = self._clock.monotonic() - self.start
        ttft = self._model.ttft_s(self.prompt_tokens)
        if elapsed < ttft or self.output_tokens <= 0:
            return 0
        if self._model.tpot_s == 0:
            return self.output_tokens
        # The small epsilon keeps a token that is due exactly now from being lost to float rounding.
        due = int((elapsed - ttft) / self._model.tpot_s + 1e-9) + 1
        return min(due, self.output_tokens)
