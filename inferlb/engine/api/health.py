"""Liveness and readiness.

``/healthz``: the process answers. ``/readyz`` (and ``/health``, the path vLLM serves and clients
such as GuideLLM probe): 200 once start-up finished and while not draining and the audit writer is
not failing closed; 503 otherwise (with the reasons). From SIGTERM on it answers 503 ``draining``
while the listener stays open for the drain (``engine/server``), so a load balancer in front stops
sending traffic before the gateway goes away. ``audit.state`` is
``ok``, ``degraded`` (serving; records wait in the journal, e.g. the database is down or hung) or
``unavailable`` (refusing), with ``audit.reason``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

__all__ = ["router"]

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
@router.get("/health")
async def readyz(request: Request) -> JSONResponse:
    state = request.app.state
    reasons: list[str] = []
    if not getattr(state, "ready", False):
        reasons.append("starting" if not getattr(state, "draining", False) else "draining")
    store = getattr(state, "store", None)
    backlog: dict[str, Any] = store.writer.backlog() if store is not None else {}
    if backlog and not backlog["accepting"]:   # failing closed: requests get 503 audit_unavailable
        reasons.append("audit_unavailable")
    body = {"status": "ready" if not reasons else "not_ready", "reasons": reasons,
            "engine": getattr(getattr(state, "process", None), "mode", None), "audit": backlog}
    return JSONResponse(body, status_code=200 if not reasons else 503)
