"""OpenAI-compatible routes: chat, completions, embeddings, models, and the generic predict
passthrough. Thin: read the body under a size cap, validate, hand to the gateway.

Request headers read here (all optional): ``x-inferlb-tenant`` (a tenant label while auth is off;
with auth on the key's tenant is used), ``x-inferlb-priority`` (a priority class name, capped at the
key's ceiling), ``x-inferlb-deadline-ms`` (the client's deadline, else the class's default; the
gateway never works on a request past it), ``x-session-id`` (the sticky key of the
model-version split when the body has no ``user``), ``x-inferlb-model-version`` (pin a version
of a versioned model: allowed while auth is off, and for keys created with ``pin_versions``;
403 otherwise). Tenant keys are checked by the router's
``authenticate`` dependency (wired in ``app.py``); see ``api/auth.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from inferlb.admission.auth import Identity
from inferlb.api.auth import identity
from inferlb.api.deps import GatewayDep
from inferlb.api.labels import clean_text, model_label
from inferlb.api.responses import validate_responses
from inferlb.api.validation import (
    ValidatedRequest,
    validate_chat,
    validate_completions,
    validate_embeddings,
    validate_predict,
)
from inferlb.api.validation_json import parse_json_body
from inferlb.config.versions import VERSION_NAME
from inferlb.engine.gateway import Gateway
from inferlb.engine.hops import HOP_HEADER, LoopDetected, check_hops
from inferlb.engine.scope import IncomingRequest
from inferlb.errors import ClientError, Forbidden, InvalidRequest, ModelNotFound, PayloadTooLarge

__all__ = ["HOT_ROUTES", "read_body", "router"]

router = APIRouter()

_PRIORITY_MAX = 32


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body, read chunk by chunk and refused (413) as soon as it passes ``max_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body is over the {max_bytes}-byte limit", code="payload_too_large")
    chunks = bytearray()
    async for chunk in request.stream():
        chunks += chunk
        if len(chunks) > max_bytes:
            raise PayloadTooLarge(f"request body is over the {max_bytes}-byte limit", code="payload_too_large")
    return bytes(chunks)


_THREAD_PARSE_BYTES = 256 * 1024


async def _parse(raw: bytes, settings: Any) -> dict[str, Any]:
    """Parse the body; large ones in a worker thread (a 4 MiB body takes ~100-400 ms to decode
    and check, which must not stall every other request on the event loop)."""
    if len(raw) > _THREAD_PARSE_BYTES:
        return await asyncio.to_thread(parse_json_body, raw, max_bytes=settings.max_body_bytes,
                                       max_depth=settings.max_json_depth)
    return parse_json_body(raw, max_bytes=settings.max_body_bytes, max_depth=settings.max_json_depth)


def _headers(request: Request) -> tuple[str | None, str | None, float | None]:
    h = request.headers
    tenant = h.get("x-inferlb-tenant")
    if tenant is not None and (not tenant or len(tenant) > 128):
        raise InvalidRequest("x-inferlb-tenant must be 1–128 characters", param="x-inferlb-tenant")
    prio = h.get("x-inferlb-priority")
    if prio is not None and (not prio.replace("-", "").replace("_", "").isalnum() or len(prio) > _PRIORITY_MAX):
        raise InvalidRequest("x-inferlb-priority must be a priority class name", param="x-inferlb-priority")
    deadline: float | None = None
    raw = h.get("x-inferlb-deadline-ms")
    if raw is not None:
        if not raw.isdigit() or not 1 <= int(raw) <= 86_400_000:
            raise InvalidRequest("x-inferlb-deadline-ms must be an integer number of milliseconds ≥ 1",
                                 param="x-inferlb-deadline-ms")
        deadline = int(raw) / 1000.0
    return tenant, prio, deadline


_SESSION_MAX = 256


def _session(request: Request) -> str | None:
    """The ``x-session-id`` header (session affinity, routing/affinity.py; the sticky key of
    model versions), if sent."""
    sid = request.headers.get("x-session-id")
    if sid is None:
        return None
    if not sid or len(sid) > _SESSION_MAX or not sid.isprintable():
        raise InvalidRequest(f"x-session-id must be 1–{_SESSION_MAX} printable characters", param="x-session-id")
    return sid


def _pinned_version(request: Request, who: Identity, auth_on: bool) -> str | None:
    """The version pinned by ``x-inferlb-model-version``; 400 when malformed, 403 when the key may not pin."""
    pinned = request.headers.get("x-inferlb-model-version")
    if pinned is not None:
        if not VERSION_NAME.fullmatch(pinned):
            raise InvalidRequest("x-inferlb-model-version must be a version name (letters, digits, _ . : -)",
                                 param="x-inferlb-model-version", code="invalid_model_version")
        if auth_on and (who.key is None or not who.key.pin_versions):
            raise Forbidden("This API key may not pin a model version (x-inferlb-model-version): create the key "
                            "with pin_versions", code="version_pin_not_allowed")
    return pinned


def _disconnect_waiter(request: Request) -> Callable[[], Awaitable[None]]:
    async def wait() -> None:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return
    return wait


def _rejected(gw: Gateway, endpoint: str, model: str | None, err: ClientError) -> JSONResponse:
    """Audit a request refused before its process started and answer it. The stored model is
    bounded (api/labels.py): a name the fleet does not serve is grouped as one."""
    label = model_label(model, gw.rt.fleet.models)
    tags = {"model_sent": clean_text(model)} if model is not None and label != model else None
    rid = gw.reject(endpoint, label, err.status, err.code, tags=tags)
    return JSONResponse(err.envelope(), status_code=err.status, headers={**(err.headers or {}), "x-request-id": rid})


def _hops(request: Request, gw: Gateway) -> tuple[str, ...]:
    """The gateways the request passed (engine/hops.py); LoopDetected (508) when it loops."""
    return check_hops(request.headers.get(HOP_HEADER), gw.hop_id, gw.rt.settings.max_hops)


def _looped(gw: Gateway, endpoint: str, err: LoopDetected) -> JSONResponse:
    """A loop back to this gateway is not audited again: the request that started it is this
    gateway's own, and its row records the attempt that came back 508 (engine/hops.py)."""
    if err.own:
        return JSONResponse(err.envelope(), status_code=err.status)
    return _rejected(gw, endpoint, None, err)


