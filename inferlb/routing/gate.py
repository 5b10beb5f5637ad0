"""A routing-policy change gated by off-policy evaluation: the requirement and the judgement.

``routing.require_evaluation`` in the fleet file (:class:`EvaluationRequirement`) asks that a
change of routing policy applied while the gateway runs (a reload, live/manager.py) first pass an
off-policy evaluation (routing/ope_replay.py) on the audit trail's logged learned decisions of
the last ``since``. :func:`judge` decides, on costs (seconds, lower is better):

* the **candidate**'s estimate by ``estimator`` (self-normalised IPS by default: the steadiest in
  docs/benchmarks.md, "Learned routing: the interference objective and OPE with overlap");
  ``switch_dr`` (DR that drops the importance-weighted correction of rounds whose weight is past
  routing/ope.py's ``SWITCH_TAU``) is accepted too; docs/benchmarks.md ("prefill interference, and
  SWITCH-DR") found it no better than DR at high load, so it is not the default;
  refused when the effective sample size is below ``min_ess`` (the log rarely agrees with it) or
  when there is nothing to evaluate on;
* the **baseline**: the current policy. When it is the policy that logged the decisions (it
  learns, so its decisions carry propensities), what it *measured* on those decisions; otherwise
  its own estimate on the same decisions, by the same estimator (refused like the candidate's);
* **passed** when candidate ≤ baseline × (1 + ``max_regression``); otherwise refused, saying by
  how much it is worse.

A log whose policy reserved capacity (the learned profile's tail reservation: its decisions carry
``reserve``) shaped what later requests found on the nodes, which per-decision OPE assumes a
policy does not do; estimates of *other* policies from it read low (22–26 % in docs/benchmarks.md,
"sixth pass"). The judgement then carries a ``caveats`` entry saying so (and a passing one's
reason sentence ends with it), so an operator reads an accepted switch away from such a policy with that bias in mind.

Pure: the caller reads the audit trail and records the outcome (learned/policy_gate.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferlb.routing.profiles import Router

if TYPE_CHECKING:
    from inferlb.routing.ope_replay import LoggedDecision

__all__ = ["EvaluationRequirement", "judge", "span_seconds"]

_SPAN = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def span_seconds(text: str | float) -> float:
    """``30m``, ``24h``, ``7d``, ``90s`` or a number of seconds, as seconds (ValueError otherwise)."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _SPAN.fullmatch(str(text))
        if m is None:
            raise ValueError(f"{text!r} is not a time span (e.g. 30m, 24h, 7d, or seconds)")
        value = float(m.group(1)) * _UNIT[m.group(2)]
    if not 0 < value <= 366 * 86400:
        raise ValueError(f"{text!r}: a span must be more than 0 and at most a year")
    return value


