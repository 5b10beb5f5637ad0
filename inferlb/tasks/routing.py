"""``routing/select`` and ``routing/fallback``: adapters to the I/O-free routing core."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from inferlb.config.disaggregation import DisaggregationConfig
from inferlb.engine.endpoints import serves
from inferlb.engine.outcomes import fits_context, note_fallback
from inferlb.engine.scope import RequestScope
from inferlb.routing.disagg import pick_pair
from inferlb.routing.types import NodeView, RouteRequest
from inferlb.versions.table import Version

__all__ = ["fallback", "select"]


def select(scope: RequestScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads ``evaluation``; writes ``routing``. Nodes already tried for this request are skipped.

    Only the nodes of the request's model version are considered (``scope.version``). When none
    of them is up (every one unhealthy or already tried) and the version was assigned by weight
    (not pinned), the model's other versions that take traffic are tried, heaviest first, and the
    record's ``model_version`` becomes the one that serves: a canary whose nodes fail costs a
    retry, not the client's request. A version whose nodes are up but busy keeps its requests:
    sending its overflow elsewhere would give each version a different mix of requests (the long
    ones overflow first) and bias the comparison a canary rollout makes.

    The pick is the dispatch target (``scope.decision``; ``routing["node"]`` is the same name, for
    the process's conditions). Every decision is kept in the audit record (``decisions``), with
    the version it routed for."""
    rt = scope.rt
    ev = data["evaluation"]
    asked = (data.get("request") or {}).get("deadline_s")   # the client's own deadline, not the total timeout
    base = RouteRequest(
        model=scope.model,
        prompt_tokens=int(ev["prompt_tokens_est"]),
        output_tokens=int(ev.get("output_estimate", ev["output_budget"])),   # the predictor's estimate
        priority=ev.get("priority"),
        exclude=frozenset(scope.tried) | _not_serving(scope),
        stream=scope.record.stream,
        deadline_s=max(0.0, scope.deadline_at - rt.clock.monotonic()) if asked else None,
        prefix=scope.prefix,
        session=scope.session_key,
        selector=rt.fleet.models[scope.model].node_selector,
        adapter=_adapter(scope),
    )
    views = rt.fleet.views()
    version = scope.version
    kv = rt.kv
    if kv is not None and rt.router.prefix_blocks:
        # The engines' KV events (inferlb/kvevents): the blocks each candidate holds, or why not.
        only = version.nodes if version is not None else None
        names = [v.name for v in views if scope.model in v.models and v.healthy and v.name not in base.exclude
                 and (only is None or v.name in only)]
        hits, blocks, why = kv.route_inputs(scope.model, scope.prompt_text, names)
        base = replace(base, kv_hits=hits, kv_blocks=blocks, kv_fallback=why)
    mc = rt.fleet_cfg.model(scope.model) or rt.fleet.models.get(scope.model)
    if mc is not None and mc.disaggregation is not None:
        return _select_pair(scope, mc.disaggregation, replace(base, only=version.nodes, selector=version.selector)
                            if version is not None else base, views)
    scope.pair = None
    # A version's requirements are the model's node_selector joined with its own (versions/table.py).
    decision = rt.router.decide(replace(base, only=version.nodes, selector=version.selector,
                                        adapter=_adapter(scope, version))
                                if version is not None else base, views)
    switched_from = None
    if decision.pick is None and version is not None and not scope.version_pinned \
            and not _any_up(views, version.nodes, base.exclude):
        mv = rt.versions.get(scope.model)
        for alt in mv.alternatives(version.name) if mv is not None else ():
            d = rt.router.decide(replace(base, only=alt.nodes, selector=alt.selector,
                                         adapter=_adapter(scope, alt)), views)
            if d.pick is not None:
                switched_from, decision, version = scope.version, d, alt
                scope.version = alt
                break
    scope.decision = decision
    rec = scope.record
    rec.decision = decision.to_json()
    if version is not None:
        rec.model_version = version.name
    # One entry per decision; ``begin_attempt`` fills in the attempt it picked the node for.
    entry: dict[str, Any] = {"attempt": None, "model": scope.model, **rec.decision}
    if version is not None:
        entry["version"] = version.name
    if switched_from is not None:
        entry["version_fallback_from"] = switched_from.name
    if scope.tier is not None:   # a model alias's tier choice (tiers/router.py), in every decision
        entry["tier"] = scope.tier
    rec.decisions.append(entry)
    rec.routed_at = round(rt.clock.time(), 6)
    node = decision.pick
    if kv is not None and node is not None:
        kv.sent(node, base.kv_blocks)
    if node is None:
        reasons = sorted({f"{e.node}: {e.reason}" for e in decision.eliminated})
        return {"ok": False, "node": None, "model": scope.model, "ranked": [],
                "version": version.name if version is not None else None,
                "reason": "no node can serve: " + "; ".join(reasons) if reasons else "no node serves the model"}
    return {"ok": True, "node": node, "model": scope.model, "ranked": decision.ranked,
            "version": version.name if version is not None else None, "reason": "picked"}


