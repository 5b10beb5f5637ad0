"""A small learned model of a cheaper tier: P(a request succeeds there | its features). Pure, no I/O.

Online logistic regression (one SGD step per outcome, L2-regularised) over the classifier's
features (tiers/classify.py) and a bias. The label is 1 when the tier served the request without
error and within the alias's SLO, else 0 (tiers/router.py takes them from the request's end, the
same record the audit trail keeps; :func:`examples_from_rows` reads them back from stored audit rows).

**Train/test split.** Each outcome goes to training or to the held-out test set by a stable hash of
its request id salted with ``seed`` (``test_share`` of them are held out, never trained on). On
arrival a test outcome is scored by the current model and by the base rate (the mean training
label), each by its log loss; over the last :data:`TEST_WINDOW` test outcomes the model is *ready*
when it has seen ``min_samples`` training outcomes, at least :data:`MIN_TEST` test ones, and its
log loss is below the base rate's. Until then the router keeps the explainable thresholds.

What it learns is biased by what the tier was sent (the thresholds pick which requests reach it);
the guard's probes and requests just over a threshold are what it learns the boundary from. That
is why it is off by default and gated by the held-out test.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inferlb.config.tiers import FEATURE_NAMES, TierLearnedConfig
from inferlb.versions.assign import unit_hash

__all__ = ["MIN_TEST", "TEST_WINDOW", "Example", "TierModel", "examples_from_rows", "in_test"]

TEST_WINDOW = 500
MIN_TEST = 20
_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class Example:
    """One outcome: the request id, the tier model that served it, its features, success."""

    request_id: str
    tier: str
    features: dict[str, float]
    success: bool


def in_test(request_id: str, seed: int, test_share: float) -> bool:
    """Whether the outcome of ``request_id`` is held out for testing."""
    return unit_hash(f"tiers-split:{seed}".encode(), request_id) < test_share


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _logloss(p: float, y: bool) -> float:
    p = min(1 - _EPS, max(_EPS, p))
    return -math.log(p if y else 1 - p)


class TierModel:
    """The learned success model of one cheaper tier (see the module docstring)."""

    def __init__(self, cfg: TierLearnedConfig) -> None:
        self.cfg = cfg
        self.w = {n: 0.0 for n in FEATURE_NAMES}
        self.bias = 0.0
        self.trained = 0
        self.positives = 0
        self.tested = 0
        self._test: deque[tuple[float, float]] = deque(maxlen=TEST_WINDOW)   # (model loss, base loss)

    def predict(self, feats: Mapping[str, float]) -> float:
        """P(success) for a request of features ``feats``."""
        z = self.bias + sum(self.w[n] * float(feats.get(n, 0.0)) for n in FEATURE_NAMES)
        return _sigmoid(z)

    def base_rate(self) -> float:
        return (self.positives + 1) / (self.trained + 2)   # Laplace: 0.5 before any data

    def learn(self, ex: Example) -> None:
        """Train on ``ex``, or test on it when its id falls in the held-out share."""
        cfg = self.cfg
        if in_test(ex.request_id, cfg.seed, cfg.test_share):
            self._test.append((_logloss(self.predict(ex.features), ex.success),
                               _logloss(self.base_rate(), ex.success)))
            self.tested += 1
            return
        g = self.predict(ex.features) - (1.0 if ex.success else 0.0)
        lr = cfg.learning_rate
        for n in FEATURE_NAMES:
            self.w[n] -= lr * (g * float(ex.features.get(n, 0.0)) + cfg.l2 * self.w[n])
        self.bias -= lr * g
        self.trained += 1
        self.positives += ex.success

    def losses(self) -> tuple[float | None, float | None]:
        """Mean held-out log loss of the model and of the base rate (None before any test outcome)."""
        if not self._test:
            return None, None
        k = len(self._test)
        return sum(m for m, _ in self._test) / k, sum(b for _, b in self._test) / k

    @property
    def ready(self) -> bool:
        model, base = self.losses()
        return (self.trained >= self.cfg.min_samples and len(self._test) >= MIN_TEST and model is not None
                and base is not None and model < base)

    def describe(self) -> dict[str, Any]:
        model, base = self.losses()
        return {"ready": self.ready, "trained": self.trained, "tested": self.tested,
                "base_rate": round(self.base_rate(), 6),
                "test_logloss": None if model is None else round(model, 6),
                "base_logloss": None if base is None else round(base, 6),
                "weights": {n: round(w, 6) for n, w in self.w.items()}, "bias": round(self.bias, 6)}


def examples_from_rows(rows: Iterable[Mapping[str, Any]], *, e2e_max_s: float | None = None,
                       ttft_max_s: float | None = None) -> list[Example]:
    """Training outcomes from stored audit rows (``tags.tier`` as the router writes it, ``status``,
    ``received_at``, ``first_byte_at``, ``last_byte_at``), oldest first as given. Rows without a tier
    choice, and those ended by the client (``rejected_invalid``, ``client_closed``), are skipped."""
    out = []
    for r in rows:
        tier = (r.get("tags") or {}).get("tier")
        if not isinstance(tier, dict) or not isinstance(tier.get("features"), dict):
            continue
        status = r.get("status")
        if status in ("rejected_invalid", "client_closed"):
            continue
        ok = status == "ok"
        t0, first, last = r.get("received_at"), r.get("first_byte_at"), r.get("last_byte_at")
        if ok and e2e_max_s is not None and t0 is not None and last is not None and last - t0 > e2e_max_s:
            ok = False
        if ok and ttft_max_s is not None and r.get("stream") and t0 is not None and first is not None \
                and first - t0 > ttft_max_s:
            ok = False
        out.append(Example(str(r.get("request_id")), str(tier.get("model")),
                           {k: float(v) for k, v in tier["features"].items()}, ok))
    return out
