"""Latency prediction per (request, node): TTFT and time per output token (TPOT), in seconds.

:class:`OnlineLinear` is the built-in predictor, chosen by measurement against river and
scikit-learn (docs/benchmarks.md, "Learned routing"): two log-linear models over
:mod:`~inferlb.routing.features` (one for TTFT, one for TPOT) fitted as exponentially
weighted ridge regressions, so they follow a fleet whose speed changes:

    D ← λ·D + x·xᵀ,  e ← λ·e + x·log y,   w = (D + ρ·I)⁻¹ (e + ρ·w₀)

λ (``forget``) weights the last ~1 / (1 − λ) observations; ρ (``ridge``) pulls the weights toward
the prior w₀ "the node will do what it did lately" (the recent-TTFT and recent-TPOT features with
coefficient 1, an unknown node at ``unknown_ttft_s`` / ``unknown_tpot_s``), so an untrained model
predicts what the gateway already measured, and the ridge never fades (no wind-up while a feature
stays constant). Predicting is a (candidates × features) · (features × 2) product and an exp: a
prediction is always positive and finite unless the model itself is broken (a NaN weight).

Pure: no clock, no I/O, no threads; whoever owns it (routing/lifecycle.py) decides when to train.
The public calls, usable from plain Python (the discrete-event simulator):

* ``predict(row) -> Prediction`` and ``predict_nodes(req, nodes) -> ndarray (n, 2)``;
* ``update(row, Observed(ttft_s, tpot_s))``: one measured answer (either time may be None);
* ``OnlineLinear.fit(rows, observed)``: a fresh model from a batch (the scheduled retrain).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from inferlb.routing.features import (
    FEATURE_NAMES,
    N_FEATURES,
    REQUEST_FEATURES,
    TPOT_INDEX,
    TTFT_INDEX,
    node_part,
    request_part,
)
from inferlb.routing.types import NodeView, RouteRequest

__all__ = ["LatencyPredictor", "Observed", "OnlineLinear", "OnlineLinearParams", "Prediction"]

_LOG_MIN, _LOG_MAX = math.log(1e-5), math.log(600.0)   # predictions clipped to [10 µs, 10 min]
_NR = len(REQUEST_FEATURES)
_CACHE_MAX = 8192
_K_INDEX = FEATURE_NAMES.index("log_inflight_ktokens")
_LOAD_INDEX = FEATURE_NAMES.index("load")


@dataclass(frozen=True, slots=True)
class Prediction:
    ttft_s: float
    tpot_s: float

    def e2e_s(self, output_tokens: int) -> float:
        """Predicted end-to-end time: first token, then the rest at TPOT each."""
        return self.ttft_s + self.tpot_s * max(0, output_tokens - 1)


@dataclass(frozen=True, slots=True)
class Observed:
    """What one answer measured, from the attempt's start at the node (the gateway's queue is not
    in it). ``ttft_s`` only for streamed answers (a non-streamed first byte is the whole answer);
    ``tpot_s``: (e2e − TTFT) / (tokens − 1) streamed, (e2e − predicted TTFT) / tokens not."""

    ttft_s: float | None
    tpot_s: float | None


class LatencyPredictor(Protocol):
    """What the ``predicted-latency`` scorer and the lifecycle need from a predictor."""

    version: int

    def predict_nodes(self, req: RouteRequest, nodes: Sequence[NodeView]) -> Any: ...

    def predict(self, row: Sequence[float]) -> Prediction: ...

    def update(self, row: Sequence[float], observed: Observed) -> None: ...


class OnlineLinearParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    forget: float = Field(0.999, gt=0.9, le=1.0)      # λ: weight of the past per observation
    ridge: float = Field(2.0, gt=0)                  # ρ: pull toward the prior
    unknown_ttft_s: float = Field(0.5, gt=0)         # prior TTFT of a node never measured
    unknown_tpot_s: float = Field(0.05, gt=0)        # prior TPOT of a node never measured (20 tokens/s)


def _prior(p: OnlineLinearParams) -> np.ndarray:
    w0 = np.zeros((N_FEATURES, 2))
    w0[TTFT_INDEX, 0] = 1.0
    w0[FEATURE_NAMES.index("ttft_unknown"), 0] = math.log(p.unknown_ttft_s)
    w0[TPOT_INDEX, 1] = 1.0
    w0[FEATURE_NAMES.index("tpot_unknown"), 1] = math.log(p.unknown_tpot_s)
    return w0


class OnlineLinear:
    """Log-linear TTFT and TPOT models, exponentially weighted ridge (see the module docstring)."""

    type_name = "online-linear"
    Params = OnlineLinearParams

    def __init__(self, params: OnlineLinearParams | None = None, *, version: int = 1) -> None:
        self.p = params or OnlineLinearParams()
        self.version = version
        self.seen = 0
        self._w0 = _prior(self.p)
        self._d = [np.zeros((N_FEATURES, N_FEATURES)), np.zeros((N_FEATURES, N_FEATURES))]
        self._e = [np.zeros(N_FEATURES), np.zeros(N_FEATURES)]
        self._reg = self.p.ridge * np.eye(N_FEATURES)
        self._set_weights(self._w0.copy())

    def _set_weights(self, w: np.ndarray) -> None:
        self.w = w
        self._wr = [[float(w[i, 0]) for i in range(_NR)], [float(w[i, 1]) for i in range(_NR)]]
        self._wn = np.ascontiguousarray(w[_NR:])
        # Per node view: its part of the two log-predictions. Views are immutable and the fleet
        # rebuilds a node's view only when its state changes, so most candidates of a decision
        # hit; keyed by id() with the view kept (an id is reused only after the view is freed).
        self._node_cache: dict[int, tuple[NodeView, float, float]] = {}

    # ------------------------------------------------------------------ predicting

    def predict_nodes(self, req: RouteRequest, nodes: Sequence[NodeView]) -> list[tuple[float, float]]:
        """Predicted (TTFT, TPOT) seconds per node, in order."""
        rp = request_part(req)
        wa, wb = self._wr
        a = sum(map(mul, rp, wa))     # the products summed as before, without a generator's frames
        b = sum(map(mul, rp, wb))
        cache = self._node_cache
        if len(cache) > _CACHE_MAX:
            cache.clear()
        out: list[tuple[float, float]] = []
        lo, hi, exp = _LOG_MIN, _LOG_MAX, math.exp
        miss: list[int] = []
        get = cache.get
        for n in nodes:
            hit = get(id(n))
            if hit is not None and hit[0] is n:
                la, lb = a + hit[1], b + hit[2]
                # Clipped to [lo, hi]: min(hi, max(lo, x)) without the calls (the same float for a
                # number; NaN kept as NaN: a broken model must show; ±inf clipped).
                out.append((exp(la if lo < la < hi else (lo if la <= lo else hi)) if la == la else la,
                            exp(lb if lo < lb < hi else (lo if lb <= lo else hi)) if lb == lb else lb))
            else:
                miss.append(len(out))
                out.append((0.0, 0.0))
        if miss:
            parts = (np.array([node_part(nodes[i]) for i in miss]) @ self._wn).tolist()
            for i, (na, nb) in zip(miss, parts, strict=True):
                n = nodes[i]
                cache[id(n)] = (n, na, nb)
                la, lb = a + na, b + nb
                out[i] = (exp(min(hi, max(lo, la))) if la == la else la, exp(min(hi, max(lo, lb))) if lb == lb else lb)
        return out

    def tpot_elasticity(self, node: NodeView) -> float:
        """d log(TPOT) / d log(in-flight tokens) at ``node``'s present load, from the learned TPOT
        weights of the load features (log1p(in-flight ktokens) and in-flight / capacity): what the
        ``predicted-latency`` scorer's interference term reads when no elasticity is configured.
        May be ≤ 0 (the model learned no slowdown with load); the caller floors it."""
        t = max(0, node.inflight_tokens)
        e = float(self.w[_K_INDEX, 1]) * t / (t + 1000.0)
        cap = node.capacity_tokens
        if cap > 0 and t / cap < 4.0:
            e += float(self.w[_LOAD_INDEX, 1]) * t / cap
        return e

    def predict(self, row: Sequence[float]) -> Prediction:
        la, lb = (np.asarray(row, dtype=float) @ self.w).tolist()
        lo, hi = _LOG_MIN, _LOG_MAX
        # np.clip's selection on two numbers, without its call (NaN stays NaN, as with np.clip).
        la = lo if la < lo else hi if la > hi else la
        lb = lo if lb < lo else hi if lb > hi else lb
        return Prediction(math.exp(la), math.exp(lb))

    # ------------------------------------------------------------------ learning

    def update(self, row: Sequence[float], observed: Observed) -> None:
        """One observation; a target that is None, non-finite or ≤ 0 is not learned from."""
        x = np.asarray(row, dtype=float)
        if x.shape != (N_FEATURES,) or not np.all(np.isfinite(x)):
            return
        lam = self.p.forget
        w = self.w.copy()
        learned = False
        for k, y in enumerate((observed.ttft_s, observed.tpot_s)):
            if y is None or not (0 < y < math.inf):
                continue
            d, e = self._d[k], self._e[k]
            d *= lam
            d += np.outer(x, x)
            e *= lam
            e += x * math.log(y)
            w[:, k] = np.linalg.solve(d + self._reg, e + self.p.ridge * self._w0[:, k])
            learned = True
        if learned:
            self.seen += 1
            self._set_weights(w)

    @classmethod
    def fit(cls, rows: Sequence[Sequence[float]], observed: Sequence[Observed],
            params: OnlineLinearParams | None = None, *, version: int = 1) -> OnlineLinear:
        """A fresh model from a batch, every observation weighted alike (the scheduled retrain)."""
        m = cls(params, version=version)
        X = np.asarray(rows, dtype=float).reshape(-1, N_FEATURES)
        w = m.w.copy()
        for k in range(2):
            ys = [getattr(o, "ttft_s" if k == 0 else "tpot_s") for o in observed]
            keep = [i for i, y in enumerate(ys) if y is not None and 0 < y < math.inf and np.all(np.isfinite(X[i]))]
            if not keep:
                continue
            Xk = X[keep]
            yk = np.log(np.asarray([ys[i] for i in keep], dtype=float))
            m._d[k] = Xk.T @ Xk
            m._e[k] = Xk.T @ yk
            w[:, k] = np.linalg.solve(m._d[k] + m._reg, m._e[k] + m.p.ridge * m._w0[:, k])
        m.seen = len(observed)
        m._set_weights(w)
        return m

    def describe(self) -> dict[str, Any]:
        """Weights by feature name (JSON), for ``GET /admin/routing`` and the docs."""
        return {"type": self.type_name, "version": self.version, "seen": self.seen,
                "weights": {n: [round(float(a), 4), round(float(b), 4)]
                            for n, (a, b) in zip(FEATURE_NAMES, self.w, strict=True)}}
