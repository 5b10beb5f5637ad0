"""Admin routes (read-only for now): the fleet as the gateway sees it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from .deps import GatewayDep

__all__ = ["router"]

router = APIRouter()


@router.get("/admin/fleet")
async def fleet(gw: GatewayDep) -> dict[str, Any]:
    """Each node: health as routing sees it, load in flight, failures, learned speed."""
    nodes = []
    states = gw.rt.fleet.nodes
    for v in gw.rt.fleet.views():
        st = states[v.name]
        nodes.append({
            "name": v.name, "url": st.cfg.url, "models": sorted(v.models), "healthy": v.healthy,
            "reason": v.unhealthy_reason, "inflight_requests": v.inflight_requests,
            "inflight_tokens": v.inflight_tokens, "capacity_tokens": v.capacity_tokens,
            "ejections": st.ejections, "consecutive_failures": st.consecutive_failures,
            "requests_total": st.requests_total, "failures_total": st.failures_total,
            "tokens_per_s": st.tokens_per_s,
        })
    return {"routing_profile": gw.rt.router.name, "engine": gw.process.mode, "nodes": nodes}
