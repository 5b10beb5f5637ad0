"""The statistical guard of a canary step: promote, hold or roll back. Pure.

Two tests compare the canary (the new version) with the baseline (the old one) over the same
window:

* **errors**: failed attempts / attempts. An attempt fails when its node answered 5xx, timed
  out, reset, or broke the stream; a 429 (busy) or another 4xx (the request's own fault) counts
  as neither, and nor does a client that went away.
* **SLO misses**: successful requests over the SLO (``ttft_max_s`` for streams, ``e2e_max_s``) /
  successful requests. Runs only when an SLO is known.

For each test, with ``z`` the one-sided quantile of ``confidence`` and ``d = p_canary − p_baseline``
bounded by Newcombe's interval (:func:`~.stats.diff_bounds`):

* fewer than ``min_requests`` on either side → ``collecting``;
* lower bound of ``d`` > margin → ``worse``: the canary is worse by more than allowed;
* upper bound of ``d`` ≤ margin → ``within``: it is no worse than allowed;
* otherwise ``inconclusive``.

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
from inferlb.rollout.stats import diff_bounds, z_one_sided

__all__ = ["Check", "Counts", "Verdict", "compare", "guard"]


@dataclass(frozen=True, slots=True)
class Counts:
    """One version's counts over a window."""

    attempts: int = 0
    failed: int = 0
    ok: int = 0                 # successful requests (the SLO test's trials)
    slo_missed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"attempts": self.attempts, "failed": self.failed, "ok": self.ok, "slo_missed": self.slo_missed,
                "error_rate": round(self.failed / self.attempts, 6) if self.attempts else None,
                "slo_miss_rate": round(self.slo_missed / self.ok, 6) if self.ok else None}


@dataclass(frozen=True, slots=True)
class Check:
    """One test's result."""

    test: str                   # errors | slo
    status: str                 # collecting | worse | within | inconclusive
    canary: tuple[int, int]     # (k, n)
    baseline: tuple[int, int]
    margin: float
    lower: float | None = None  # bounds of canary − baseline
    upper: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"test": self.test, "status": self.status, "canary": list(self.canary),
                "baseline": list(self.baseline), "margin": self.margin,
                "lower": None if self.lower is None else round(self.lower, 6),
                "upper": None if self.upper is None else round(self.upper, 6)}


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


def guard(canary: Counts, baseline: Counts, criteria: RolloutCriteria, *, slo: bool, step_age_s: float) -> Verdict:
    """The step's verdict (see the module docstring). ``slo``: run the SLO test."""
    z = z_one_sided(criteria.confidence)
    n = criteria.min_requests
    checks = [compare("errors", (canary.failed, canary.attempts), (baseline.failed, baseline.attempts),
                      margin=criteria.max_error_rate_increase, z=z, min_n=n)]
    if slo:
        checks.append(compare("slo", (canary.slo_missed, canary.ok), (baseline.slo_missed, baseline.ok),
                              margin=criteria.max_slo_miss_increase, z=z, min_n=n))
    worse = [c for c in checks if c.status == "worse"]
    if worse:
        c = worse[0]
        what = "error rate" if c.test == "errors" else "SLO-miss rate"
        return Verdict("rollback", f"{what} worse than the baseline by more than {c.margin:g} "
                                   f"(difference ≥ {c.lower:.4f} at {criteria.confidence:g} confidence)", checks)
    if all(c.status == "within" for c in checks):
        if step_age_s >= criteria.min_step_s:
            return Verdict("promote", f"no worse than the baseline within the margins at "
                                      f"{criteria.confidence:g} confidence", checks)
        return Verdict("hold", f"shown safe; the step is {step_age_s:.0f}s old (min_step_s {criteria.min_step_s:g})",
                       checks)
    if step_age_s >= criteria.max_step_s:
        return Verdict("rollback", f"not shown safe within max_step_s ({criteria.max_step_s:g}s)", checks)
    waiting = [c for c in checks if c.status != "within"]
    parts = [f"{c.test} {c.status}" + (f" ({c.canary[1]}/{n} canary, {c.baseline[1]}/{n} baseline)"
                                        if c.status == "collecting" else "") for c in waiting]
    return Verdict("hold", "; ".join(parts), checks)
