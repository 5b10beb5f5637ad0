"""BPMN service operations: thin adapters from an operation id to the core.

``SERVICES`` is the ONE table the workflow engine receives (``app.py`` injects it). Each entry
says what the operation reads from the workflow data and what it writes (its result variable).
External operations have no function: the instance parks and the gateway performs them.
"""

from __future__ import annotations

from inferlb.engine.services import ServiceSpec, ServiceTable

from . import admission, audit, evaluate, retry, routing

__all__ = ["REQUIRED_TASKS", "SERVICES"]

SERVICES: ServiceTable = {
    "request/evaluate": ServiceSpec(
        result="evaluation", fn=evaluate.evaluate, reads=("request",),
        doc="Resolve the model, estimate prompt tokens and output budget, priority and deadline."),
    "admission/admit": ServiceSpec(
        result="admission", fn=admission.admit, reads=("evaluation",),
        doc="Backpressure: admit or reject with 503 + Retry-After."),
    "routing/select": ServiceSpec(
        result="routing", fn=routing.select, reads=("evaluation",),
        doc="Filter → score → pick over live node snapshots; skips nodes already tried."),
    "upstream/dispatch": ServiceSpec(
        result="outcome", external=True, reads=("routing",),
        doc="External: the gateway sends the request to routing['node'] and streams the answer."),
    "retry/backoff": ServiceSpec(
        result="retry", fn=retry.backoff, reads=("outcome",),
        params={"max_attempts": "attempts per request, all nodes and fallbacks together (default 3)"},
        doc="Full-jitter exponential backoff; no retry past max_attempts or the deadline."),
    "clock/wait": ServiceSpec(
        result="waited", external=True, params={"seconds": "how long the async layer waits"},
        doc="External: the gateway waits (never the engine)."),
    "routing/fallback": ServiceSpec(
        result="fallback", fn=routing.fallback, reads=("evaluation",),
        doc="Switch to the next model of the model's fallback list."),
    "audit/record": ServiceSpec(
        result="result", fn=audit.record, reads=("evaluation", "admission", "routing", "outcome", "tags"),
        doc="Decide the final status and hand the audit record to the batched writer."),
}

# Element ids every request process must contain (checked by ``inferlb validate``).
REQUIRED_TASKS: dict[str, str] = {
    "request/evaluate": "evaluate",
    "routing/select": "route",
    "upstream/dispatch": "dispatch",
    "audit/record": "record",
}
