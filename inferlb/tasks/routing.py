"""``routing/select`` and ``routing/fallback``: adapters to the I/O-free routing core."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferlb.engine.endpoints import serves
from inferlb.engine.routing import RouteRequest
from inferlb.engine.scope import RequestScope

__all__ = ["fallback", "select"]


def select(scope: RequestScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads ``evaluation``; writes ``routing``. Nodes already tried for this request are skipped.

    The pick is the dispatch target (``scope.decision``; ``routing["node"]`` is the same name, for
    the process's conditions). Every decision is kept in the audit record (``decisions``)."""
    rt = scope.rt
    ev = data["evaluation"]
    asked = (data.get("request") or {}).get("deadline_s")   # the client's own deadline, not the total timeout
    req = RouteRequest(
        model=scope.model,
        prompt_tokens=int(ev["prompt_tokens_est"]),
        output_tokens=int(ev["output_budget"]),
        priority=ev.get("priority"),
        exclude=frozenset(scope.tried) | _not_serving(scope),
        stream=scope.record.stream,
        deadline_s=max(0.0, scope.deadline_at - rt.clock.monotonic()) if asked else None,
        prefix=scope.prefix,
        session=scope.session_key,
        selector=rt.fleet.models[scope.model].node_selector,
    )
    decision = rt.router.decide(req, rt.fleet.views())
    scope.decision = decision
    rec = scope.record
    rec.decision = decision.to_json()
    # One entry per decision; ``begin_attempt`` fills in the attempt it picked the node for.
    rec.decisions.append({"attempt": None, "model": scope.model, **rec.decision})
    rec.routed_at = round(rt.clock.time(), 6)
    node = decision.pick
    if node is None:
        reasons = sorted({f"{e.node}: {e.reason}" for e in decision.eliminated})
        return {"ok": False, "node": None, "model": scope.model, "ranked": [],
                "reason": "no node can serve: " + "; ".join(reasons) if reasons else "no node serves the model"}
    return {"ok": True, "node": node, "model": scope.model, "ranked": decision.ranked, "reason": "picked"}


def _not_serving(scope: RequestScope) -> frozenset[str]:
    """Nodes whose kind does not serve the request's endpoint (only the Responses API is partial)."""
    endpoint = scope.record.endpoint
    if endpoint != "responses":
        return frozenset()
    return frozenset(n.name for n in scope.rt.fleet_cfg.nodes if not serves(endpoint, n.kind))


def fallback(scope: RequestScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads the model config's ``fallbacks``; writes ``fallback``. Never past the attempt limit
    or the deadline."""
    rt = scope.rt
    if scope.attempts >= scope.max_attempts:
        return {"ok": False, "model": None, "reason": f"{scope.attempts} attempts made (max {scope.max_attempts})"}
    if rt.clock.monotonic() >= scope.deadline_at:
        return {"ok": False, "model": None, "reason": "deadline passed"}
    origin = rt.fleet.models[scope.models_tried[0]]
    for name in origin.fallbacks:
        if name not in scope.models_tried:
            scope.models_tried.append(name)
            scope.model = name
            scope.record.model_served = name
            return {"ok": True, "model": name, "reason": f"falling back from {scope.models_tried[-2]}"}
    return {"ok": False, "model": None, "reason": "no fallback model left"}
