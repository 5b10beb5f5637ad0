"""``GET /dashboard``: the HTML dashboard, its vendored assets, and the node-state timeline data.

Contract: the page and its assets are files shipped in the package
(``inferlb/observability/static``; uPlot vendored under ``vendor/`` with its MIT license);
nothing is loaded from another origin, and the page is served with a Content-Security-Policy that
forbids it (``default-src 'self'``). Only the files named in :data:`ASSETS` are served (no path
from the client reaches the file system). The page draws its charts from ``/reports/sla``,
``/reports/cost``, ``GET /dashboard/node-states`` (the in-memory state history of
the observability hub, ``ObservabilityDep``; empty when there is none) and
``GET /dashboard/autoscale`` (the autoscaling panel: forecast vs actual vs capacity and replicas
per model from the runner, the last ``events`` scaling decisions from ``scaling_events``, default
20, at most 200; ``{"enabled": false, "reason": ...}`` when no autoscaler runs;
:func:`inferlb.autoscale.panel.autoscale_panel` says the shape) and ``GET /dashboard/versions``
(the versions and rollouts panel: each versioned model's weights in force, the running rollouts
then the last ``limit`` ended ones, default 10, at most 100, each with its last decision;
``enabled`` false with a ``reason`` when no model has versions;
:func:`inferlb.rollout.panel.versions_panel` says the shape; when the database cannot be read
the panel shows what this gateway knows), ``GET /dashboard/kv-events`` (the KV-event index
panel: the service's snapshot, inferlb/kvevents/service.py; ``enabled`` false with a ``reason``
when the fleet file uses no KV events) and ``GET /dashboard/lora`` (the LoRA adapters panel:
each LoRA model's adapters and base, each node's running / waiting adapters, slots and adapters
cooling down after a failed load; :func:`inferlb.observability.lora_panel.lora_panel` says the shape).
The cost-tiers panel reads ``/admin/tiers`` (api/tiers.py) and ``/reports/sla?group_by=model,served``.

Authentication: the page and its assets are public (they hold no data); every data route it calls
follows the admin rule (``api/auth.py``, :func:`~inferlb.api.auth.require_admin`: ``/reports/*``,
``/dashboard/node-states``, ``/dashboard/autoscale``, ``/dashboard/versions``, ``/dashboard/lora``). On a 401/403
the page asks for the key once, keeps it in the tab's ``sessionStorage`` (never a cookie, so other
sites cannot make the browser send it) and sends it as ``Authorization: Bearer`` on its fetches.
"""

from __future__ import annotations

import asyncio
import functools
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends
from starlette.responses import Response

from inferlb.api.auth import require_admin
from inferlb.api.deps import AutoscalerDep, GatewayDep, KVEventsDep, ObservabilityDep, OptionalStoreDep, RolloutsDep
from inferlb.autoscale.panel import AUTOSCALE_OFF, autoscale_panel
from inferlb.autoscale.store import recent_scaling_events
from inferlb.errors import ClientError, InvalidRequest, StoreError
from inferlb.observability.lora_panel import lora_panel
from inferlb.rollout.panel import versions_panel
from inferlb.rollout.store import ended_rollouts, last_rollout_events, running_rollouts

__all__ = ["ASSETS", "CSP", "KV_EVENTS_OFF", "MAX_EVENTS", "MAX_ROLLOUTS", "router"]

router = APIRouter()

