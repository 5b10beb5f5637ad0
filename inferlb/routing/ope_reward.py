"""The reward model of doubly robust off-policy evaluation, fitted on logged outcomes.

DR needs q̂(x, a): the expected cost of sending request x to node a. Using the logging policy's
own latency predictions as q̂ (the first version did) makes DR share that policy's view of the
trade-off and its blind spots: they predict the node's latency, not the cost the client saw
(gateway queue, failures), so DR was biased toward the logging policy (+30 % at 85 % load,
docs/benchmarks.md). Here q̂ is a ridge regression of the *measured* cost of each logged pick on
that pick's context, with the logged prediction as one input among others, **cross-fitted**
(each half of the rounds gets q̂ from the model fitted on the other half), so a round's own
outcome never enters its own q̂. Pure numpy; no I/O.

Inputs per candidate (:func:`reward_features`): bias, the logged predicted e2e (or 0 with an
indicator when none), log1p(output budget), log1p(prompt), streamed, in-flight tokens /
capacity, log1p(in-flight requests), log1p(waiting).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from inferlb.routing.types import NodeView, RouteRequest

__all__ = ["N_REWARD_FEATURES", "cross_fit", "reward_features"]

N_REWARD_FEATURES = 9


def reward_features(req: RouteRequest, node: NodeView, pred: tuple[float, float] | None) -> list[float]:
    """The reward model's inputs for (``req``, ``node``) with its logged prediction ``pred``."""
    e2e = pred[0] + pred[1] * max(0, req.output_tokens - 1) if pred is not None else 0.0
    cap = node.capacity_tokens
    return [1.0, e2e, 0.0 if pred is not None else 1.0, math.log1p(max(0, req.output_tokens)),
            math.log1p(max(0, req.prompt_tokens)), 1.0 if req.stream else 0.0,
            min(4.0, max(0, node.inflight_tokens) / cap) if cap > 0 else 0.0,
            math.log1p(max(0, node.inflight_requests)), math.log1p(max(0, node.waiting or 0))]


def _fit(x: np.ndarray, y: np.ndarray, ridge: float) -> np.ndarray:
    reg = ridge * np.eye(x.shape[1])
    reg[0, 0] = 0.0    # the bias is not shrunk
    return np.linalg.solve(x.T @ x + reg, x.T @ y)


def cross_fit(picked: Sequence[Sequence[float]], rewards: Sequence[float],
              candidates: Sequence[Sequence[Sequence[float]]], *, folds: int = 2, ridge: float = 1.0
              ) -> list[list[float]]:
    """q̂ for every candidate of every round: round i's candidates scored by the model fitted on
    the rounds of the other folds (i mod ``folds``). ``picked[i]``: the features of round i's
    logged pick; ``rewards[i]``: its measured cost; ``candidates[i]``: the features of each
    candidate of round i. With fewer than 2 × ``folds`` rounds, one model fitted on all."""
    n = len(picked)
    if n == 0:
        return []
    x = np.asarray(picked, dtype=float).reshape(n, -1)
    y = np.asarray(rewards, dtype=float)
    k = folds if n >= 2 * folds else 1
    models = []
    for f in range(k):
        keep = np.arange(n) % k != f if k > 1 else np.ones(n, dtype=bool)
        models.append(_fit(x[keep], y[keep], ridge))
    out: list[list[float]] = []
    for i, cands in enumerate(candidates):
        w = models[i % k]
        out.append((np.asarray(cands, dtype=float).reshape(len(cands), -1) @ w).tolist() if cands else [])
    return out
