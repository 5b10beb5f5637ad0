"""``admission/admit``: backpressure — tenant limits, the model pool's slots, queue or shed.

Thin adapter to :class:`~inferlb.admission.controller.AdmissionController` (``scope.rt.admission``).
The operation never blocks: when the pool is saturated it answers ``queue`` and the process parks
on the external ``admission/wait`` task (performed by the gateway), then comes back here.

Writes ``admission`` = ``{"admitted", "queue", "reason", "status", "retry_after_s"}``; a rejection
adds ``"code"``, ``"type"``, ``"message"`` (the OpenAI error the client gets) and
``"record_status"`` (the audit status: ``rejected_rate_limit``, ``rejected_quota``,
``rejected_overload``, ``rejected_queue_timeout``); an admission adds ``"queue_wait_ms"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferlb.engine.scope import RequestScope

__all__ = ["admit"]


def admit(scope: RequestScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads ``evaluation``, ``request`` (its ``key_id``); param ``max_inflight`` (optional gateway-wide
    cap, default ``INFERLB_MAX_INFLIGHT``); writes ``admission``."""
    cap = params.get("max_inflight")
    return scope.rt.admission.admit(scope, data["evaluation"], data.get("request"),
                                    max_inflight=int(cap) if cap is not None else None)