_STATIC = "inferlb.observability"
ASSETS: dict[str, tuple[str, str]] = {
    "dashboard.js": ("static/dashboard.js", "text/javascript; charset=utf-8"),
    "dashboard.css": ("static/dashboard.css", "text/css; charset=utf-8"),
    "uPlot.iife.min.js": ("static/vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "uPlot.min.css": ("static/vendor/uPlot.min.css", "text/css; charset=utf-8"),
    "uPlot.LICENSE": ("static/vendor/uPlot.LICENSE", "text/plain; charset=utf-8"),
}
MAX_EVENTS = 200
MAX_ROLLOUTS = 100
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'")


class AssetNotFound(ClientError):
    status = 404

    def __init__(self, name: str) -> None:
        super().__init__(f"No dashboard asset '{name[:100]}'", param="name", code="not_found")


@functools.cache
def _read(path: str) -> bytes:
    return resources.files(_STATIC).joinpath(path).read_bytes()


@router.get("/dashboard", include_in_schema=False)
async def dashboard() -> Response:
    return Response(_read("static/dashboard.html"), media_type="text/html; charset=utf-8",
                    headers={"content-security-policy": CSP, "x-content-type-options": "nosniff",
                             "cache-control": "no-cache"})


@router.get("/dashboard/assets/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    entry = ASSETS.get(name)
    if entry is None:
        raise AssetNotFound(name)
    path, media_type = entry
    return Response(_read(path), media_type=media_type,
                    headers={"x-content-type-options": "nosniff", "cache-control": "public, max-age=300"})


@router.get("/dashboard/node-states", dependencies=[Depends(require_admin)])
async def node_states(obs: ObservabilityDep) -> dict[str, Any]:
    """Node states sampled by this gateway since it started (oldest first), and ``roles``: the
    prefill/decode role of each node that is not ``both`` (config/disaggregation.py)."""
    if obs is None:
        return {"states": [], "nodes": [], "samples": [], "roles": {}}
    snap: dict[str, Any] = obs.history.snapshot()
    nodes = obs.fleet.nodes if obs.fleet is not None else {}
    snap["roles"] = {name: st.cfg.role for name, st in nodes.items() if st.cfg.role != "both"}
    return snap


def _bounded(name: str, value: str | None, *, default: int, maximum: int) -> int:
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= maximum:
        raise InvalidRequest(f"'{name}' must be an integer from 1 to {maximum}", param=name)
    return n


KV_EVENTS_OFF = {"enabled": False, "reason": "no model or node has kv_events in the fleet file"}


@router.get("/dashboard/kv-events", dependencies=[Depends(require_admin)])
async def kv_events(wiring: KVEventsDep) -> dict[str, Any]:
    """The KV-event index panel: per publishing node its blocks and stream state, per model the
    decisions that used the index or fell back (inferlb/kvevents/service.py ``snapshot``)."""
    if wiring is None:
        return dict(KV_EVENTS_OFF)
    snap: dict[str, Any] = wiring.service.snapshot()
    return {"enabled": True, **snap}


@router.get("/dashboard/autoscale", dependencies=[Depends(require_admin)])
async def autoscale(runner: AutoscalerDep, store: OptionalStoreDep, events: str | None = None) -> dict[str, Any]:
    """The autoscaling panel's series and last scaling events (or that autoscaling is off)."""
    limit = _bounded("events", events, default=20, maximum=MAX_EVENTS)
    if runner is None:
        return dict(AUTOSCALE_OFF)
    rows = [] if store is None else await asyncio.to_thread(recent_scaling_events, store.engine, limit=limit)
    return autoscale_panel(runner.status(), list(runner.points), rows)


def _stored_rollouts(engine: Any, limit: int) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    rows = running_rollouts(engine) + ended_rollouts(engine, limit=limit)
    return rows, last_rollout_events(engine, [str(r["id"]) for r in rows])


@router.get("/dashboard/versions", dependencies=[Depends(require_admin)])
async def versions(manager: RolloutsDep, store: OptionalStoreDep, limit: str | None = None) -> dict[str, Any]:
    """Each versioned model's weights in force, and the running then recently ended rollouts."""
    n = _bounded("limit", limit, default=10, maximum=MAX_ROLLOUTS)
    live = manager.describe()
    stored: list[dict[str, Any]] = []
    last: dict[str, dict[str, Any]] = {}
    if store is not None:
        try:
            stored, last = await asyncio.to_thread(_stored_rollouts, store.engine, n)
        except StoreError:
            stored, last = [], {}   # the database is away: what this gateway knows still shows
    for r in live:
        pending = manager.pending_event(r["id"])   # decided, not yet written: newer than the table's
        if pending is not None:
            last[r["id"]] = pending
    return versions_panel(manager.versions.describe(), live, stored, last, limit=n)


@router.get("/dashboard/lora", dependencies=[Depends(require_admin)])
async def lora(gw: GatewayDep) -> dict[str, Any]:
    """Where each LoRA adapter runs or waits now, per node, and which node is out for which adapter."""
    rt = gw.rt
    return lora_panel(rt.fleet_cfg.models, rt.fleet.describe())
