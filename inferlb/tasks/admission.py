"""``admission/admit``: the first backpressure gate (a gateway-wide in-flight cap).

Per-tenant limits, the priority queue and shedding are deepened by the backpressure work; the
contract (``admission`` = admitted, reason, status, retry_after_s) stays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferlb.engine.scope import RequestScope

__all__ = ["admit"]


def admit(scope: RequestScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads the fleet's in-flight count; writes ``admission``."""
    rt = scope.rt
    cap = int(params.get("max_inflight", rt.settings.max_inflight))
    inflight = rt.fleet.inflight_total()
    scope.record.admitted_at = round(rt.clock.time(), 6)
    if inflight >= cap:
        return {"admitted": False, "reason": f"{inflight} requests in flight (cap {cap})",
                "status": 503, "retry_after_s": 1.0}
    return {"admitted": True, "reason": "under capacity", "status": None, "retry_after_s": None}
