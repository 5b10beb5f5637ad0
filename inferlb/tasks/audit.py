"""``audit/record``: the request's final status (:func:`inferlb.engine.outcomes.final_result`) into its
record, then the end-of-request hook (admission release, audit writer, metrics)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferlb.engine.outcomes import final_result
from inferlb.engine.scope import RequestScope

__all__ = ["record"]


def record(scope: RequestScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads everything; writes ``result``. Copies ``tags`` (set by process scripts) into the
    record, beside the gateway's own."""
    result = final_result(scope, data)
    rec = scope.record
    rec.status = result["status"]
    rec.http_status = result["http_status"]
    if result["error"] is not None and rec.error_class is None:
        rec.error_class = result["error"]["code"]
    tags = data.get("tags")
    if isinstance(tags, dict):
        rec.tags = {**rec.tags, **tags}   # the gateway's own (model_fallback) kept beside the process's
    if rec.model_served is None and (data.get("evaluation") or {}).get("ok"):
        rec.model_served = scope.model
    # Dispatch completes only after the last byte, so the record is whole here; the writer's
    # submit never blocks.
    scope.rt.on_request_end(rec)
    return result
