"""Admin routes that change the running gateway (guarded like every ``/admin`` route:
:func:`~inferlb.api.auth.require_admin`). Thin: the work is :class:`~inferlb.live.manager.LiveConfig`'s.

* ``POST /admin/reload``: re-read the fleet file and the processes; 200 with the new versions, or
  400 (``invalid_config`` / ``invalid_process``: the message names the file, the key path or
  element id, and the problem; ``param`` is the key path or element id) or 409
  (``restart_required``), with the old config still serving.
* ``POST /admin/nodes`` (a node entry of the fleet file as the body): add it; it gets traffic once
  probed, then in slow start. ``POST /admin/nodes/{name}/drain`` / ``undrain``,
  ``PATCH /admin/nodes/{name}`` (``weight``, ``labels``, ``capacity_tokens``, ``max_concurrency``,
  ``price_per_hour``), ``DELETE /admin/nodes/{name}[?force=true]`` (409 unless drained or forced;
  409 for the last node of a model, and, forced or not, 409 ``node_in_version`` for a node a model
  version lists by name: the message names the key, ``models[M].versions[V].nodes``). Unknown
  node 404, duplicate name or bad field 400, database away 503; all in the OpenAI envelope,
  nothing applied on error. Each answers the change and the node as ``/admin/fleet`` shows it.

``POST /admin/nodes`` answers ``warnings`` (a list, empty when all is well; each also logged as a
WARNING): one line per versioned model the new node serves whose versions all leave it out, as
it then gets none of that model's traffic (live/fleet_admin.py, :func:`unversioned_warnings`).

Every change is a node event (``node_events``) whose evidence carries ``key_id``: the admin key's
id (``admin:`` + the first 12 hex digits of its SHA-256; null when no admin key is configured and
the change came through the admin listener).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request

from inferlb.admission.auth import bearer_token, matches
from inferlb.api.deps import AdmissionDep, GatewayDep, LiveDep
from inferlb.errors import ConfigError, InvalidRequest, ProcessValidationError, Unavailable
from inferlb.fleet.netguard import resolved_problem
from inferlb.live.fleet_admin import Effective, add_node, patch_node, remove_node, set_drained, unversioned_warnings
from inferlb.live.manager import LiveConfig
from inferlb.store.overrides import NodeOverride

__all__ = ["router"]

router = APIRouter()

log = logging.getLogger("inferlb.live")


def _live(live: LiveConfig | None) -> LiveConfig:
    if live is None:
        raise Unavailable("Live changes are not available: the gateway is starting or stopping", code="not_ready")
    return live


def _actor(request: Request, ctl: AdmissionDep) -> dict[str, Any]:
    token = bearer_token(request.headers.get("authorization"))
    admin = ctl.env.admin_key
    key_id = None
    if token is not None and admin is not None and matches(token, admin):
        key_id = "admin:" + hashlib.sha256(token.encode()).hexdigest()[:12]
    return {"by": "admin", "key_id": key_id}


def _node(gw: GatewayDep, live: LiveConfig, name: str) -> dict[str, Any] | None:
    """``name`` as ``/admin/fleet`` shows it (None once it is gone)."""
    node = next((n for n in gw.rt.fleet.describe() if n["name"] == name), None)
    if node is not None:
        node["source"] = live.sources().get(name, "file")
    return node


@router.post("/admin/reload")
async def reload(request: Request, live: LiveDep, ctl: AdmissionDep) -> dict[str, Any]:
    """Re-read the fleet file and the processes directory; swap them in atomically."""
    try:
        return await _live(live).reload(trigger="api", actor=_actor(request, ctl))
    except ConfigError as exc:
        raise InvalidRequest(f"Reload refused, nothing changed: {exc}", param=exc.path,
                             code="invalid_config") from exc
    except ProcessValidationError as exc:
        raise InvalidRequest(f"Reload refused, nothing changed: {exc}",
                             param=exc.problems[0][0] if exc.problems else None, code="invalid_process") from exc


@router.post("/admin/nodes")
async def add(request: Request, gw: GatewayDep, live: LiveDep, ctl: AdmissionDep,
              body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
    """Add a node (a node entry of the fleet file)."""
    lc = _live(live)
    actor = _actor(request, ctl)
    at = lc.clock.time()
    name = str(body.get("name", ""))
    # The policy judges the URL as written (add_node); its host name is also judged by what it
    # resolves to now, and again at every connection (fleet/netguard.py).
    cfg = lc.effective.cfg
    why = await resolved_problem(str(body.get("url", "")), cfg.network_policy, cfg.listeners)
    if why is not None:
        raise InvalidRequest(f"node URL refused by the network policy: {why}", param="url", code="node_url_refused")

    def change(eff: Effective, rows: Sequence[NodeOverride]) -> list[NodeOverride]:
        return add_node(eff, rows, body, key_id=actor["key_id"], at=at)[1]

    out = await lc.change_nodes(name, change, what="add", actor=actor)
    warnings = unversioned_warnings(lc.effective.cfg, name)
    for line in warnings:
        log.warning("POST /admin/nodes: %s", line)
    return {**out, "node_state": _node(gw, lc, name), "warnings": warnings}


async def _drain(request: Request, gw: GatewayDep, live: LiveDep, ctl: AdmissionDep, name: str,
                 drained: bool) -> dict[str, Any]:
    lc = _live(live)
    actor = _actor(request, ctl)
    at = lc.clock.time()

    def change(eff: Effective, rows: Sequence[NodeOverride]) -> list[NodeOverride]:
        return set_drained(eff, rows, name, drained, key_id=actor["key_id"], at=at)

    out = await lc.change_nodes(name, change, what="drain" if drained else "undrain", actor=actor)
    return {**out, "node_state": _node(gw, lc, name)}


@router.post("/admin/nodes/{name}/drain")
async def drain(request: Request, gw: GatewayDep, live: LiveDep, ctl: AdmissionDep, name: str) -> dict[str, Any]:
    """No new requests for ``name``; those in flight finish (``draining`` → ``drained``)."""
    return await _drain(request, gw, live, ctl, name, True)


@router.post("/admin/nodes/{name}/undrain")
async def undrain(request: Request, gw: GatewayDep, live: LiveDep, ctl: AdmissionDep, name: str) -> dict[str, Any]:
    """``name`` takes traffic again, in slow start."""
    return await _drain(request, gw, live, ctl, name, False)


@router.patch("/admin/nodes/{name}")
async def patch(request: Request, gw: GatewayDep, live: LiveDep, ctl: AdmissionDep, name: str,
                body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
    """Change weight, labels, capacity or price of ``name``."""
    lc = _live(live)
    actor = _actor(request, ctl)
    at = lc.clock.time()

    def change(eff: Effective, rows: Sequence[NodeOverride]) -> list[NodeOverride]:
        return patch_node(eff, rows, name, body, key_id=actor["key_id"], at=at)

    out = await lc.change_nodes(name, change, what="patch", actor=actor)
    return {**out, "node_state": _node(gw, lc, name)}


@router.delete("/admin/nodes/{name}")
async def remove(request: Request, gw: GatewayDep, live: LiveDep, ctl: AdmissionDep, name: str,
                 force: Annotated[bool, Query()] = False) -> dict[str, Any]:
    """Remove ``name``: 409 unless it is drained here or ``force``; its requests in flight finish."""
    lc = _live(live)
    actor = _actor(request, ctl)
    at = lc.clock.time()
    st = gw.rt.fleet.nodes.get(name)
    drained_here = st is not None and st.held and st.inflight_requests == 0

    def change(eff: Effective, rows: Sequence[NodeOverride]) -> list[NodeOverride]:
        return remove_node(eff, rows, name, drained_here=drained_here, force=force, key_id=actor["key_id"], at=at)

    out = await lc.change_nodes(name, change, what="remove", actor=actor)
    return {**out, "node_state": _node(gw, lc, name)}