class EvaluationRequirement(BaseModel):
    """``routing.require_evaluation``: what a live routing-policy change must pass (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_ess: float = Field(100.0, ge=1)                   # below this effective sample size: refused
    max_regression: float = Field(0.05, ge=0, le=10)      # the candidate may cost at most this much more
    since: str = "24h"                                    # how far back the logged decisions are read
    estimator: Literal["snips", "dr", "ips", "switch_dr"] = "snips"
    metric: Literal["e2e", "ttft"] = "e2e"
    failure_cost_s: float = Field(30.0, gt=0)             # the cost of a failed attempt
    limit: int = Field(20_000, ge=10, le=1_000_000)       # the most recent decisions read
    bootstrap: int = Field(200, ge=10, le=10_000)         # resamples of the confidence intervals
    seed: int = 0

    @field_validator("since", mode="before")
    @classmethod
    def _since(cls, v: Any) -> str:
        span_seconds(v)
        return str(v)

    @property
    def since_s(self) -> float:
        return span_seconds(self.since)


def _summary(est: dict[str, Any], key: str) -> dict[str, Any]:
    out: dict[str, Any] = {k: est[k] for k in ("policy", "n", "ess", "skipped", "logged") if k in est}
    if key in est:
        out["estimate"] = est[key]
    for k in ("refused", "error"):
        if k in est:
            out[k] = est[k]
    return out


def _caveats(decisions: Sequence[LoggedDecision]) -> list[str]:
    """What biases an estimate from ``decisions`` that the estimate itself cannot show."""
    reserving = sum(1 for d in decisions if d.learned.get("reserve"))
    if not reserving:
        return []
    return [f"{reserving} of {len(decisions)} logged decisions were made by a policy that reserves fast-node "
            "capacity for long outputs, which changes what later requests meet; estimates of policies that "
            "do not reserve read low (docs/benchmarks.md, 'sixth pass')"]


def judge(decisions: Sequence[LoggedDecision], candidate: str | Router, current: str | Router,
          req: EvaluationRequirement, *, current_logged: bool) -> dict[str, Any]:
    """Whether switching from ``current`` to ``candidate`` passes ``req`` on ``decisions``
    (``current_logged``: the current policy is the one that logged them). Returns JSON: ``passed``,
    ``reason`` (one sentence), ``candidate`` and ``baseline`` (estimates or what was measured,
    ESS, decisions used), ``requirement``. Never raises for want of data: that is a refusal."""
    # Here, not at the top: the fleet file's schema imports this module, and numpy need not load for it.
    from inferlb.routing.ope_replay import evaluate

    est = req.estimator
    common: dict[str, Any] = {"metric": req.metric, "n_boot": req.bootstrap, "seed": req.seed,
                              "min_ess": req.min_ess}
    cand = evaluate(decisions, candidate, **common)
    name = cand["policy"]
    out: dict[str, Any] = {"passed": False, "candidate": _summary(cand, est), "estimator": est,
                           "requirement": req.model_dump(), "decisions": len(decisions)}
    unit = f"mean {req.metric} cost per decision"
    caveats = _caveats(decisions)
    if caveats:
        out["caveats"] = caveats
    if "error" in cand:
        out["reason"] = f"no evaluation of {name}: {cand['error']}"
        return out
    if "refused" in cand:
        out["reason"] = f"the evaluation of {name} was refused: {cand['refused']}"
        return out
    value = float(cand[est]["value"])
    if current_logged:
        base_name = current if isinstance(current, str) else current.name
        base = float(cand["logged"])
        out["baseline"] = {"policy": base_name, "how": "measured on the logged decisions", "value": base,
                           "n": cand["n"]}
    else:
        cur = evaluate(decisions, current, **common)
        base_name = cur["policy"]
        out["baseline"] = {**_summary(cur, est), "how": f"estimated by {est}"}
        if "error" in cur or "refused" in cur:
            why = cur.get("refused") or cur.get("error")
            out["reason"] = (f"the current policy {base_name} cannot be estimated on the same decisions ({why}), "
                             f"so {name} cannot be compared with it")
            return out
        base = float(cur[est]["value"])
        out["baseline"]["value"] = base
    bound = base * (1.0 + req.max_regression)
    out["bound"] = bound
    if value > bound:
        worse = (value / base - 1.0) * 100.0 if base > 0 else float("inf")
        out["reason"] = (f"{name} is estimated worse than {base_name}: {unit} {value:.4f} s vs {base:.4f} s "
                         f"({worse:+.1f} %, more than the {req.max_regression * 100:g} % allowed; {est}, "
                         f"{cand['n']} decisions, effective sample size {cand['ess']:.0f})")
        return out
    out["passed"] = True
    out["reason"] = (f"{name} passed: {unit} {value:.4f} s vs {base_name}'s {base:.4f} s, within "
                     f"{req.max_regression * 100:g} % ({est}, {cand['n']} decisions, effective sample size "
                     f"{cand['ess']:.0f})")
    if caveats:
        out["reason"] += "; caveat: " + "; ".join(caveats)
    return out
