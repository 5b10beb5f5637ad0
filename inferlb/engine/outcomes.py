"""The client-visible rules of a request, in one place: which model requests are refused before
routing (:func:`check_model`, :func:`check_context`) and the outcome → HTTP status / OpenAI error
table (:func:`final_result`).

The service tasks ``request/evaluate`` and ``audit/record`` are thin adapters over these; every
error body comes from :func:`~inferlb.errors.error_body`. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from inferlb.config.settings import FleetConfig, ModelConfig
from inferlb.engine.endpoints import serves
from inferlb.engine.scope import RequestScope
from inferlb.errors import error_body
from inferlb.versions.table import Version, VersionTable

__all__ = [
    "GENERATE",
    "check_context",
    "check_model",
    "check_version",
    "context_fallback",
    "final_result",
    "fits_context",
    "node_error",
    "note_fallback",
    "rejection",
]

GENERATE = frozenset({"chat", "completions", "responses"})   # endpoints that generate text


_NODE_MESSAGE_MAX = 500


def node_error(body: bytes) -> dict[str, Any] | None:
    """The OpenAI error a node answered with (``{"error": {"message", "type", "param", "code"}}``),
    its fields checked and the message cut to 500 characters, or None when the body is not one. A
    real engine's own words (llama.cpp: "This model's maximum context length is 2048 tokens…",
    ``context_length_exceeded``) tell the client what to change; they reach it as the node sent them."""
    if not body or b'"error"' not in body:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str) or not err["message"].strip():
        return None

    def text(key: str) -> str | None:
        v = err.get(key)
        return v[:100] if isinstance(v, str) and v else None

    return {"message": err["message"][:_NODE_MESSAGE_MAX], "type": text("type"), "param": text("param"),
            "code": text("code")}


def rejection(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    """``request/evaluate``'s refusal: the status and the OpenAI error fields :func:`final_result` renders."""
    return {"ok": False, "status": status, "code": code, "message": message, "param": param}


def check_model(fleet_cfg: FleetConfig, models: Mapping[str, ModelConfig], endpoint: str, name: str,
                max_tokens: int | None) -> ModelConfig | dict[str, Any]:
    """The model a request names, or its :func:`rejection`: 404 unknown model, 400 a model of the
    wrong kind for the endpoint, 501 ``/v1/responses`` with no node kind that serves it, 400
    ``max_tokens`` over the model's limit."""
    model = models.get(name)
    if model is None:
        return rejection(404, "model_not_found", f"The model '{name}' does not exist", "model")
    if endpoint in GENERATE and model.kind != "llm":
        return rejection(400, "model_not_supported", f"'{model.name}' is not a text-generation model", "model")
    if endpoint == "responses":
        kinds = sorted({n.kind for n in fleet_cfg.nodes if model.name in n.models})
        if not any(serves(endpoint, k) for k in kinds):
            return rejection(501, "unsupported_endpoint",
                             f"No node serving '{model.name}' supports /v1/responses (its node kinds: "
                             f"{', '.join(kinds) or 'none'}; the Responses API needs vllm or openai nodes)",
                             None)
    if endpoint == "embeddings" and model.kind != "embedding":
        return rejection(400, "model_not_supported", f"'{model.name}' is not an embedding model", "model")
    if max_tokens is not None and max_tokens > model.max_output_tokens:
        return rejection(400, "max_tokens_too_large",
                         f"max_tokens {max_tokens} is over this model's limit of {model.max_output_tokens}",
                         "max_output_tokens" if endpoint == "responses" else "max_tokens")
    return model


def check_context(model: ModelConfig, endpoint: str, prompt_est: int, output: int) -> dict[str, Any] | None:
    """400 ``context_length_exceeded`` when a generating request's prompt and output (per choice)
    exceed the model's context; else None."""
    if endpoint in GENERATE and prompt_est + output > model.max_context_tokens:
        return rejection(400, "context_length_exceeded",
                         f"about {prompt_est} prompt tokens + {output} output tokens exceed the "
                         f"model's context of {model.max_context_tokens}", "messages")
    return None


def fits_context(model: ModelConfig, endpoint: str, prompt_est: int, max_tokens: int | None) -> bool:
    """Whether a request of ``prompt_est`` tokens asking ``max_tokens`` (None: the model's default)
    can go to ``model``: a text-generation model whose output limit allows ``max_tokens`` and whose
    context holds the prompt and the output (per choice)."""
    if endpoint not in GENERATE:
        return True
    if model.kind != "llm" or (max_tokens is not None and max_tokens > model.max_output_tokens):
        return False
    return prompt_est + int(max_tokens or model.default_max_tokens) <= model.max_context_tokens


def context_fallback(models: Mapping[str, ModelConfig], model: ModelConfig, endpoint: str, max_tokens: int | None,
                     estimate: Callable[[str], int]) -> tuple[ModelConfig, int] | None:
    """The model a prompt too long for ``model`` goes to, and its prompt estimate there: the first
    of ``model.context_window_fallbacks`` (else of ``model.fallbacks``) that :func:`fits_context`,
    the prompt estimated for each (``estimate(name)``: models may tokenize differently); None when
    none fits (the request is refused with :func:`check_context`'s 400)."""
    for name in model.context_window_fallbacks or model.fallbacks:
        other = models.get(name)
        if other is None:
            continue
        prompt_est = estimate(name)
        if fits_context(other, endpoint, prompt_est, max_tokens):
            return other, prompt_est
    return None


