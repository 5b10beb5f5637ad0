"""Liveness and readiness.

``/healthz``: the process answers. ``/readyz`` (and ``/health``, the path vLLM serves and clients
such as GuideLLM probe): 200 once start-up finished and while not draining and the audit writer is
not failing closed; 503 otherwise (with the reasons). From SIGTERM on it answers 503 ``draining``
while the listener stays open for the drain (``server``), so a load balancer in front stops
sending traffic before the gateway goes away. ``audit.state`` is
``ok``, ``degraded`` (serving; records wait in the journal, e.g. the database is down or hung) or
``unavailable`` (refusing), with ``audit.reason``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.responses import JSONResponse

from inferlb.api.deps import LifecycleDep, OptionalStoreDep

__all__ = ["router"]

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
@router.get("/health")
async def readyz(life: LifecycleDep, store: OptionalStoreDep) -> JSONResponse:
    reasons: list[str] = []
    if not life.ready:
        reasons.append("starting" if not life.draining else "draining")
    writer = store.writer if store is not None else None
    backlog: dict[str, Any] = writer.backlog() if writer is not None else {}
    if backlog and not backlog["accepting"]:   # failing closed: requests get 503 audit_unavailable
        reasons.append("audit_unavailable")
    body = {"status": "ready" if not reasons else "not_ready", "reasons": reasons,
            "engine": life.engine, "audit": backlog}
    return JSONResponse(body, status_code=200 if not reasons else 503)
