"""``request/evaluate``: the model and its version (their rules in :mod:`inferlb.engine.outcomes`),
the tier of a model alias (tiers/router.py), token estimate, output budget, priority, deadline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferlb.config.settings import ModelConfig
from inferlb.engine.outcomes import (
    check_context,
    check_model,
    check_version,
    context_fallback,
    fits_context,
    note_fallback,
)
from inferlb.engine.scope import RequestScope
from inferlb.tiers.router import TierRouter

__all__ = ["evaluate"]

DEFAULT_PRIORITY = "standard"


def evaluate(scope: RequestScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads ``request``; writes ``evaluation`` (see processes/README.md).

    The output budget and the deadline are computed here only: admission (TPM), the gateway's
    timeouts and the context check use ``evaluation["output_budget"]`` / ``scope.output_budget``
    (the declared ``max_tokens``, else the model's ``default_max_tokens``) and ``scope.deadline_at``,
    also after a fallback to another model; the audit row keeps the deadline. Routing and the
    node's load use ``evaluation["output_estimate"]`` / ``scope.output_estimate``: the output-length
    predictor's estimate (``rt.lengths``, never above the budget; the budget itself without a
    predictor or without data), trained by the gateway from each finished request's completion
    tokens (engine/gateway.py ``_learn``).
    """
    req = data["request"]
    rt = scope.rt
    endpoint = req["endpoint"]
    max_tokens = req.get("max_tokens")
    prompt_bytes = int(req.get("prompt_bytes") or 0)
    alias = rt.fleet.models.get(req["model"])
    if alias is not None and alias.tiers is not None:
        # A model alias: its tier model's rules apply (the alias has no node and no limits of its own).
        model = _tier(scope, alias, endpoint, max_tokens, prompt_bytes)
    else:
        model = check_model(rt.fleet_cfg, rt.fleet.models, endpoint, req["model"], max_tokens)
    if not isinstance(model, ModelConfig):
        return model
    prompt_est = rt.estimator.estimate(model.name, prompt_bytes, scope.prompt_text, endpoint)
    output = 0 if endpoint in ("embeddings", "predict") else int(max_tokens or model.default_max_tokens)
    refused = check_context(model, endpoint, prompt_est, output)
    models_tried = [model.name]
    if refused is not None:
        # Over the context window: the first fallback whose context fits serves it, else the 400.
        fits = context_fallback(rt.fleet.models, model, endpoint, max_tokens,
                                lambda name: rt.estimator.estimate(name, prompt_bytes, scope.prompt_text, endpoint))
        if fits is None:
            return refused
        scope.model = model.name
        note_fallback(scope, fits[0].name, "context_window", prompt_tokens_est=prompt_est,
                      context_tokens=model.max_context_tokens)
        model, prompt_est = fits
        output = int(max_tokens or model.default_max_tokens)
        models_tried.append(model.name)
    pinned = req.get("model_version") if len(models_tried) == 1 else None   # a pin names the model asked for
    version = check_version(rt.versions, model, pinned=pinned, tenant=req.get("tenant"),
                            user=scope.user, request_id=str(req["id"]))
    if isinstance(version, dict):
        return version
    scope.version = version
    scope.version_pinned = version is not None and pinned is not None
    timeout = rt.fleet_cfg.timeouts.total_s
    deadline_s = req.get("deadline_s")
    budget = min(float(deadline_s), timeout) if deadline_s else timeout
    scope.deadline_at = scope.received_mono + budget
    # n choices each generate up to the per-choice budget (the context check above is per choice):
    # admission, TPM, routing and the node's load all count n × the per-choice output.
    n = int(req.get("n") or 1)
    scope.output_budget = output * n
    est = None
    if rt.lengths is not None and output > 0:
        est = rt.lengths.estimate(model.name, prompt_tokens=prompt_est,
                                  declared=int(max_tokens) if max_tokens else None,
                                  default=model.default_max_tokens, tenant=req.get("tenant"), endpoint=endpoint)
    scope.length_estimate = est
    scope.output_estimate = (min(output, est.budget) if est is not None else output) * n
    scope.model = model.name
    scope.models_tried = models_tried   # the first is the model asked for: routing/fallback reads its list
    rec = scope.record
    rec.prompt_tokens_est = prompt_est
    rec.model_version = version.name if version is not None else model.version
    rec.priority = req.get("priority") or DEFAULT_PRIORITY
    rec.deadline_at = round(rec.received_at + budget, 6)
    return {
        "ok": True,
        "model": model.name,
        "version": rec.model_version,
        "prompt_tokens_est": prompt_est,
        "output_budget": scope.output_budget,
        "output_estimate": scope.output_estimate,
        "priority": rec.priority,
        "deadline_s": round(budget, 3),
        # A model alias's tier (tiers/router.py): the tier model and its difficulty score, else None.
        "tier": scope.tier["model"] if scope.tier is not None else None,
        "tier_score": scope.tier["score"] if scope.tier is not None else None,
    }


def _tier(scope: RequestScope, alias: ModelConfig, endpoint: str, max_tokens: int | None,
          prompt_bytes: int) -> ModelConfig | dict[str, Any]:
    """The tier model a request for ``alias`` goes to (tiers/router.py), or its rejection by that
    model's rules (:func:`check_model`). The choice, its score, features, contributions and the
    reason are written to the audit record (``tags["tier"]``; routing/select copies it into each
    decision) and to ``scope.tier``."""
    rt = scope.rt
    assert alias.tiers is not None
    if rt.tiers is None:   # a runtime built without one (build_runtime always makes one)
        rt.tiers = TierRouter(rt.clock)
    models = rt.fleet.models

    def estimate(name: str) -> int:
        return rt.estimator.estimate(name, prompt_bytes, scope.prompt_text, endpoint)

    def fits(name: str) -> bool:
        m = models.get(name)
        return m is not None and fits_context(m, endpoint, estimate(name), max_tokens)

    choice = rt.tiers.choose(alias.name, alias.tiers, scope.body or {},
                             prompt_tokens=estimate(alias.tiers.models[0].model), max_tokens=max_tokens,
                             request_id=str(scope.record.request_id), text=scope.prompt_text, fits=fits,
                             slos=rt.fleet_cfg.slos)
    entry = choice.to_json()
    scope.tier = entry
    rec = scope.record
    rec.tags = {**rec.tags, "tier": entry}
    return check_model(rt.fleet_cfg, models, endpoint, choice.model, max_tokens)
