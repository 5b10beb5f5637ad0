"""A live change of the routing policy, gated by an off-policy evaluation of the audit trail.

When the running config or the new one has ``routing.require_evaluation`` (routing/gate.py) and
a reload changes the routing policy (anything under ``routing:`` but the requirement itself),
:func:`gate_routing_change` runs before the swap (live/manager.py, under its lock, nothing changed
yet): it reads the attempts of the learned decisions of the last ``since`` from the audit trail
(learned/audit.py; a failed attempt costs ``failure_cost_s``), replays them under the new
routing and the current one exactly as configured (profile, scorers, params: the same code as
``inferlb routing evaluate``), and judges (routing/gate.py). Either way the outcome is a node event
(node ``routing:policy``, ``accepted`` / ``refused``, the estimates as evidence) and a log line;
refused, the reload fails with 409 ``evaluation_failed`` and the old policy keeps serving. The
audit trail unreadable is a 503 ``evaluation_unavailable``: a gate that cannot look does not pass,
except toward a fixed heuristic profile (routing/gate.py :func:`~inferlb.routing.gate.fixed_heuristic`):
that change, the safe direction, is always accepted, with the evaluation (or why there was none)
reported in its event.

Why at reload and not as a rollout: a canary rollout (rollout) moves traffic between
*model versions* through the version table; the routing policy is one per gateway (one router in
the snapshot), with no per-request split to canary on. So the evaluation gates the switch itself.

Which requirement applies: the new config's when it has one, else the running one's, so removing
the requirement in the same reload as the policy change does not skip it (reload once with the
requirement removed and the policy unchanged to turn it off).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy.engine import Engine

from inferlb.config.settings import RoutingConfig
from inferlb.errors import StoreError
from inferlb.learned.audit import LearnedAttempt, learned_attempts
from inferlb.node_types import NodeEvent
from inferlb.routing.gate import EvaluationRequirement, fixed_heuristic, judge
from inferlb.routing.ope_replay import LoggedDecision
from inferlb.routing.profiles import Router

__all__ = ["EVENT_NODE", "gate_routing_change", "logged_decisions", "requirement_for", "reward_of",
           "routing_changed", "verdict_event"]

log = logging.getLogger("inferlb.policy")

EVENT_NODE = "routing:policy"


def reward_of(a: LearnedAttempt, metric: str, failure_cost_s: float) -> float | None:
    """The cost of one attempt: its e2e (or streamed TTFT) seconds; a failure costs ``failure_cost_s``."""
    if a.outcome != "ok":
        return failure_cost_s
    if metric == "ttft":
        return a.ttfb_s if a.stream else None
    return a.e2e_s


def logged_decisions(rows: Iterable[LearnedAttempt], metric: str, failure_cost_s: float) -> list[LoggedDecision]:
    """The logged decisions off-policy evaluation replays, each with its attempt's cost."""
    out = []
    for a in rows:
        r = reward_of(a, metric, failure_cost_s)
        if r is not None:
            out.append(LoggedDecision(a.model, a.learned, r))
    return out


def _policy(r: RoutingConfig) -> RoutingConfig:
    return r.model_copy(update={"require_evaluation": None})


def routing_changed(old: RoutingConfig, new: RoutingConfig) -> bool:
    """Whether the routing *policy* differs (the evaluation requirement itself does not count)."""
    return _policy(old) != _policy(new)


def requirement_for(old: RoutingConfig, new: RoutingConfig) -> EvaluationRequirement | None:
    """The requirement a change from ``old`` to ``new`` must pass (module docstring), or None."""
    return new.require_evaluation or old.require_evaluation


def router_of(r: RoutingConfig) -> Router:
    """A fresh router of ``r`` for replay (never the live one: replay binds its scorers)."""
    return r.build_router()


def gate_routing_change(engine: Engine | None, old: RoutingConfig, new: RoutingConfig, req: EvaluationRequirement,
                        *, current_logged: bool, now: float) -> dict[str, Any]:
    """Read the audit trail and judge the change (synchronous: call it in a thread): the verdict
    (routing/gate.py :func:`judge`) with ``from`` / ``to`` (the profiles) and ``decisions_read``.
    StoreError when the audit trail cannot be read (``engine`` None: there is none), except for a
    change to a fixed heuristic profile (routing/gate.py :func:`fixed_heuristic`), the safe
    direction, which is never blocked: its verdict passes and says why nothing was evaluated."""
    candidate = router_of(new)
    try:
        if engine is None:
            raise StoreError("no audit database")
        rows = learned_attempts(engine, since=now - req.since_s, limit=req.limit)
    except StoreError as exc:
        if not fixed_heuristic(candidate):
            raise
        return {"passed": True, "safe_direction": True, "evaluation_passed": False, "from": old.profile,
                "to": new.profile, "decisions_read": 0, "requirement": req.model_dump(),
                "reason": (f"{new.profile} is a fixed heuristic profile, the safe direction, so the change is "
                           f"allowed without an evaluation: the audit trail cannot be read ({exc})")}
    decisions = logged_decisions(rows, req.metric, req.failure_cost_s)
    verdict = judge(decisions, candidate, router_of(old), req, current_logged=current_logged)
    verdict.update({"from": old.profile, "to": new.profile, "decisions_read": len(rows)})
    return verdict


def verdict_event(verdict: Mapping[str, Any], *, at: float, actor: Mapping[str, Any]) -> NodeEvent:
    """The node event that records a gate's outcome (``accepted`` / ``refused``)."""
    outcome = "accepted" if verdict.get("passed") else "refused"
    text = f"routing change {verdict.get('from')} → {verdict.get('to')} {outcome}: {verdict.get('reason')}"
    # An accepted change the evaluation alone would have refused (the safe direction) is worth a look too.
    (log.info if outcome == "accepted" and verdict.get("evaluation_passed", True) else log.warning)(text)
    evidence = {k: verdict[k] for k in ("from", "to", "estimator", "candidate", "baseline", "bound", "upper",
                                        "safe_direction", "evaluation_passed", "decisions_read", "requirement")
                if k in verdict}
    return NodeEvent(EVENT_NODE, str(verdict.get("from")), outcome, text, round(at, 6), {**evidence, **actor})
