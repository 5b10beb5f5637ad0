"""The statistical guard of a canary step: promote, hold or roll back. Pure.

Two tests compare the canary (the new version) with the baseline (the old one) over the same
window:

* **errors**: failed attempts / attempts. An attempt fails when its node answered 5xx, timed
  out, reset, or broke the stream; a 429 (busy) or another 4xx (the request's own fault) counts
  as neither, and nor does a client that went away.
* **SLO misses**: successful requests over the SLO (``ttft_max_s`` for streams, ``e2e_max_s``) /
  successful requests. Runs only when an SLO is known.
* **latency** (``ttft``, ``tpot``, ``e2e``; while ``max_latency_ratio`` is set): the node's times
  of successful requests, each version's served attempt from its start at the node (after the
  gateway's queue) to its first byte (``ttft``, streams), per output token after the first
  (``tpot``, streams of two tokens or more), to its end (``e2e``, requests not streamed: a
  stream's e2e is mostly its length). Streams and the rest are never mixed, and both versions'
  times come from the same window, so they ran under the same traffic. A metric that neither
  version has a time of is left out (no streams, no ``ttft`` test).

For the error and SLO tests, with ``z`` the one-sided quantile of ``confidence`` and ``d = p_canary − p_baseline``
bounded by Newcombe's interval (:func:`~.stats.diff_bounds`):

* fewer than ``min_requests`` on either side → ``collecting``;
* lower bound of ``d`` > margin → ``worse``: the canary is worse by more than allowed;
* upper bound of ``d`` ≤ margin → ``within``: it is no worse than allowed;
* otherwise ``inconclusive``.

For each latency metric, with ``r`` the ratio of geometric means canary / baseline bounded by
Welch's interval on the mean logs (:func:`~.stats.log_ratio_bounds`) and ``max_latency_ratio``
as the margin: fewer than ``min_requests`` times (at least 2) on either side → ``collecting``;
lower bound of ``r`` > margin → ``worse``; upper bound ≤ margin → ``within``; otherwise
``inconclusive``. A geometric mean moves with the whole distribution (a build 2.9× slower is
2.9× in every quantile); a slowdown only in the tail is the SLO test's to catch.

The step's verdict: any ``worse`` → **rollback**; every test ``within`` and the step at least
``min_step_s`` old → **promote**; the step older than ``max_step_s`` → **rollback** (not shown
safe in time); otherwise **hold**. A bare threshold on the canary's rate would roll back on noise at
small counts and miss a real difference at large ones; the bounds are what make a decision at
100 requests and at 100,000 mean the same.

Repeated looks: the guard looks at a growing sample every round, which raises the chance of a
false "worse" above ``1 − confidence``; ``min_requests`` and the margins keep it small, and a
step starts a fresh sample (docs/benchmarks.md measures the decisions on simulated canaries).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inferlb.config.rollout import RolloutCriteria
from inferlb.rollout.stats import LogMoments, diff_bounds, log_ratio_bounds, z_one_sided

__all__ = ["LATENCY_METRICS", "Check", "Counts", "Verdict", "compare", "compare_latency", "guard"]

LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e")
_LATENCY_NAMES = {"ttft": "time to first byte", "tpot": "time per output token", "e2e": "end-to-end time"}


@dataclass(frozen=True, slots=True)
class Counts:
    """One version's counts over a window."""

    attempts: int = 0
    failed: int = 0
    ok: int = 0                 # successful requests (the SLO test's trials)
    slo_missed: int = 0
    latency: dict[str, LogMoments] = field(default_factory=dict)   # metric → the node's times (window.py)

    def to_json(self) -> dict[str, Any]:
        # log_sum / log_sq unrounded: the decide step recomputes the bounds from this JSON.
        lat = {m: {"n": v.n, "log_sum": v.log_sum, "log_sq": v.log_sq,
                   "geomean_s": None if v.geomean is None else round(v.geomean, 6)} for m, v in self.latency.items()}
        return {"attempts": self.attempts, "failed": self.failed, "ok": self.ok, "slo_missed": self.slo_missed,
                "error_rate": round(self.failed / self.attempts, 6) if self.attempts else None,
                "slo_miss_rate": round(self.slo_missed / self.ok, 6) if self.ok else None, "latency": lat}


@dataclass(frozen=True, slots=True)
class Check:
    """One test's result."""

    test: str                   # errors | slo | latency_ttft | latency_tpot | latency_e2e
    status: str                 # collecting | worse | within | inconclusive
    canary: tuple[int, ...]     # proportions: (k, n); latency: (n,); the last is always the sample size
    baseline: tuple[int, ...]
    margin: float
    lower: float | None = None  # proportions: bounds of canary − baseline; latency: of the ratio canary / baseline
    upper: float | None = None
    estimate: float | None = None   # latency: the ratio of geometric means

    def to_json(self) -> dict[str, Any]:
        return {"test": self.test, "status": self.status, "canary": list(self.canary),
                "baseline": list(self.baseline), "margin": self.margin,
                "lower": None if self.lower is None else round(self.lower, 6),
                "upper": None if self.upper is None else round(self.upper, 6),
                "estimate": None if self.estimate is None else round(self.estimate, 6)}


