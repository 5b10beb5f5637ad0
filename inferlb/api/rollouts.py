"""Admin routes of model versions and canary rollouts.

* ``POST /admin/rollouts`` (body :class:`~inferlb.config.rollout.RolloutSpec`: ``model``,
  ``from_version``, ``to_version``, optional ``steps`` and ``criteria``) starts a rollout: 201 with
  the rollout; 400 for bad input (unknown model or version, bad steps or criteria, unknown keys),
  409 when the model already has a running rollout, 503 when it cannot be written to the database.
  Nothing is applied unless it answers 201.
* ``GET /admin/rollouts?model=&limit=``: the rollouts this gateway runs or ran, and the database's
  history (newest first), with each versioned model's weights in force.
* ``GET /admin/rollouts/{id}``: one rollout with its events (``rollout_events``).
* ``POST /admin/rollouts/{id}/abort``: stop a running rollout (the weights from before it come
  back); 404 unknown id, 409 not running.

Guarded like the other admin routes (``app.py``: :func:`~inferlb.api.auth.require_admin`). Errors use the
OpenAI envelope. Database reads run in a worker thread; when the database is away the live state
still answers.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.responses import JSONResponse

from inferlb.api.deps import OptionalStoreDep, RolloutsDep
from inferlb.config.rollout import RolloutSpec
from inferlb.errors import StoreError
from inferlb.rollout.errors import RolloutNotFound
from inferlb.rollout.store import get_rollout, list_rollouts, rollout_events

__all__ = ["router"]

router = APIRouter()


@router.post("/admin/rollouts", status_code=201)
async def start(body: RolloutSpec, manager: RolloutsDep) -> JSONResponse:
    r = await manager.start_rollout(body)
    return JSONResponse(r.to_json(), status_code=201)


@router.get("/admin/rollouts")
async def list_all(manager: RolloutsDep, store: OptionalStoreDep, model: str | None = None,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> dict[str, Any]:
    live = {r["id"]: r for r in manager.describe() if model is None or r["model"] == model}
    history: list[dict[str, Any]] = []
    if store is not None:
        try:
            history = await asyncio.to_thread(list_rollouts, store.engine, model=model, limit=limit)
        except StoreError:
            history = []
    merged = dict(live)
    for row in history:
        merged.setdefault(row["id"], row)
    data = sorted(merged.values(), key=lambda r: -(r.get("started_at") or 0.0))[:limit]
    return {"object": "list", "data": data, "versions": manager.versions.describe(), "manager": manager.status()}


@router.get("/admin/rollouts/{rollout_id}")
async def get_one(rollout_id: str, manager: RolloutsDep, store: OptionalStoreDep) -> dict[str, Any]:
    live = manager.get(rollout_id)
    out: dict[str, Any] | None = live.to_json() if live is not None else None
    events: list[dict[str, Any]] = []
    if store is not None:
        await manager.flush()
        try:
            if out is None:
                out = await asyncio.to_thread(get_rollout, store.engine, rollout_id)
            if out is not None:
                events = await asyncio.to_thread(rollout_events, store.engine, rollout_id)
        except StoreError:
            events = []
    if out is None:
        raise RolloutNotFound(rollout_id)
    return {**out, "events": events}


@router.post("/admin/rollouts/{rollout_id}/abort")
async def abort(rollout_id: str, manager: RolloutsDep) -> dict[str, Any]:
    r = await manager.abort(rollout_id)
    out: dict[str, Any] = r.to_json()
    return out