async def _run(request: Request, gw: Gateway, endpoint: str,
               validate: Callable[[dict[str, Any], bool, int], ValidatedRequest]) -> Response:
    settings = gw.rt.settings
    model_hint: str | None = None
    try:
        hops = _hops(request, gw)
    except LoopDetected as err:
        return _looped(gw, endpoint, err)
    try:
        who = identity(request, gw.rt.admission, *_headers(request))   # tenant, priority class, deadline, key
        session = _session(request)
        pinned = _pinned_version(request, who, gw.rt.admission.auth_on)
        body = await _parse(await read_body(request, settings.max_body_bytes), settings)
        m = body.get("model")
        model_hint = m if isinstance(m, str) else None
        # The text is joined for a tokenizer, or for the prefix hashes of an affinity router.
        want_text = gw.rt.estimator.wants_text(model_hint or "?") or gw.rt.router.prefix_blocks > 0
        v = validate(body, want_text, settings.max_n)
        who.check_model(v.model)
        if v.model not in gw.rt.fleet.models:
            raise ModelNotFound(v.model)
    except ClientError as err:
        return _rejected(gw, endpoint, model_hint, err)
    inc = IncomingRequest(endpoint=endpoint, model=v.model, body=v.body, stream=v.stream,
                          include_usage=v.include_usage, max_tokens=v.max_tokens, n=v.n,
                          prompt_bytes=v.prompt_bytes + 4 * v.prompt_token_ids, prompt_text=v.prompt_text,
                          tenant=who.tenant, priority=who.priority, deadline_s=who.deadline_s, key_id=who.key_id,
                          session=session, user=_user(v.body) or session, model_version=pinned, hops=hops)
    return await gw.handle(inc, _disconnect_waiter(request))


