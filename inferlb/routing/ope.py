"""Off-policy evaluation: how would a candidate policy have done on logged decisions?

Each logged round i has the reward (here a cost: latency seconds, lower is better) r_i of the
action the logging policy took, that action's propensity μ_i (logged at decision time), the
candidate policy's probability π_i of the same action in the same context, and optionally a
reward model's estimate q̂ for that action (``q_logged``) and its expectation under the candidate
(``q_target`` = Σ_a π(a|x) q̂(x, a)). With w_i = π_i / μ_i:

* IPS (inverse propensity scoring): mean(w · r). Unbiased when μ > 0 wherever π > 0;
* SNIPS (self-normalised IPS): Σ w·r / Σ w. Slightly biased, much lower variance;
* DR (doubly robust): mean(q_target + w · (r − q_logged)). Unbiased if either the propensities
  or the reward model is right; falls back to IPS terms where no q̂ was logged.
* SWITCH-DR (a per-round form of the SWITCH estimator):
  mean(q_target + [w ≤ τ] · w · (r − q_logged)): DR where the weight is at most ``switch_tau``
  (τ), the reward model alone where a round's weight is larger. Trades the variance of the few
  heavy rounds for the reward model's bias on them; rounds without q̂ keep their IPS term.

Confidence intervals: percentile bootstrap over rounds (``n_boot`` resamples, seeded). The same
resamples give each estimator's ratio to the logging policy's own mean on the same rounds
(``vs_logged``, a *paired* interval: a policy that decides as the logging one did has the ratio 1
in every resample), what the policy gate compares (routing/gate.py). The
effective sample size (Σw)² / Σw² says how many logged rounds the estimate is really worth.
Pure numpy; plain Python callers (the discrete-event simulator) build :class:`Round` lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SWITCH_TAU", "Estimate", "Round", "estimate"]


@dataclass(frozen=True, slots=True)
class Round:
    reward: float
    propensity: float            # μ(a_logged | x) > 0
    target_p: float              # π(a_logged | x)
    q_logged: float | None = None
    q_target: float | None = None


@dataclass(frozen=True, slots=True)
class Estimate:
    method: str
    value: float
    low: float
    high: float
    n: int

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "value": self.value, "ci_low": self.low, "ci_high": self.high, "n": self.n}


SWITCH_TAU = 10.0


def _values(r: np.ndarray, w: np.ndarray, qa: np.ndarray, qpi: np.ndarray, keep: np.ndarray) -> dict[str, float]:
    sw = float(w.sum())
    corr = w * (r - qa)
    return {"ips": float(np.mean(w * r)),
            "snips": float((w * r).sum() / sw) if sw > 0 else float("nan"),
            "dr": float(np.mean(qpi + corr)),
            "switch_dr": float(np.mean(qpi + np.where(keep, corr, 0.0)))}


def estimate(rounds: Sequence[Round], *, n_boot: int = 500, alpha: float = 0.05, seed: int = 0,
             switch_tau: float = SWITCH_TAU) -> dict[str, Any]:
    """IPS, SNIPS, DR and SWITCH-DR (weight threshold ``switch_tau``) with (1 − ``alpha``)
    bootstrap intervals, the logging policy's own mean (``logged``), each estimate's ratio to it with
    its paired interval (``vs_logged``: estimator → value, ci_low, ci_high), the effective sample size,
    the number of rounds and ``switched`` (rounds whose correction SWITCH-DR dropped)."""
    if not rounds:
        raise ValueError("no logged rounds to evaluate")
    if not switch_tau > 0:
        raise ValueError("switch_tau must be > 0")
    r = np.array([x.reward for x in rounds], dtype=float)
    mu = np.array([x.propensity for x in rounds], dtype=float)
    if np.any(mu <= 0) or not np.all(np.isfinite(mu)):
        raise ValueError("every logged propensity must be finite and > 0")
    pi = np.array([x.target_p for x in rounds], dtype=float)
    w = pi / mu
    # Where no reward model was logged, DR's term is the IPS term (q̂ = 0).
    qa = np.array([0.0 if x.q_logged is None or x.q_target is None else x.q_logged for x in rounds])
    qpi = np.array([0.0 if x.q_logged is None or x.q_target is None else x.q_target for x in rounds])
    has_q = np.array([x.q_logged is not None and x.q_target is not None for x in rounds])
    # A heavy round is switched to the reward model only where there is one.
    keep = (w <= switch_tau) | ~has_q
    point = _values(r, w, qa, qpi, keep)
    rng = np.random.default_rng(seed)
    n = len(rounds)
    boots: dict[str, list[float]] = {k: [] for k in point}
    ratios: dict[str, list[float]] = {k: [] for k in point}
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        base = float(r[idx].mean())
        for k, v in _values(r[idx], w[idx], qa[idx], qpi[idx], keep[idx]).items():
            boots[k].append(v)
            ratios[k].append(v / base if base > 0 else float("nan"))
    out: dict[str, Any] = {}
    q = [100 * alpha / 2, 100 * (1 - alpha / 2)]
    logged = float(r.mean())
    vs_logged: dict[str, dict[str, float]] = {}
    for k, v in point.items():
        lo, hi = np.nanpercentile(boots[k], q)
        out[k] = Estimate(k, v, float(lo), float(hi), n)
        rlo, rhi = np.nanpercentile(ratios[k], q) if np.any(np.isfinite(ratios[k])) else (np.nan, np.nan)
        vs_logged[k] = {"value": v / logged if logged > 0 else float("nan"), "ci_low": float(rlo),
                        "ci_high": float(rhi)}
    sw, sw2 = float(w.sum()), float((w * w).sum())
    out["logged"] = logged
    out["vs_logged"] = vs_logged
    out["ess"] = sw * sw / sw2 if sw2 > 0 else 0.0
    out["n"] = n
    out["switched"] = int((~keep).sum())
    return out
