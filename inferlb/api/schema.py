"""The OpenAPI description served at ``/openapi.json``: request bodies of the OpenAI routes and
errors as the gateway really answers them.

Contract: documentation only. The OpenAI routes read the raw body and the hand-written validator
(``validation.py``) decides, so nothing here runs per request or changes what is accepted; the
JSON Schemas below describe the fields the validator checks (every other field is passed through
to the node, hence ``additionalProperties: true``). :func:`install` replaces FastAPI's generated
document, once, with one where

* ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and ``/v1/responses`` have their request
  body, the ``x-inferlb-*`` request headers and a JSON (or, when streamed, ``text/event-stream``)
  answer;
* every operation documents its errors as the OpenAI envelope
  ``{"error": {"message", "type", "param", "code"}}`` (:class:`ErrorResponse`): 400 for any
  invalid input (FastAPI's 422 never reaches a client: ``create_app`` maps it to 400), and on the
  OpenAI routes also the statuses the gateway answers there (401, 404, 413, 429, 502-504).

:data:`router` serves the document (``GET /openapi.json``) and Swagger UI (``GET /docs``, no OAuth2
redirect page), both guarded by :func:`~inferlb.api.auth.require_docs_reader`: open while auth is
off or ``INFERLB_PUBLIC_DOCS`` is set, else the admin rule. FastAPI's own two routes cannot take a
dependency, so ``create_app`` turns them off.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict
from starlette.responses import HTMLResponse, JSONResponse

from inferlb.api.auth import require_docs_reader
from inferlb.api.responses import MAX_OUTPUT_TOKENS
from inferlb.api.validation import DEFAULT_MAX_MESSAGES, DEFAULT_MAX_N
from inferlb.api.validation_fields import INT32_MAX, MODEL_MAX_CHARS, STOP_MAX_ITEMS, TOOLS_MAX

__all__ = ["REQUEST_BODIES", "ErrorBody", "ErrorResponse", "build", "install", "router"]


class ErrorBody(BaseModel):
    """The ``error`` object of every non-2xx answer."""

    model_config = ConfigDict(extra="allow")

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """The OpenAI error envelope."""

    error: ErrorBody


_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_ERROR_TEXT = {
    400: "Invalid input (body, query or header): the envelope's `param` names the field",
    401: "Authentication is on and the key is missing or invalid",
    403: "The key may not use this route",
    404: "Unknown model (or a model the key may not use), or unknown id",
    413: "The body is over the size cap",
    415: "The body is not JSON",
    429: "Rate limited, over quota or shed (`Retry-After` says when to retry)",
    502: "Every node answered with an error",
    503: "No node can serve the model now, or the gateway is overloaded (`Retry-After`)",
    504: "The client's deadline passed before a node answered (`deadline_exceeded`), or a node's own "
         "timeout did (`upstream_timeout`)",
}
_OPENAI_ERRORS = (400, 401, 403, 404, 413, 429, 502, 503, 504)

_STRING_OR_NULL = {"type": ["string", "null"]}
_TOKENS = {"type": ["integer", "null"], "minimum": 1, "maximum": INT32_MAX}
_COMMON: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1, "maxLength": MODEL_MAX_CHARS, "examples": ["m"],
              "description": "A model the fleet serves (GET /v1/models)"},
    "max_tokens": {**_TOKENS, "description": "Output tokens per choice (at most the model's max_output_tokens)"},
    "max_completion_tokens": {**_TOKENS, "description": "Newer alias of max_tokens (equal when both are sent)"},
    "n": {"type": ["integer", "null"], "minimum": 1, "maximum": DEFAULT_MAX_N,
          "description": f"Choices; the cap is the INFERLB_MAX_N setting (default {DEFAULT_MAX_N}). "
                         "Admission and TPM count n x max_tokens"},
    "stream": {"type": ["boolean", "null"]},
    "stream_options": {"type": ["object", "null"], "properties": {"include_usage": {"type": "boolean"}},
                       "description": "Only with stream: true"},
    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
    "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
    "presence_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2},
    "seed": {"type": ["integer", "null"]},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": STOP_MAX_ITEMS},
                       {"type": "null"}]},
    "user": _STRING_OR_NULL,
}
_PART = {"anyOf": [
    {"type": "object", "required": ["type", "text"],
     "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}},
    {"type": "object", "required": ["type", "image_url"],
     "properties": {"type": {"type": "string", "enum": ["image_url"]},
                    "image_url": {"type": "object", "required": ["url"], "properties": {"url": {"type": "string"}}}}},
]}
_MESSAGE = {
    "type": "object", "required": ["role", "content"], "additionalProperties": True,
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool", "function"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _PART, "minItems": 1}, {"type": "null"}],
                    "description": "null only in an assistant message with tool_calls"},
        "name": {"type": "string"},
    },
}
_TOOL = {
    "type": "object", "required": ["type", "function"],
    "properties": {"type": {"type": "string", "enum": ["function"]},
                   "function": {"type": "object", "required": ["name"],
                                "properties": {"name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                                               "description": {"type": "string"},
                                               "parameters": {"type": "object"}}}},
}
_PROMPT = {"anyOf": [
    {"type": "string"},
    {"type": "array", "items": {"type": "string"}, "minItems": 1},
    {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
    {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
     "minItems": 1},
]}

CHAT: dict[str, Any] = {
    "type": "object", "required": ["model", "messages"], "additionalProperties": True,
    "properties": {
        **_COMMON,
        "messages": {"type": "array", "items": _MESSAGE, "minItems": 1, "maxItems": DEFAULT_MAX_MESSAGES},
        "tools": {"type": "array", "items": _TOOL, "minItems": 1, "maxItems": TOOLS_MAX,
                  "description": "At least one tool: [] is a 400 (as OpenAI answers)"},
        "tool_choice": {"anyOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {"type": "object"}]},
        "response_format": {"type": "object", "required": ["type"],
                            "properties": {"type": {"type": "string",
                                                    "enum": ["text", "json_object", "json_schema", "structural_tag"]}}},
        "logprobs": {"type": ["boolean", "null"]},
        "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
    },
}
COMPLETIONS: dict[str, Any] = {
    "type": "object", "required": ["model", "prompt"], "additionalProperties": True,
    "properties": {**_COMMON, "prompt": _PROMPT, "echo": {"type": ["boolean", "null"]},
                   "best_of": {"type": ["integer", "null"], "minimum": 1, "description": "At least n"},
                   "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 5},
                   "suffix": _STRING_OR_NULL},
}
EMBEDDINGS: dict[str, Any] = {
    "type": "object", "required": ["model", "input"], "additionalProperties": True,
    "properties": {"model": _COMMON["model"], "input": _PROMPT,
                   "encoding_format": {"type": "string", "enum": ["float", "base64"]},
                   "dimensions": {"type": ["integer", "null"], "minimum": 1, "maximum": 65536},
                   "user": _STRING_OR_NULL},
}
_INPUT_ITEM = {
    "type": "object", "additionalProperties": True,
    "description": "An input item: a message (role and content) or another item type the node accepts",
    "properties": {
        "type": {"type": "string", "examples": ["message"]},
        "role": {"type": "string", "enum": ["user", "assistant", "system", "developer"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}],
                    "description": "Text, or content parts (input_text, input_image…)"},
    },
}
_PASSED = "Passed to the node, which validates it"
# The Responses API (api/responses.py): the gateway checks model, input, stream and
# max_output_tokens; the other fields listed are the common ones, forwarded untouched.
RESPONSES: dict[str, Any] = {
    "type": "object", "required": ["model", "input"], "additionalProperties": True,
    "description": "The gateway checks model, input, stream and max_output_tokens, and that no field names a "
                   "backend or a credential (api_base, base_url, api_key…); every other field goes to the node",
    "properties": {
        "model": _COMMON["model"],
        "input": {"anyOf": [{"type": "string", "minLength": 1},
                            {"type": "array", "items": _INPUT_ITEM, "minItems": 1}],
                  "description": "A non-empty string, or a non-empty list of input items"},
        "max_output_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_OUTPUT_TOKENS,
                              "description": "Output tokens (at most the model's max_output_tokens)"},
        "stream": {"type": ["boolean", "null"], "description": "Typed server-sent events, ending with "
                                                               "response.completed"},
        "instructions": {"type": ["string", "null"], "description": f"A system message. {_PASSED}"},
        "temperature": {**_COMMON["temperature"], "description": _PASSED},
        "top_p": {**_COMMON["top_p"], "description": _PASSED},
        "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"},
                     "description": _PASSED},
        "user": {**_STRING_OR_NULL, "description": "The sticky key of a model-version split (else x-session-id). "
                                                   + _PASSED},
        "previous_response_id": {"type": ["string", "null"], "description": _PASSED},
        "tools": {"type": "array", "items": {"type": "object", "required": ["type"],
                                             "properties": {"type": {"type": "string"}}},
                  "description": _PASSED},
    },
}
PREDICT: dict[str, Any] = {"type": "object", "additionalProperties": True,
                           "description": "A KServe-v2 / Triton inference request, forwarded as is"}
REQUEST_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS, "/v1/embeddings": EMBEDDINGS,
    "/v1/responses": RESPONSES, "/v1/predict/{model}": PREDICT,
}
_STREAMED = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
_GUARDED = ("/admin/", "/audit/", "/reports/", "/dashboard/", "/metrics")
_HEADERS = [
    {"name": "x-inferlb-priority", "in": "header", "required": False,
     "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,32}$"},
     "description": "A configured priority class, capped at the key's ceiling"},
    {"name": "x-inferlb-deadline-ms", "in": "header", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": 86_400_000},
     "description": "The client's deadline in milliseconds; when it passes first, the answer is "
                    "504 deadline_exceeded"},
    {"name": "x-inferlb-tenant", "in": "header", "required": False,
     "schema": {"type": "string", "minLength": 1, "maxLength": 128},
     "description": "A tenant label while auth is off (with auth on the key's tenant is used)"},
]


def _error(status: int) -> dict[str, Any]:
    return {"description": _ERROR_TEXT.get(status, "Error"), "content": {"application/json": {"schema": _ERROR_REF}}}


def _bodies(max_n: int) -> dict[str, dict[str, Any]]:
    """:data:`REQUEST_BODIES` with this gateway's cap on ``n`` (``Settings.max_n``)."""
    out = copy.deepcopy(REQUEST_BODIES)
    for body in out.values():
        n = body.get("properties", {}).get("n")
        if n is not None:
            n["maximum"] = max_n
    return out


