"""The features a latency predictor reads for one (request, node) pair: only what routing already has.

Pure and cheap (it runs per candidate inside a routing decision). Values are in log space where
latency scales multiplicatively (a log-linear model then learns power laws such as "TTFT grows with
prompt × the node's recent time per token" as sums), and every unknown value has its own
indicator so "not known yet" is learned apart from "zero":

request part (the same for every candidate, :func:`request_part`):
    bias, log1p(prompt tokens), log1p(output budget), streamed (0/1), critical priority (0/1)
node part (:func:`node_part`):
    log(recent TTFT) | unknown, log(recent time per output token = 1 / tokens_per_s) | unknown,
    log1p(in-flight tokens / 1,000), log1p(in-flight requests), log1p(waiting) | unknown,
    KV-cache use | unknown, in-flight tokens / capacity, GPU type (one-hot over :data:`GPU_TYPES`,
    the first whose name the node's ``gpu`` / ``gpu_type`` label contains, case-insensitive, e.g.
    "NVIDIA-H100-80GB" → h100; ``gpu_other`` for any other label; all zero without one).

A feature row is a plain ``list[float]`` (:data:`FEATURE_NAMES` order); the predictor keeps it
with each observation so training needs nothing but the row and the measured times.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import inf, log, log1p

from inferlb.routing.types import NodeView, RouteRequest

__all__ = [
    "FEATURE_NAMES",
    "GPU_TYPES",
    "N_FEATURES",
    "REQUEST_FEATURES",
    "TPOT_INDEX",
    "TTFT_INDEX",
    "features",
    "node_part",
    "request_part",
]

# Longest names first where one contains another (l40s before l4).
GPU_TYPES = ("h100", "h200", "b200", "a100", "l40s", "l4", "a10g", "t4", "mi300x")
_GPU_SLOTS = len(GPU_TYPES) + 1   # + gpu_other
REQUEST_FEATURES = ("bias", "log_prompt", "log_output", "stream", "critical")
_NODE_FEATURES = ("log_ttft", "ttft_unknown", "log_tpot", "tpot_unknown", "log_inflight_ktokens",
                  "log_inflight_requests", "log_waiting", "waiting_unknown", "kv_usage", "kv_unknown",
                  "load", *(f"gpu_{g}" for g in GPU_TYPES), "gpu_other")
FEATURE_NAMES: tuple[str, ...] = REQUEST_FEATURES + _NODE_FEATURES
N_FEATURES = len(FEATURE_NAMES)
TTFT_INDEX = FEATURE_NAMES.index("log_ttft")     # a prior: predicted TTFT ≈ the node's recent TTFT
TPOT_INDEX = FEATURE_NAMES.index("log_tpot")     # a prior: predicted TPOT ≈ the node's recent TPOT

_GPU_CACHE: dict[str, int] = {}
_NO_GPU = [0.0] * _GPU_SLOTS


def request_part(req: RouteRequest, critical: str = "critical") -> list[float]:
    """The request's features (the first five of every row)."""
    # ``x if x > 0 else 0`` is max(0, x) without the call (the same value, the int 0 at or below 0).
    p, o = req.prompt_tokens, req.output_tokens
    return [1.0, log1p(p if p > 0 else 0), log1p(o if o > 0 else 0),
            1.0 if req.stream else 0.0, 1.0 if req.priority == critical else 0.0]


def _gpu(labels: Sequence[tuple[str, str]]) -> list[float]:
    for k, v in labels:
        if k in ("gpu", "gpu_type"):
            b = _GPU_CACHE.get(v)
            if b is None:
                low = v.lower()
                b = next((i for i, g in enumerate(GPU_TYPES) if g in low), len(GPU_TYPES))
                if len(_GPU_CACHE) < 1024:
                    _GPU_CACHE[v] = b
            out = [0.0] * _GPU_SLOTS
            out[b] = 1.0
            return out
    return _NO_GPU


def node_part(node: NodeView) -> list[float]:
    """The node's features (the rest of every row). Non-finite or non-positive recent times count
    as unknown, so a bad sample cannot poison a prediction."""
    t = node.ttft_s
    tps = node.tokens_per_s
    w = node.waiting
    kv = node.kv_usage
    cap = node.capacity_tokens
    ttft_ok = t is not None and 0 < t < inf
    tps_ok = tps is not None and 0 < tps < inf
    # The clamps written out, without the calls, each the value its min()/max() gives:
    # ``x if x > 0 else 0`` is max(0, x) (the int 0 at or below 0); for a KV use that is a
    # number, ``(1.0 if kv >= 1.0 else kv) if kv > 0.0 else 0.0`` is min(1.0, max(0.0, kv))
    # (0.0 for -0.0 and 0.0, the float 1.0 from 1 up, an int 1 included); ``x if x < 4.0 else
    # 4.0`` is min(4.0, x) for x ≥ 0 (4.0 for a NaN, as min gives).
    it = node.inflight_tokens
    it = it if it > 0 else 0
    ir = node.inflight_requests
    return [
        log(t) if ttft_ok else 0.0, 0.0 if ttft_ok else 1.0,   # type: ignore[arg-type]
        -log(tps) if tps_ok else 0.0, 0.0 if tps_ok else 1.0,  # type: ignore[arg-type]
        log1p(it / 1000.0), log1p(ir if ir > 0 else 0),
        log1p(w if w > 0 else 0) if w is not None else 0.0, 0.0 if w is not None else 1.0,
        ((1.0 if kv >= 1.0 else kv) if kv > 0.0 else 0.0) if kv is not None and kv == kv else 0.0,
        0.0 if kv is not None else 1.0,
        (x if (x := it / cap) < 4.0 else 4.0) if cap > 0 else 0.0,
        *_gpu(node.labels),
    ]


def features(req: RouteRequest, node: NodeView) -> list[float]:
    """The whole feature row of (``req``, ``node``), in :data:`FEATURE_NAMES` order."""
    return request_part(req) + node_part(node)
