"""What an emulated node is (:class:`NodeSpec`) and how it misbehaves (:class:`FaultSpec`).

Both are plain dataclasses so a test builds them inline. :meth:`FaultSpec.from_mapping` is the
strict parser behind ``POST /sim/faults``: unknown keys and wrong types are rejected with
``ValueError`` (the node answers 400), so a typo in a test never silently disables a fault.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .latency import LatencyModel

__all__ = ["FaultSpec", "NodeSpec", "demo_specs"]


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Faults a node injects; the default injects none.

    - ``status`` / ``error_rate``: answer ``status`` (OpenAI error envelope) instead of generating,
      with probability ``error_rate`` (default 1.0: always). ``retry_after_s`` adds a
      ``Retry-After`` header (whole seconds, rounded up) to that answer.
    - ``hang_before_headers``: accept and read the request, then never answer (until the client
      goes away or the node stops).
    - ``drop_after_tokens``: after N output tokens, close the TCP connection mid-body (no final
      chunk, no ``[DONE]``). Non-stream: a truncated body is sent, then the close.
    - ``stall_after_tokens``: after N output tokens, keep the connection open and send nothing.
    - ``malformed_sse_at``: the event of token N is broken JSON (the stream then goes on).
      Non-stream: the body is not valid JSON.
    - ``error_event_at``: at token N, send an in-band ``data: {"error": ...}`` event and end the
      body properly but without ``[DONE]`` (stream only).

    A request reads the faults when it arrives (and a stream again when it starts), so changing
    them never alters a response already being written.
    - ``loading``: ``/health`` answers 503 and inference endpoints 503 with ``Retry-After``.
    - ``refuse``: stop listening (connection refused). Applied by :meth:`EmulatedNode.set_faults` /
      ``POST /sim/faults`` stopping the node; only Python code (``SimFleet.start_node``) can start
      it again, since nothing listens any more for a request that would clear it.
    """

    status: int | None = None
    error_rate: float = 1.0
    retry_after_s: float | None = None
    hang_before_headers: bool = False
    drop_after_tokens: int | None = None
    stall_after_tokens: int | None = None
    malformed_sse_at: int | None = None
    error_event_at: int | None = None
    loading: bool = False
    refuse: bool = False

    def __post_init__(self) -> None:
        if self.status is not None and not 100 <= self.status <= 599:
            raise ValueError(f"status must be an HTTP status code, got {self.status}")
        if not (0.0 <= self.error_rate <= 1.0):
            raise ValueError(f"error_rate must be in [0, 1], got {self.error_rate}")
        retry = self.retry_after_s
        if retry is not None and not (math.isfinite(retry) and retry >= 0):
            raise ValueError("retry_after_s must be a finite number >= 0")
        for name in ("drop_after_tokens", "stall_after_tokens", "malformed_sse_at", "error_event_at"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0")

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> FaultSpec:
        """Build from JSON; ``ValueError`` names the first unknown key or badly typed value."""
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in known:
                raise ValueError(f"unknown fault key {key!r}")
            kwargs[key] = _check_type(key, value)
        return cls(**kwargs)

    def to_mapping(self) -> dict[str, Any]:
        """The JSON form (every field), as ``GET /sim/faults`` shows it."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


_BOOL_KEYS = frozenset({"hang_before_headers", "loading", "refuse"})
_FLOAT_KEYS = frozenset({"error_rate", "retry_after_s"})


def _check_type(key: str, value: Any) -> Any:
    if key in _BOOL_KEYS:
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false")
        return value
    if value is None and key != "error_rate":
        return None
    # bool is an int subclass; reject it where a number is meant.
    if key in _FLOAT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key} must be a number")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer")
    return value


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One emulated GPU server: the models it serves, its speed and its capacity.

    ``max_concurrency``: requests in flight beyond it are answered 429 with ``Retry-After: 1``.
    ``startup_s``: the node reports "loading" (503) for that long after each start.
    ``max_output_tokens``: a request asking for more gets 400, as a real server's context check.
    """

    name: str
    models: list[str]
    base_ttft_s: float = 0.02
    prefill_s_per_token: float = 0.0
    tpot_s: float = 0.005
    default_output_tokens: int = 16
    max_concurrency: int = 64
    max_output_tokens: int = 32_768
    embedding_dim: int = 32
    startup_s: float = 0.0
    faults: FaultSpec = field(default_factory=FaultSpec)

    def __post_init__(self) -> None:
        if not self.name or not self.models:
            raise ValueError("a node needs a name and at least one model")
        if self.default_output_tokens < 1 or self.max_concurrency < 1 or self.max_output_tokens < 1:
            raise ValueError("default_output_tokens, max_concurrency and max_output_tokens must be >= 1")
        if self.embedding_dim < 1:
            raise ValueError("embedding_dim must be >= 1")
        self.latency()  # validates the timing numbers

    def latency(self) -> LatencyModel:
        """The timing model of this node."""
        return LatencyModel(
            base_ttft_s=self.base_ttft_s, prefill_s_per_token=self.prefill_s_per_token, tpot_s=self.tpot_s
        )


def demo_specs() -> list[NodeSpec]:
    """Three nodes of different speeds, each serving ``demo-llm`` (chat, completions) and ``demo-embed``."""
    models = ["demo-llm", "demo-embed"]
    return [
        NodeSpec(name="sim-fast", models=list(models), base_ttft_s=0.03, prefill_s_per_token=0.00002,
                 tpot_s=0.008, default_output_tokens=32, max_concurrency=64),
        NodeSpec(name="sim-medium", models=list(models), base_ttft_s=0.06, prefill_s_per_token=0.00005,
                 tpot_s=0.015, default_output_tokens=32, max_concurrency=32),
        NodeSpec(name="sim-slow", models=list(models), base_ttft_s=0.15, prefill_s_per_token=0.0001,
                 tpot_s=0.03, default_output_tokens=32, max_concurrency=16),
    ]