def build(app: FastAPI, max_n: int = DEFAULT_MAX_N) -> dict[str, Any]:
    """FastAPI's document for ``app``, with the bodies and errors described in the module docstring."""
    bodies = _bodies(max_n)
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["ErrorBody"] = ErrorBody.model_json_schema()
    schemas["ErrorResponse"] = {**ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")}
    schemas["ErrorResponse"].pop("$defs", None)
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            responses: dict[str, Any] = op.setdefault("responses", {})
            responses.pop("422", None)
            body = bodies.get(path) if method == "post" else None
            statuses: tuple[int, ...] = (400,)
            if path.startswith(_GUARDED):
                statuses = (400, 401, 403, 404) if "{" in path else (400, 401, 403)
            if path.startswith("/v1/"):
                statuses = _OPENAI_ERRORS
                op.setdefault("parameters", []).extend(h for h in _HEADERS if method == "post")
            if body is not None:
                op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
                ok: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
                if path in _STREAMED:
                    ok["text/event-stream"] = {"schema": {"type": "string"},
                                               "description": "Server-sent events when stream is true"}
                responses["200"] = {"description": "The node's answer", "content": ok}
            for status in statuses:
                responses.setdefault(str(status), _error(status))
    return doc


def install(app: FastAPI, max_n: int = DEFAULT_MAX_N) -> None:
    """Serve :func:`build`'s document (made once, on the first request for it)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app, max_n)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


router = APIRouter(dependencies=[Depends(require_docs_reader)])


@router.get("/openapi.json", include_in_schema=False)
async def openapi_json(request: Request) -> JSONResponse:
    """The document :func:`install` made."""
    app: FastAPI = request.app
    return JSONResponse(app.openapi())


@router.get("/docs", include_in_schema=False)
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI over ``/openapi.json``."""
    app: FastAPI = request.app
    return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - Swagger UI")