def note_fallback(scope: RequestScope, to: str, reason: str, **evidence: Any) -> None:
    """Record in the audit row that the request moved from the model it was on to ``to`` and why
    (``tags["model_fallback"]``: one entry per move, in order); ``model_served`` says who served."""
    rec = scope.record
    moves = list(rec.tags.get("model_fallback") or [])
    moves.append({"from": scope.model or rec.model_requested, "to": to, "reason": reason, **evidence})
    rec.tags = {**rec.tags, "model_fallback": moves}
    rec.model_served = to


def check_version(versions: VersionTable, model: ModelConfig, *, pinned: str | None, tenant: str | None,
                  user: str | None, request_id: str) -> Version | dict[str, Any] | None:
    """The version of ``model`` a request is served by, or its :func:`rejection`.

    Pinned (``x-inferlb-model-version``, the API layer checked the key may pin): that version,
    400 ``model_version_not_found`` when the model has no such version (a model without versions
    accepts only its static ``version`` label, and then serves it as usual). Not pinned: sticky
    by weight on (model, tenant, user) (versions/assign.py). None: the model is not versioned.
    """
    mv = versions.get(model.name)
    if pinned is not None:
        v = mv.get(pinned) if mv is not None else None
        if v is None and not (mv is None and pinned == model.version):
            known = ", ".join(mv.names) if mv is not None else (model.version or "none")
            return rejection(400, "model_version_not_found",
                             f"The model '{model.name}' has no version '{pinned}' (versions: {known})",
                             "x-inferlb-model-version")
        return v
    return versions.assign(model.name, tenant, user, request_id)


# Attempt error classes that mean "nothing listens there": the node is out, not failing.
_UNREACHABLE = frozenset({"connect_error", "timeout_connect"})


def _err(status: int, kind: str, code: str, message: str, etype: str = "server_error",
         param: str | None = None, retry_after: float | None = None) -> dict[str, Any]:
    return {"status": kind, "http_status": status, "retry_after_s": retry_after,
            **error_body(message, etype, code, param)}


def final_result(scope: RequestScope, data: Mapping[str, Any]) -> dict[str, Any]:
    """The outcome the client gets, from the workflow data (pure)."""
    ev = data.get("evaluation") or {}
    if not ev.get("ok"):
        status = int(ev.get("status", 400))
        etype = "invalid_request_error" if status < 500 else "server_error"
        kind = "rejected_invalid" if status == 400 else "rejected"
        return _err(status, kind, ev.get("code") or "invalid_request", ev.get("message") or "invalid request",
                    etype, ev.get("param"))
    adm = data.get("admission") or {}
    if not adm.get("admitted"):
        # Admission names its own error (429 limits / quota, 503 shed / queue timeout); older or
        # hand-written admit operations fall back to a generic 503.
        return _err(int(adm.get("status") or 503), adm.get("record_status") or "rejected",
                    adm.get("code") or "overloaded",
                    adm.get("message") or f"The gateway is overloaded: {adm.get('reason')}",
                    adm.get("type") or "server_error", retry_after=adm.get("retry_after_s"))
    out = data.get("outcome")
    if out is not None and out.get("kind") == "ok":
        return {"status": "ok", "http_status": int(out.get("status") or 200), "retry_after_s": None, "error": None}
    if out is not None and out.get("kind") == "client_closed":
        return _err(499, "client_closed", "client_closed", "The client closed the connection")
    if out is not None and out.get("kind") == "midstream_error":
        if out.get("error_class") == "server_shutting_down":
            return _err(200, "server_shutting_down", "server_shutting_down",
                        "The gateway shut down before the response was complete")
        return _err(200, "upstream_error_midstream", "upstream_error", "The model server failed mid-response")
    if out is None:
        routing = data.get("routing") or {}
        return _err(503, "no_healthy_upstream", "no_healthy_upstream",
                    f"No node can serve the model now: {routing.get('reason', 'unknown')}",
                    retry_after=scope.retry_after_s or 1.0)
    attempts = scope.record.attempts
    if out.get("kind") == "retryable" and attempts and all(a.error_class in _UNREACHABLE for a in attempts):
        # No node was reachable at all: the nodes are out, not failing (a 502 would blame one).
        return _err(503, "no_healthy_upstream", "no_healthy_upstream",
                    f"No node of the model could be reached ({len(attempts)} tried)",
                    retry_after=scope.retry_after_s or 1.0)
    if out.get("kind") == "fatal" and out.get("status") == 508:
        # The node is (or leads back to) a gateway that saw this request already (engine/hops.py).
        return _err(508, "loop_detected", "loop_detected",
                    "Loop detected: the model server's URL leads back to an inferlb gateway this request passed")
    if out.get("kind") == "fatal" and out.get("status") and 400 <= int(out["status"]) < 500:
        said = out.get("node_error") or {}
        return _err(int(out["status"]), "upstream_rejected", said.get("code") or "upstream_rejected",
                    said.get("message") or "The model server rejected the request",
                    said.get("type") or "invalid_request_error", said.get("param"))
    if scope.retry_after_s is not None and out.get("status") == 429:
        return _err(429, "rate_limited", "rate_limited", "Every node that serves the model is rate limited",
                    "rate_limit_error", retry_after=scope.retry_after_s)
    if out.get("error_class") == "timeout" and scope.deadline_cut:
        # The client's deadline (x-inferlb-deadline-ms, or its class's) ended the wait, not the
        # node: say so, so that neither the client nor a dashboard blames the model server.
        return _err(504, "deadline_exceeded", "deadline_exceeded",
                    "The request's deadline passed before a node answered (x-inferlb-deadline-ms or the "
                    "priority class's deadline)")
    if out.get("error_class") == "timeout":
        return _err(504, "upstream_timeout", "upstream_timeout", "The model server did not answer in time")
    return _err(502, "upstream_error", "upstream_error",
                f"The model server failed after {scope.attempts} attempt(s)")
