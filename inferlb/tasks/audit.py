"""``audit/record``: decide the request's final status and hand its record to the writer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferlb.engine.scope import RequestScope

__all__ = ["final_result", "record"]


# Attempt error classes that mean "nothing listens there": the node is out, not failing.
_UNREACHABLE = frozenset({"connect_error", "timeout_connect"})


def _err(status: int, kind: str, code: str, message: str, etype: str = "server_error",
         param: str | None = None, retry_after: float | None = None) -> dict[str, Any]:
    return {"status": kind, "http_status": status, "retry_after_s": retry_after,
            "error": {"message": message, "type": etype, "param": param, "code": code}}


def final_result(scope: RequestScope, data: Mapping[str, Any]) -> dict[str, Any]:
    """The outcome the client gets, from the workflow data (pure)."""
    ev = data.get("evaluation") or {}
    if not ev.get("ok"):
        status = int(ev.get("status", 400))
        etype = "invalid_request_error" if status < 500 else "server_error"
        kind = "rejected_invalid" if status == 400 else "rejected"
        return _err(status, kind, ev.get("code") or "invalid_request", ev.get("message") or "invalid request",
                    etype, ev.get("param"))
    adm = data.get("admission") or {}
    if not adm.get("admitted"):
        # Admission names its own error (429 limits / quota, 503 shed / queue timeout); older or
        # hand-written admit operations fall back to a generic 503.
        return _err(int(adm.get("status") or 503), adm.get("record_status") or "rejected",
                    adm.get("code") or "overloaded",
                    adm.get("message") or f"The gateway is overloaded: {adm.get('reason')}",
                    adm.get("type") or "server_error", retry_after=adm.get("retry_after_s"))
    out = data.get("outcome")
    if out is not None and out.get("kind") == "ok":
        return {"status": "ok", "http_status": int(out.get("status") or 200), "retry_after_s": None, "error": None}
    if out is not None and out.get("kind") == "client_closed":
        return _err(499, "client_closed", "client_closed", "The client closed the connection")
    if out is not None and out.get("kind") == "midstream_error":
        if out.get("error_class") == "server_shutting_down":
            return _err(200, "server_shutting_down", "server_shutting_down",
                        "The gateway shut down before the response was complete")
        return _err(200, "upstream_error_midstream", "upstream_error", "The model server failed mid-response")
    if out is None:
        routing = data.get("routing") or {}
        return _err(503, "no_healthy_upstream", "no_healthy_upstream",
                    f"No node can serve the model now: {routing.get('reason', 'unknown')}",
                    retry_after=scope.retry_after_s or 1.0)
    attempts = scope.record.attempts
    if out.get("kind") == "retryable" and attempts and all(a.error_class in _UNREACHABLE for a in attempts):
        # No node was reachable at all: the nodes are out, not failing (a 502 would blame one).
        return _err(503, "no_healthy_upstream", "no_healthy_upstream",
                    f"No node of the model could be reached ({len(attempts)} tried)",
                    retry_after=scope.retry_after_s or 1.0)
    if out.get("kind") == "fatal" and out.get("status") and 400 <= int(out["status"]) < 500:
        return _err(int(out["status"]), "upstream_rejected", "upstream_rejected",
                    "The model server rejected the request", "invalid_request_error")
    if scope.retry_after_s is not None and out.get("status") == 429:
        return _err(429, "rate_limited", "rate_limited", "Every node that serves the model is rate limited",
                    "rate_limit_error", retry_after=scope.retry_after_s)
    if out.get("error_class") == "timeout":
        return _err(504, "upstream_timeout", "upstream_timeout", "The model server did not answer in time")
    return _err(502, "upstream_error", "upstream_error",
                f"The model server failed after {scope.attempts} attempt(s)")


def record(scope: RequestScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads everything; writes ``result``. Copies ``tags`` (set by process scripts) into the record."""
    result = final_result(scope, data)
    rec = scope.record
    rec.status = result["status"]
    rec.http_status = result["http_status"]
    if result["error"] is not None and rec.error_class is None:
        rec.error_class = result["error"]["code"]
    tags = data.get("tags")
    if isinstance(tags, dict):
        rec.tags = dict(tags)
    if rec.model_served is None and (data.get("evaluation") or {}).get("ok"):
        rec.model_served = scope.model
    # Dispatch completes only after the last byte, so the record is whole here; the writer's
    # submit never blocks.
    scope.rt.on_request_end(rec)
    return result
