"""Admin routes that read: the fleet as the gateway sees it, and the history of node states (the
routes that change it are in ``nodes.py``).

``GET /admin/fleet``: each node's state, since when, why (with evidence), its timers (ejection,
cooldown, slow start), load in flight and as scraped, and its last sample per source with its age;
plus the models in panic mode, the health monitor's status, the latest node events and, with
several replicas on one Redis, ``cluster`` (cluster/service.py: replicas, Redis up or
away, this replica's slot shares, config hashes and any conflict, the election).
``GET /admin/fleet/events?node=&limit=&since=``: node state changes, newest first (table
``node_events``). ``since`` takes what the reports take (epoch seconds, ISO-8601 or a look-back
like ``1h``) and is checked by the same validator (:func:`~inferlb.store.report_params.parse_time`):
a non-finite or out-of-range time is a 400 ``invalid_time``.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query

from inferlb.api.deps import ClusterDep, EventsDep, GatewayDep, LiveDep, MonitorDep, OptionalStoreDep
from inferlb.errors import StoreError
from inferlb.store import StoreHandle
from inferlb.store.events import EventWriter, recent_events
from inferlb.store.report_params import parse_time

__all__ = ["router"]

router = APIRouter()


async def _events(store: StoreHandle | None, writer: EventWriter | None, *, node: str | None, limit: int,
                  since: float | None) -> list[dict[str, Any]]:
    if store is None:
        return []
    if writer is not None:
        await writer.flush_once()   # what the monitor just recorded is in the answer
    try:
        return await asyncio.to_thread(recent_events, store.engine, node=node, limit=limit, since=since)
    except StoreError:
        return []   # the database is away: the live state above still answers


@router.get("/admin/fleet")
async def fleet(gw: GatewayDep, store: OptionalStoreDep, events: EventsDep, monitor: MonitorDep,
                live: LiveDep, cluster: ClusterDep) -> dict[str, Any]:
    """Each node: state, since, why, timers, load, last samples, source (``file`` or ``admin``);
    panic models; the live config (versions, overrides, last change); recent events; with several
    replicas, ``cluster`` (replicas, Redis, shares, config hashes and conflicts, election)."""
    f = gw.rt.fleet
    sources = live.sources() if live is not None else {}
    nodes = f.describe()
    for n in nodes:
        n["source"] = sources.get(n["name"], "file")
    return {
        "routing_profile": gw.rt.router.name, "engine": gw.process.mode,
        "panic_models": sorted(f.panic_models(f.clock.monotonic())),
        "health": monitor.status() if monitor is not None else None,
        "live": live.status() if live is not None else None,
        "nodes": nodes,
        "events": await _events(store, events, node=None, limit=20, since=None),
        "cluster": cluster.status() if cluster is not None else None,
        # the output-length predictor (routing.output_length): its statistic, histograms kept, and
        # calibration on this replica's finished requests (MAE of its p50, coverage of its p50 / p90)
        "output_length": gw.rt.lengths.summary() if gw.rt.lengths is not None else None,
    }


@router.get("/admin/fleet/events")
async def fleet_events(store: OptionalStoreDep, events: EventsDep, node: str | None = None,
                       limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
                       since: str | None = None) -> dict[str, Any]:
    """Node state changes, newest first; ``since`` as in the reports (epoch seconds, ISO-8601, ``1h``)."""
    t = parse_time(since, param="since")
    return {"events": await _events(store, events, node=node, limit=limit, since=t)}
