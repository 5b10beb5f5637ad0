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
* **passed** only when the *upper end of the 95 % bootstrap interval* (routing/ope.py) is at most
  baseline × (1 + ``max_regression``): the change must be shown to cost at most that much more,
  not merely estimated so (a point estimate of +4.7 % whose interval reaches +11.5 % does not pass
  a 5 % margin). Against a baseline measured on the log, the interval is that of the ratio
  candidate ÷ measured on the same resampled decisions (``vs_logged``, paired: a candidate that
  decides as the logging policy did has the ratio 1 in every resample and passes any margin);
  against an estimated baseline, the candidate's own interval against the baseline's estimate
  (unpaired, so conservative: it needs a margin of about the interval's half-width). Otherwise
  refused, saying the point estimate, how far the interval reaches and the margin allowed;
* **the safe direction**: a change *to a fixed heuristic profile* (:func:`fixed_heuristic`: a
  built-in profile of :data:`~inferlb.routing.profiles.PROFILES` that does not learn, i.e. has no
  latency predictor: token-aware, least-connections, round-robin, power-of-two, weighted,
  prefix-affinity; with the profile's own filters, scorers and picker, params allowed) always
  passes. It is evaluated all the same and the verdict reports it (``evaluation_passed``, the
  estimates, the reason the evaluation alone would give), but it never blocks: leaving a learned
  policy for a fixed one must stay possible, also when the logged decisions hardly overlap the
  heuristic (a deterministic profile mostly disagrees with an exploring log, so its effective
  sample size is small) or there is no log at all.

A log whose policy reserved capacity (the learned profile's tail reservation: its decisions carry
``reserve``) shaped what later requests found on the nodes, which per-decision OPE assumes a
policy does not do; estimates of *other* policies from it read low (22–26 % in docs/benchmarks.md,
"sixth pass"). The judgement then carries a ``caveats`` entry saying so (and a passing one's
reason sentence ends with it), so an operator reads an accepted switch away from such a policy with that bias in mind.

Pure: the caller reads the audit trail and records the outcome (learned/policy_gate.py).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferlb.routing.profiles import PROFILES, Router

if TYPE_CHECKING:
    from inferlb.routing.ope_replay import LoggedDecision

__all__ = ["EvaluationRequirement", "fixed_heuristic", "fixed_heuristic_profiles", "judge", "span_seconds"]

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
    max_regression: float = Field(0.05, ge=0, le=10)      # its 95 % interval may reach at most this much more
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


@functools.cache
def fixed_heuristic_profiles() -> frozenset[str]:
    """The built-in profiles that do not learn: those whose router has no latency predictor
    (``build_router`` gives a plain :class:`Router`, not a guarded one with a ``lifecycle``).
    Computed from :data:`PROFILES`, so a new learning profile is never counted as safe by mistake."""
    from inferlb.routing.profiles import build_router

    return frozenset(name for name in PROFILES if getattr(build_router(name), "lifecycle", None) is None)


def fixed_heuristic(policy: str | Router) -> bool:
    """Whether ``policy`` is a fixed heuristic profile (module docstring): a name of
    :func:`fixed_heuristic_profiles`, or a router of one built with that profile's own filters,
    scorers (and weights) and picker. A profile given other scorers or another picker is not."""
    if isinstance(policy, str):
        return policy in fixed_heuristic_profiles()
    spec = PROFILES.get(policy.name)
    if policy.name not in fixed_heuristic_profiles() or spec is None or getattr(policy, "lifecycle", None):
        return False
    return (tuple(f.type_name for f in policy.filters) == spec.filters
            and {s.type_name: w for s, w in policy.scorers} == spec.scorers
            and len(policy.scorers) == len(spec.scorers)
            and policy.picker.type_name == spec.picker)


def judge(decisions: Sequence[LoggedDecision], candidate: str | Router, current: str | Router,
          req: EvaluationRequirement, *, current_logged: bool) -> dict[str, Any]:
    """Whether switching from ``current`` to ``candidate`` passes ``req`` on ``decisions``
    (``current_logged``: the current policy is the one that logged them). Returns JSON: ``passed``,
    ``reason`` (one sentence), ``candidate`` and ``baseline`` (estimates or what was measured,
    ESS, decisions used), ``bound`` (the most the candidate may cost), ``upper`` (the upper end of
    its interval), ``requirement``; for a fixed heuristic candidate also ``safe_direction``: true
    and ``evaluation_passed`` (what the evaluation alone says; ``passed`` is true regardless).
    Never raises for want of data: that is a refusal, or for the safe direction a report."""
    out = _evaluate(decisions, candidate, current, req, current_logged=current_logged)
    if fixed_heuristic(candidate):
        name = out["candidate"].get("policy", candidate if isinstance(candidate, str) else candidate.name)
        out["safe_direction"] = True
        out["evaluation_passed"] = bool(out["passed"])
        out["passed"] = True
        said = "passed" if out["evaluation_passed"] else "would refuse it"
        out["reason"] = (f"{name} is a fixed heuristic profile, the safe direction, so the change is allowed "
                         f"whatever the evaluation says; the evaluation {said}: {out['reason']}")
    return out


def _evaluate(decisions: Sequence[LoggedDecision], candidate: str | Router, current: str | Router,
              req: EvaluationRequirement, *, current_logged: bool) -> dict[str, Any]:
    """The evaluation itself (:func:`judge` without the safe direction)."""
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
    if current_logged:   # paired with what the logging policy measured on the same resampled rounds
        high = base * float((cand.get("vs_logged") or {}).get(est, {}).get("ci_high", math.nan))
        interval = "95 % interval (paired with what it measured)"
    else:                # the candidate's own interval against the baseline's estimate
        high = float(cand[est].get("ci_high", math.nan))
        interval = "95 % interval"
    out["bound"] = bound
    out["upper"] = high

    def rel(x: float) -> float:
        return (x / base - 1.0) * 100.0 if base > 0 else math.inf

    tail = f"{est}, {cand['n']} decisions, effective sample size {cand['ess']:.0f}"
    allowed = f"{req.max_regression * 100:g} %"
    if not math.isfinite(high):
        out["reason"] = f"{name} cannot be judged: its estimate has no confidence interval ({tail})"
        return out
    if value > bound:
        out["reason"] = (f"{name} is estimated worse than {base_name}: {unit} {value:.4f} s vs {base:.4f} s "
                         f"({rel(value):+.1f} %, more than the {allowed} allowed; its {interval} reaches "
                         f"{high:.4f} s, {rel(high):+.1f} %; {tail})")
        return out
    if high > bound:
        out["reason"] = (f"{name} is not shown within {allowed} of {base_name}: {unit} {value:.4f} s vs "
                         f"{base:.4f} s ({rel(value):+.1f} %), but its {interval} reaches {high:.4f} s "
                         f"({rel(high):+.1f} %), more than the {allowed} allowed ({tail})")
        return out
    out["passed"] = True
    out["reason"] = (f"{name} passed: {unit} {value:.4f} s vs {base_name}'s {base:.4f} s ({rel(value):+.1f} %), "
                     f"its {interval} up to {high:.4f} s ({rel(high):+.1f} %), within {allowed} ({tail})")
    if caveats:
        out["reason"] += "; caveat: " + "; ".join(caveats)
    return out
