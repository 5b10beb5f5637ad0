"""What an emulated node is (:class:`NodeSpec`) and how it misbehaves (:class:`FaultSpec`).

Both are plain dataclasses so a test builds them inline. :meth:`FaultSpec.from_mapping` is the
strict parser behind ``POST /sim/faults``: unknown keys and wrong types are rejected with
``ValueError`` (the node answers 400), so a typo in a test never silently disables a fault.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from inferlb.simulator.disagg import KVTransferSpec
from inferlb.simulator.latency import LatencyModel
from inferlb.simulator.lora import LoraSpec

__all__ = ["GET_LOAD_SHAPES", "BatchSpec", "FaultSpec", "GpuSpec", "NodeSpec", "demo_specs"]

# The shapes of the emulator's ``GET /get_load``, one per peer router that reads it.
GET_LOAD_SHAPES: tuple[Literal["sglang", "vllm-router"], ...] = ("sglang", "vllm-router")


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
    - ``error_rates``: ``{status: probability}``, several error codes at once (``{"500": 0.05,
      "503": 0.02}``); drawn after ``status``. A 429 or 503 drawn here carries ``retry_after_s``
      (default 1 s) as ``Retry-After``.
    - ``added_latency_s``: wait this long before answering anything (headers included).
    - ``slow_start_s`` / ``slow_start_factor``: after each (re)start's loading window, the node is
      ``slow_start_factor`` times slower, easing linearly back to 1× over ``slow_start_s``
      (cold caches, CUDA-graph capture: what a health checker's slow start must absorb).
    - ``gpu_xid_errors`` / ``gpu_ecc_uncorrected`` / ``gpu_throttle``: what the NVML-like GPU
      reading (``GET /sim/gpu``) reports, for hardware-fault handling ahead of request failures.
    - ``lora_fail``: LoRA adapters (of the spec's ``lora``) whose load fails from now on: a request
      for one is answered as vLLM answers an adapter it cannot serve (404, :mod:`.lora`).

    A crash (``POST /sim/crash`` or :meth:`EmulatedNode.crash`) is an action, not a standing fault.
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
    error_rates: dict[int, float] = field(default_factory=dict)
    added_latency_s: float = 0.0
    slow_start_s: float = 0.0
    slow_start_factor: float = 1.0
    gpu_xid_errors: int = 0
    gpu_ecc_uncorrected: int = 0
    gpu_throttle: bool = False
    lora_fail: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.status is not None and not 100 <= self.status <= 599:
            raise ValueError(f"status must be an HTTP status code, got {self.status}")
        for code, rate in self.error_rates.items():
            if not 100 <= code <= 599 or not 0.0 <= rate <= 1.0:
                raise ValueError(f"error_rates: {code} → {rate} must be an HTTP status → a rate in [0, 1]")
        if sum(self.error_rates.values()) > 1.0 + 1e-9:
            raise ValueError("error_rates must add up to at most 1")
        for name in ("added_latency_s", "slow_start_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0")
        if not (math.isfinite(self.slow_start_factor) and self.slow_start_factor >= 1.0):
            raise ValueError("slow_start_factor must be a finite number >= 1")
        if self.gpu_xid_errors < 0 or self.gpu_ecc_uncorrected < 0:
            raise ValueError("gpu_xid_errors and gpu_ecc_uncorrected must be >= 0")
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
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["error_rates"] = {str(k): v for k, v in self.error_rates.items()}
        out["lora_fail"] = list(self.lora_fail)
        return out


_BOOL_KEYS = frozenset({"hang_before_headers", "loading", "refuse", "gpu_throttle"})
_FLOAT_KEYS = frozenset({"error_rate", "retry_after_s", "added_latency_s", "slow_start_s", "slow_start_factor"})
_NOT_NULL = frozenset({"error_rate", "added_latency_s", "slow_start_s", "slow_start_factor", "gpu_xid_errors",
                       "gpu_ecc_uncorrected"})


def _number(key: str, value: Any) -> float:
    # bool is an int subclass; reject it where a number is meant.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number")
    return float(value)


def _check_type(key: str, value: Any) -> Any:
    if key == "error_rates":
        if not isinstance(value, Mapping):
            raise ValueError("error_rates must be an object of status code → rate")
        out: dict[int, float] = {}
        for code, rate in value.items():
            try:
                status = int(code)
            except (TypeError, ValueError):
                raise ValueError(f"error_rates: {code!r} is not a status code") from None
            out[status] = _number(f"error_rates[{code}]", rate)
        return out
    if key == "lora_fail":
        if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
            raise ValueError("lora_fail must be a list of adapter names")
        return tuple(value)
    if key in _BOOL_KEYS:
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false")
        return value
    if value is None and key not in _NOT_NULL:
        return None
    if key in _FLOAT_KEYS:
        return _number(key, value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer")
    return value


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """A vLLM-like engine: continuous batching over a paged KV cache (see :mod:`.batching`).

    One engine step runs every running sequence once and takes
    ``step_base_s + step_per_seq_s × running + step_per_kv_token_s × context tokens in the batch
    + prefill_s_per_token × prompt tokens prefilled in this step``, times the slow-start factor.
    ``kv_tokens``: KV-cache size, allocated in blocks of ``block_tokens``; a sequence holds
    prompt + generated tokens of it. ``max_num_seqs`` / ``max_batched_tokens``: vLLM's caps on the
    running batch and on the prompt tokens prefilled per step. ``on_kv_full``: ``"preempt"`` (vLLM:
    the newest running sequence is evicted and recomputed later) or ``"oom"`` (the process dies:
    every connection is reset and the node is loading for ``cold_start_s``).
    """

    kv_tokens: int = 65_536
    block_tokens: int = 16
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    step_base_s: float = 0.008
    step_per_seq_s: float = 0.00005
    step_per_kv_token_s: float = 0.0
    prefill_s_per_token: float = 0.00005
    watermark: float = 0.01
    on_kv_full: Literal["preempt", "oom"] = "preempt"
    cold_start_s: float = 30.0

    def __post_init__(self) -> None:
        if self.kv_tokens < self.block_tokens or self.block_tokens < 1:
            raise ValueError("kv_tokens must be >= block_tokens >= 1")
        if self.max_num_seqs < 1 or self.max_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_batched_tokens must be >= 1")
        for name in ("step_base_s", "step_per_seq_s", "step_per_kv_token_s", "prefill_s_per_token",
                     "cold_start_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")
        if self.on_kv_full not in ("preempt", "oom"):
            raise ValueError("on_kv_full must be 'preempt' or 'oom'")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """What the NVML-like reading (``GET /sim/gpu``) reports: relative figures, not vendor claims."""

    name: str = "inferlb-sim-gpu"
    memory_total_mib: int = 81_920
    memory_utilization: float = 0.9     # share vLLM pre-allocates (weights + KV pool): constant in NVML
    power_idle_w: float = 80.0
    power_limit_w: float = 700.0
    temp_idle_c: float = 32.0
    temp_busy_c: float = 74.0


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One emulated GPU server: the models it serves, its speed and its capacity.

    ``max_concurrency``: requests in flight beyond it are answered 429 with ``Retry-After: 1``.
    ``startup_s``: the node reports "loading" (503) for that long after each start.
    ``max_output_tokens``: a request asking for more gets 400, as a real server's context check.
    ``batching``: ``None`` (default) gives every request its own fixed-speed schedule
    (``base_ttft_s`` / ``prefill_s_per_token`` / ``tpot_s``, no queueing); a :class:`BatchSpec`
    makes the node a vLLM-like engine (continuous batching, KV cache, queue, preemption, OOM).
    ``stream_interval``: output tokens per SSE event after the first (vLLM's ``--stream-interval``);
    larger values cut the emulator's and the gateway's per-token CPU on big benchmarks.
    ``preset``: the preset the spec was made from (informational).
    ``prefix_cache``: keep a prefix cache (:mod:`.prefix_cache`) of ``prefix_cache_tokens`` tokens
    (default: the engine's ``kv_tokens``, or 65,536 on a fixed-speed node); a request whose
    leading blocks are cached prefills only the rest. Off by default.
    ``kv_events_port``: publish the prefix cache's KV events in vLLM's format over ZeroMQ
    (:mod:`.kv_publisher`: PUB bound on 127.0.0.1 at this port, 0 a free one, and its replay
    ROUTER on the next port, or a free one); None (default): no events. Needs ``prefix_cache``.
    ``network_delay_s``: the round trip between the gateway and this node (an edge node far away):
    every request, probes included, waits this long before the node handles it.
    ``get_load``: the shape of ``GET /get_load`` (:mod:`.control`), for the peer router in front:
    ``"sglang"`` (SGLang's list per rank, sglang-router reads it) or ``"vllm-router"``
    (``{"load": N}``, what vllm-router reads).
    ``kv_transfer``: what pulling a prompt's KV cache from a prefill node costs this node on a
    disaggregated decode leg (:mod:`.disagg`).
    ``lora``: the LoRA adapters the node can load, its adapter slots and load time (:mod:`.lora`);
    None: it serves its base models only.
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
    batching: BatchSpec | None = None
    stream_interval: int = 1
    gpu: GpuSpec = field(default_factory=GpuSpec)
    preset: str | None = None
    prefix_cache: bool = False
    prefix_cache_tokens: int | None = None
    kv_events_port: int | None = None
    network_delay_s: float = 0.0
    get_load: Literal["sglang", "vllm-router"] = "sglang"
    kv_transfer: KVTransferSpec = field(default_factory=KVTransferSpec)
    lora: LoraSpec | None = None

    def __post_init__(self) -> None:
        if self.get_load not in GET_LOAD_SHAPES:
            raise ValueError(f"get_load must be one of {', '.join(GET_LOAD_SHAPES)}")
        if not (math.isfinite(self.network_delay_s) and self.network_delay_s >= 0):
            raise ValueError("network_delay_s must be a finite number >= 0")
        if self.kv_events_port is not None and not (self.prefix_cache and 0 <= self.kv_events_port <= 65534):
            raise ValueError("kv_events_port needs prefix_cache and a port 0-65534 (0: a free one)")
        if self.prefix_cache_tokens is not None and self.prefix_cache_tokens < 16:
            raise ValueError("prefix_cache_tokens must be >= 16 (one block)")
        if not self.name or not self.models:
            raise ValueError("a node needs a name and at least one model")
        if self.default_output_tokens < 1 or self.max_concurrency < 1 or self.max_output_tokens < 1:
            raise ValueError("default_output_tokens, max_concurrency and max_output_tokens must be >= 1")
        if self.embedding_dim < 1:
            raise ValueError("embedding_dim must be >= 1")
        if self.stream_interval < 1:
            raise ValueError("stream_interval must be >= 1")
        self.latency()  # validates the timing numbers

    def adapters(self) -> tuple[str, ...]:
        """The LoRA adapters this node can serve (none without ``lora``)."""
        return self.lora.adapters if self.lora is not None else ()

    def latency(self) -> LatencyModel:
        """The timing model of this node."""
        return LatencyModel(
            base_ttft_s=self.base_ttft_s, prefill_s_per_token=self.prefill_s_per_token, tpot_s=self.tpot_s
        )


def demo_specs() -> list[NodeSpec]:
    """Three vLLM-like nodes of different speeds and KV sizes (the ``h100`` / ``a100`` / ``l4``
    presets), each serving ``demo-llm`` and its second version ``demo-llm-v2`` (chat, completions;
    two names on one server, like two LoRA adapters) and ``demo-embed``."""
    from inferlb.simulator.presets import preset_spec  # presets builds on this module

    models = ["demo-llm", "demo-llm-v2", "demo-embed"]
    return [preset_spec(name, preset, list(models), default_output_tokens=32)
            for name, preset in (("sim-fast", "h100"), ("sim-medium", "a100"), ("sim-slow", "l4"))]
