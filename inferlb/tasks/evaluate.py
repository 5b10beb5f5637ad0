"""``request/evaluate``: model resolution, token estimate, output budget, priority, deadline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferlb.engine.endpoints import serves
from inferlb.engine.scope import RequestScope

__all__ = ["evaluate"]

DEFAULT_PRIORITY = "standard"
_GENERATE = frozenset({"chat", "completions", "responses"})


def _reject(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"ok": False, "status": status, "code": code, "message": message, "param": param}


def evaluate(scope: RequestScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads ``request``; writes ``evaluation`` (see processes/README.md).

    The output budget and the deadline are computed here only: routing, admission and the gateway
    (node load, timeouts) use ``evaluation["output_budget"]`` / ``scope.output_budget`` and
    ``scope.deadline_at``, also after a fallback to another model; the audit row keeps the deadline.
    """
    req = data["request"]
    rt = scope.rt
    model = rt.fleet.models.get(req["model"])
    if model is None:
        return _reject(404, "model_not_found", f"The model '{req['model']}' does not exist", "model")
    endpoint = req["endpoint"]
    if endpoint in _GENERATE and model.kind != "llm":
        return _reject(400, "model_not_supported", f"'{model.name}' is not a text-generation model", "model")
    if endpoint == "responses":
        nodes = rt.fleet_cfg.nodes
        kinds = sorted({n.kind for n in nodes if model.name in n.models})
        if not any(serves(endpoint, k) for k in kinds):
            return _reject(501, "unsupported_endpoint",
                           f"No node serving '{model.name}' supports /v1/responses (its node kinds: "
                           f"{', '.join(kinds) or 'none'}; the Responses API needs vllm or openai nodes)",
                           None)
    if endpoint == "embeddings" and model.kind != "embedding":
        return _reject(400, "model_not_supported", f"'{model.name}' is not an embedding model", "model")
    max_tokens = req.get("max_tokens")
    if max_tokens is not None and max_tokens > model.max_output_tokens:
        return _reject(400, "max_tokens_too_large",
                       f"max_tokens {max_tokens} is over this model's limit of {model.max_output_tokens}",
                       "max_output_tokens" if endpoint == "responses" else "max_tokens")
    prompt_est = rt.estimator.estimate(model.name, int(req.get("prompt_bytes") or 0), scope.prompt_text)
    output = 0 if endpoint in ("embeddings", "predict") else int(max_tokens or model.default_max_tokens)
    if endpoint in _GENERATE and prompt_est + output > model.max_context_tokens:
        return _reject(400, "context_length_exceeded",
                       f"about {prompt_est} prompt tokens + {output} output tokens exceed the "
                       f"model's context of {model.max_context_tokens}", "messages")
    timeout = rt.fleet_cfg.timeouts.total_s
    deadline_s = req.get("deadline_s")
    budget = min(float(deadline_s), timeout) if deadline_s else timeout
    scope.deadline_at = scope.received_mono + budget
    # n choices each generate up to the per-choice budget (the context check above is per choice):
    # admission, TPM, routing and the node's load all count n × the per-choice output.
    scope.output_budget = output * int(req.get("n") or 1)
    scope.model = model.name
    scope.models_tried = [model.name]
    rec = scope.record
    rec.prompt_tokens_est = prompt_est
    rec.model_version = model.version
    rec.priority = req.get("priority") or DEFAULT_PRIORITY
    rec.deadline_at = round(rec.received_at + budget, 6)
    return {
        "ok": True,
        "model": model.name,
        "version": model.version,
        "prompt_tokens_est": prompt_est,
        "output_budget": scope.output_budget,
        "priority": rec.priority,
        "deadline_s": round(budget, 3),
    }
