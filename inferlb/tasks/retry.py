"""``retry/backoff``: Envoy-style full-jitter exponential backoff within limits and the retry budget.

For retry number N (1-based) the delay is uniform in [0, min(cap, (2^N − 1) · base)); Envoy's
defaults are base 25 ms and cap 250 ms. No retry when the outcome is not retryable, when
``max_attempts`` attempts were made, when the delay would end past the request deadline (the
deadline includes every attempt and every wait, as Envoy's route timeout does), or when the
admission controller refuses it: the model pool's retry budget (retries ≤ 10 % of requests over
a sliding window, with a small floor) is spent, or the pool is saturated and the request's
priority class gives up retries under saturation. A refused retry also caps the request's
attempts where they are, so ``routing/fallback`` does not turn it into another attempt: over a
total outage backend attempts ÷ client requests stay ≤ 1.1 (docs/reliability.md B3). When no untried
node of the model takes traffic, there is nothing to retry on: no retry, and the budget is not
spent (``routing/fallback`` may still switch model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferlb.engine.endpoints import serves
from inferlb.engine.scope import RequestScope

__all__ = ["backoff", "backoff_delay"]


def backoff_delay(retry_number: int, base_s: float, cap_s: float, u: float) -> float:
    """Delay for retry ``retry_number`` given a uniform draw ``u`` in [0, 1)."""
    return float(u * min(cap_s, (2**retry_number - 1) * base_s))


def _another_node(scope: RequestScope) -> bool:
    """True when a node of the current model that this request has not tried takes traffic now."""
    fleet = scope.rt.fleet
    tried = scope.tried
    endpoint = scope.record.endpoint
    for name in fleet.serving.get(scope.model, ()):
        st = fleet.nodes[name]
        if name not in tried and serves(endpoint, st.cfg.kind) and fleet.available(st, fleet.clock.monotonic()):
            return True
    return False


def backoff(scope: RequestScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads ``outcome``, ``evaluation`` (its priority); param ``max_attempts``; writes ``retry``."""
    rt = scope.rt
    policy = rt.fleet_cfg.retry
    max_attempts = int(params.get("max_attempts", policy.max_attempts))
    if max_attempts < 1:
        raise ValueError("max_attempts must be ≥ 1")
    scope.max_attempts = max_attempts
    attempt = scope.attempts
    outcome = data.get("outcome") or {}
    if outcome.get("kind") != "retryable":
        return {"retry": False, "delay_s": 0.0, "attempt": attempt, "reason": "not retryable"}
    if attempt >= max_attempts:
        return {"retry": False, "delay_s": 0.0, "attempt": attempt,
                "reason": f"{attempt} attempts made (max {max_attempts})"}
    if not _another_node(scope):
        # Nothing left to retry on: say so without spending the pool's retry budget.
        return {"retry": False, "delay_s": 0.0, "attempt": attempt, "reason": "no other available node"}
    delay = round(backoff_delay(attempt, policy.base_backoff_s, policy.max_backoff_s, rt.rng.random()), 6)
    if rt.clock.monotonic() + delay >= scope.deadline_at:
        return {"retry": False, "delay_s": 0.0, "attempt": attempt, "reason": "deadline would pass"}
    allowed, why = rt.admission.retry_allowed(scope, (data.get("evaluation") or {}).get("priority"))
    if not allowed:
        scope.max_attempts = attempt
        return {"retry": False, "delay_s": 0.0, "attempt": attempt, "reason": why}
    return {"retry": True, "delay_s": delay, "attempt": attempt, "reason": f"retry {attempt} after {delay}s"}