@dataclass(frozen=True)
class Verdict:
    action: str                 # promote | hold | rollback
    reason: str
    checks: list[Check] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "reason": self.reason, "checks": [c.to_json() for c in self.checks]}


def compare(test: str, canary: tuple[int, int], baseline: tuple[int, int], *, margin: float, z: float,
            min_n: int) -> Check:
    """One test; ``canary`` / ``baseline`` are ``(k, n)``: bad outcomes, trials."""
    (k1, n1), (k2, n2) = canary, baseline
    if n1 < min_n or n2 < min_n:
        return Check(test, "collecting", canary, baseline, margin)
    lo, hi = diff_bounds(k1, n1, k2, n2, z)
    status = "worse" if lo > margin else "within" if hi <= margin else "inconclusive"
    return Check(test, status, canary, baseline, margin, lo, hi)


def compare_latency(metric: str, canary: LogMoments, baseline: LogMoments, *, max_ratio: float, confidence: float,
                    min_n: int) -> Check:
    """One latency metric's test (see the module docstring); ``test`` is ``latency_<metric>``."""
    test = f"latency_{metric}"
    if canary.n < max(2, min_n) or baseline.n < max(2, min_n):
        return Check(test, "collecting", (canary.n,), (baseline.n,), max_ratio)
    est, lo, hi = log_ratio_bounds(canary, baseline, confidence)
    status = "worse" if lo > max_ratio else "within" if hi <= max_ratio else "inconclusive"
    return Check(test, status, (canary.n,), (baseline.n,), max_ratio, lo, hi, est)


def _why_worse(c: Check, confidence: float) -> str:
    if c.test.startswith("latency_"):
        metric = c.test.removeprefix("latency_")
        return (f"{metric} ({_LATENCY_NAMES.get(metric, metric)} at the node) slower than the baseline: "
                f"{c.estimate:.2f}× its geometric mean, ≥ {c.lower:.2f}× at {confidence:g} confidence "
                f"(max_latency_ratio {c.margin:g}; {c.canary[-1]} canary, {c.baseline[-1]} baseline times)")
    what = "error rate" if c.test == "errors" else "SLO-miss rate"
    return (f"{what} worse than the baseline by more than {c.margin:g} "
            f"(difference ≥ {c.lower:.4f} at {confidence:g} confidence)")


def guard(canary: Counts, baseline: Counts, criteria: RolloutCriteria, *, slo: bool, step_age_s: float) -> Verdict:
    """The step's verdict (see the module docstring). ``slo``: run the SLO test."""
    z = z_one_sided(criteria.confidence)
    n = criteria.min_requests
    checks = [compare("errors", (canary.failed, canary.attempts), (baseline.failed, baseline.attempts),
                      margin=criteria.max_error_rate_increase, z=z, min_n=n)]
    if slo:
        checks.append(compare("slo", (canary.slo_missed, canary.ok), (baseline.slo_missed, baseline.ok),
                              margin=criteria.max_slo_miss_increase, z=z, min_n=n))
    if criteria.max_latency_ratio is not None:
        for metric in LATENCY_METRICS:
            c_t, b_t = canary.latency.get(metric, LogMoments()), baseline.latency.get(metric, LogMoments())
            if c_t.n or b_t.n:
                checks.append(compare_latency(metric, c_t, b_t, max_ratio=criteria.max_latency_ratio,
                                              confidence=criteria.confidence, min_n=n))
    worse = [c for c in checks if c.status == "worse"]
    if worse:
        return Verdict("rollback", "; ".join(_why_worse(c, criteria.confidence) for c in worse), checks)
    if all(c.status == "within" for c in checks):
        if step_age_s >= criteria.min_step_s:
            return Verdict("promote", f"no worse than the baseline within the margins at "
                                      f"{criteria.confidence:g} confidence", checks)
        return Verdict("hold", f"shown safe; the step is {step_age_s:.0f}s old (min_step_s {criteria.min_step_s:g})",
                       checks)
    if step_age_s >= criteria.max_step_s:
        return Verdict("rollback", f"not shown safe within max_step_s ({criteria.max_step_s:g}s)", checks)
    waiting = [c for c in checks if c.status != "within"]
    parts = [f"{c.test} {c.status}" + (f" ({c.canary[-1]}/{n} canary, {c.baseline[-1]}/{n} baseline)"
                                        if c.status == "collecting" else "") for c in waiting]
    return Verdict("hold", "; ".join(parts), checks)