def _user(body: dict[str, Any]) -> str | None:
    """The body's ``user`` (validated: a string of at most 256 characters) or None."""
    u = body.get("user")
    return u if isinstance(u, str) and u else None


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, gw: GatewayDep) -> Response:
    return await _run(request, gw, "chat", lambda b, t, n: validate_chat(b, want_text=t, max_n=n))


@router.post("/v1/completions")
async def completions(request: Request, gw: GatewayDep) -> Response:
    return await _run(request, gw, "completions", lambda b, t, n: validate_completions(b, want_text=t, max_n=n))


@router.post("/v1/embeddings")
async def embeddings(request: Request, gw: GatewayDep) -> Response:
    return await _run(request, gw, "embeddings", lambda b, t, _n: validate_embeddings(b, want_text=t))


@router.post("/v1/responses")
async def responses(request: Request, gw: GatewayDep) -> Response:
    """The OpenAI Responses API, forwarded like chat to nodes whose kind serves it."""
    return await _run(request, gw, "responses", lambda b, t, _n: validate_responses(b, want_text=t))


@router.post("/v1/predict/{model}")
async def predict(model: str, request: Request, gw: GatewayDep) -> Response:
    """Generic JSON inference for non-LLM models, forwarded to the node's KServe-v2 / Triton
    ``/v2/models/{model}/infer`` endpoint."""
    settings = gw.rt.settings
    try:
        hops = _hops(request, gw)
    except LoopDetected as err:
        return _looped(gw, "predict", err)
    try:
        who = identity(request, gw.rt.admission, *_headers(request))
        who.check_model(model)
        session = _session(request)
        pinned = _pinned_version(request, who, gw.rt.admission.auth_on)
        raw = await read_body(request, settings.max_body_bytes)
        if model not in gw.rt.fleet.models:
            raise ModelNotFound(model)
        body = validate_predict(await _parse(raw, settings))
    except ClientError as err:
        return _rejected(gw, "predict", model, err)
    inc = IncomingRequest(endpoint="predict", model=model, body=body, prompt_bytes=len(raw), tenant=who.tenant,
                          priority=who.priority, deadline_s=who.deadline_s, key_id=who.key_id, session=session,
                          user=session, model_version=pinned, hops=hops)
    return await gw.handle(inc, _disconnect_waiter(request))


@router.get("/v1/models")
async def list_models(gw: GatewayDep) -> dict[str, Any]:
    created = int(time.time())
    return {"object": "list", "data": [
        {"id": m.name, "object": "model", "created": created, "owned_by": "inferlb"}
        for m in gw.rt.fleet_cfg.models]}


@router.get("/v1/models/{model}")
async def get_model(model: str, gw: GatewayDep) -> Response:
    m = gw.rt.fleet.models.get(model)
    if m is None:
        err = ModelNotFound(model)
        return JSONResponse(err.envelope(), status_code=err.status)
    return JSONResponse({"id": m.name, "object": "model", "created": int(time.time()), "owned_by": "inferlb"})


# The POST routes that carry the traffic, by path: ``api/edge.py``'s ``HotRoutes`` serves them
# without FastAPI's routing and dependency solving (the same guard, gateway and exception handlers;
# docs/benchmarks.md, "The hot routes without FastAPI's routing"). Each takes the request and the
# gateway and returns the answer; a path here must also be a route above (the fallback when
# dependencies are overridden, and the OpenAPI document).
HOT_ROUTES: dict[str, Callable[[Request, Gateway], Awaitable[Response]]] = {
    "/v1/chat/completions": chat_completions,
    "/v1/completions": completions,
    "/v1/embeddings": embeddings,
    "/v1/responses": responses,
}
