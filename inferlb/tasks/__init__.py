"""BPMN service operations: thin adapters from an operation id to the core.

``SERVICES`` is the ONE table the workflow engine receives (``app.py`` injects it). Each entry
says what the operation reads from the workflow data and what it writes (its result variable).
External operations have no function: the instance parks and the gateway performs them.
"""

from __future__ import annotations

from inferlb.engine.services import ServiceSpec, ServiceTable

from . import admission, audit, evaluate, health, retry, routing

__all__ = ["HEALTH_REQUIRED_TASKS", "REQUIRED_TASKS", "SERVICES"]

SERVICES: ServiceTable = {
    "request/evaluate": ServiceSpec(
        result="evaluation", fn=evaluate.evaluate, reads=("request",),
        doc="Resolve the model, estimate prompt tokens and output budget, priority and deadline."),
    "admission/admit": ServiceSpec(
        result="admission", fn=admission.admit, reads=("evaluation", "request"),
        params={"max_inflight": "gateway-wide cap on admitted requests (default INFERLB_MAX_INFLIGHT)"},
        doc="Backpressure: tenant limits (429), the pool's slots; admit, queue, or shed (503 + Retry-After)."),
    "admission/wait": ServiceSpec(
        result="queued", external=True, reads=("admission",),
        doc="External: the gateway waits in the pool's priority queue until a slot frees, the wait "
            "ends or the request is shed; then the process goes back to admit."),
    "routing/select": ServiceSpec(
        result="routing", fn=routing.select, reads=("evaluation",),
        doc="Filter → score → pick over live node snapshots; skips nodes already tried."),
    "upstream/dispatch": ServiceSpec(
        result="outcome", external=True, reads=("routing",),
        doc="External: the gateway sends the request to the node route picked (routing['node']) and "
            "streams the answer."),
    "retry/backoff": ServiceSpec(
        result="retry", fn=retry.backoff, reads=("outcome", "evaluation"),
        params={"max_attempts": "attempts per request, all nodes and fallbacks together (default 3)"},
        doc="Full-jitter exponential backoff; no retry past max_attempts, the deadline or the pool's "
            "retry budget."),
    "clock/wait": ServiceSpec(
        result="waited", external=True, params={"seconds": "how long the async layer waits"},
        doc="External: the gateway waits (never the engine)."),
    "routing/fallback": ServiceSpec(
        result="fallback", fn=routing.fallback, reads=("evaluation",),
        doc="Switch to the next model of the model's fallback list."),
    "audit/record": ServiceSpec(
        result="result", fn=audit.record, reads=("evaluation", "admission", "routing", "outcome", "tags"),
        doc="Decide the final status and hand the audit record to the batched writer."),
    # node_health.bpmn (one monitoring round; the scope is a HealthScope)
    "health/probe": ServiceSpec(
        result="probe", external=True,
        doc="External: the monitor probes / scrapes every node concurrently; writes {samples: [...]}."),
    "health/assess": ServiceSpec(
        result="assessment", fn=health.assess, reads=("probe",),
        params={"stale_after_s": "samples older than this are unknown (default health.probe.stale_after_s)"},
        doc="Pure: each node's newest sample per source → ok / loading / fail / stale, load, GPU report."),
    "health/isolate": ServiceSpec(
        result="isolated", fn=health.isolate, reads=("probe", "assessment"),
        params={"unhealthy_threshold": "failed probes in a row before down",
                "hardware": "act on GPU faults (default true)", "outliers": "run the outlier sweep (default true)"},
        doc="Keep the samples; take nodes out: loading, down, hardware eject / drain, outlier ejections."),
    "health/restore": ServiceSpec(
        result="restored", fn=health.restore,
        params={"healthy_threshold": "good probes in a row before a down / loading node is back"},
        doc="Bring nodes back: cooldown over, ejection over (half-open), probes good, throttling cleared."),
    "health/record": ServiceSpec(
        result="recorded", fn=health.record,
        doc="Hand every queued node state change to the event writer (table node_events)."),
}

# Element ids every request process must contain (checked by ``inferlb validate``).
REQUIRED_TASKS: dict[str, str] = {
    "request/evaluate": "evaluate",
    "routing/select": "route",
    "upstream/dispatch": "dispatch",
    "audit/record": "record",
}

# Element ids every node-health process must contain (restore may be left out on purpose).
HEALTH_REQUIRED_TASKS: dict[str, str] = {
    "health/probe": "probe",
    "health/assess": "assess",
    "health/isolate": "isolate",
    "health/record": "record",
}