def _select_pair(scope: RequestScope, cfg: DisaggregationConfig, req: RouteRequest, views: list[NodeView]
                 ) -> dict[str, Any]:
    """``select`` for a disaggregated model: a prefill node and a decode node (routing/disagg.py).
    The decode leg's decision is ``scope.decision`` (its pick answers the client, the dispatch
    target), the pair ``scope.pair`` (dispatch runs its prefill leg first); both legs' scores are
    in the audit decision. Only chat and completions are split; other endpoints go whole to a
    decode-capable node."""
    rt = scope.rt
    roles = {name: st.cfg.role for name, st in rt.fleet.nodes.items()}
    rng = getattr(rt.router, "rng", None) or rt.rng   # the router's, seeded by routing.seed
    pair = pick_pair(req, views, roles, rng=rng, min_prompt_tokens=cfg.min_prompt_tokens,
                     colocated_fallback=cfg.colocated_fallback,
                     colocated=scope.record.endpoint not in ("chat", "completions"))
    scope.pair = pair
    scope.decision = pair.decode
    rec = scope.record
    rec.decision = pair.to_json()
    if scope.version is not None:
        rec.model_version = scope.version.name
    entry: dict[str, Any] = {"attempt": None, "model": scope.model, **rec.decision}
    if scope.version is not None:
        entry["version"] = scope.version.name
    rec.decisions.append(entry)
    rec.routed_at = round(rt.clock.time(), 6)
    version = scope.version.name if scope.version is not None else None
    node = pair.decode_node
    if node is None:
        reasons = sorted({f"{e.node}: {e.reason}" for e in pair.decode.eliminated})
        why = pair.reason + (": " + "; ".join(reasons) if reasons else "")
        return {"ok": False, "node": None, "model": scope.model, "ranked": [], "version": version,
                "reason": "no node can serve: " + why}
    return {"ok": True, "node": node, "model": scope.model, "ranked": pair.decode.ranked, "version": version,
            "reason": f"picked: prefill {pair.prefill_node}, decode {node}" if pair.prefill_node is not None
            else f"picked: {node} serves it whole ({pair.reason})"}


def _adapter(scope: RequestScope, version: Version | None = None) -> str | None:
    """The LoRA adapter the request names on the node (config/lora.py): the name the node is
    asked for under ``version`` (default: the scope's), when the model is served as an adapter."""
    model = scope.rt.fleet.models[scope.model]
    if model.lora is None:
        return None
    return scope.upstream_model_for(version if version is not None else scope.version)


def _any_up(views: list[NodeView], nodes: frozenset[str], exclude: frozenset[str]) -> bool:
    """Whether one of ``nodes`` is healthy and not excluded (busy or not)."""
    return any(v.healthy and v.name in nodes and v.name not in exclude for v in views)


def _not_serving(scope: RequestScope) -> frozenset[str]:
    """Nodes whose kind does not serve the request's endpoint (only the Responses API is partial)."""
    endpoint = scope.record.endpoint
    if endpoint != "responses":
        return frozenset()
    return frozenset(n.name for n in scope.rt.fleet_cfg.nodes if not serves(endpoint, n.kind))


def fallback(scope: RequestScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads the model config's ``fallbacks``, ``request``, ``routing`` and ``outcome``; writes
    ``fallback``. Never past the attempt limit or the deadline; a fallback model whose context or
    output limit does not fit the request is skipped. The move and its reason (no node could
    serve, or the last attempt's error class) go to the audit row (``note_fallback``)."""
    rt = scope.rt
    if scope.attempts >= scope.max_attempts:
        return {"ok": False, "model": None, "reason": f"{scope.attempts} attempts made (max {scope.max_attempts})"}
    if rt.clock.monotonic() >= scope.deadline_at:
        return {"ok": False, "model": None, "reason": "deadline passed"}
    origin = rt.fleet.models[scope.models_tried[0]]
    req = data.get("request") or {}
    endpoint = scope.record.endpoint
    routing = data.get("routing") or {}
    outcome = data.get("outcome") or {}
    why = "no_node" if not routing.get("ok", True) else f"failed: {outcome.get('error_class') or outcome.get('kind')}"
    came_from = scope.model
    for name in origin.fallbacks:
        if name not in scope.models_tried:
            scope.models_tried.append(name)
            prompt_est = rt.estimator.estimate(name, int(req.get("prompt_bytes") or 0), scope.prompt_text, endpoint)
            if not fits_context(rt.fleet.models[name], endpoint, prompt_est, req.get("max_tokens")):
                continue
            note_fallback(scope, name, why)
            scope.model = name
            # The fallback model's own version, sticky for the same user; a pin named the first model.
            v = rt.versions.assign(name, scope.tenant, scope.user, scope.record.request_id)
            scope.version, scope.version_pinned = v, False
            scope.record.model_version = v.name if v is not None else rt.fleet.models[name].version
            return {"ok": True, "model": name, "reason": f"falling back from {came_from}"}
    return {"ok": False, "model": None, "reason": "no fallback model left"}
