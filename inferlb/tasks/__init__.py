"""BPMN service operations: thin adapters from an operation id to the core.

``SERVICES`` is the ONE table the workflow engine receives (``app.py`` injects it). Each entry
says what the operation reads from the workflow data, its result variable, and every key that
variable can hold (``writes``: process validation checks what conditions and scripts read against it).
External operations have no function: the instance parks and the gateway performs them.
"""

from __future__ import annotations

from inferlb.tasks import admission, audit, autoscale, evaluate, health, retry, rollout, routing
from inferlb.workflow.services import ProcessContract, ServiceSpec, ServiceTable

__all__ = ["AUTOSCALE_CONTRACT", "AUTOSCALE_REQUIRED_TASKS", "AUTOSCALE_START_DATA", "HEALTH_CONTRACT",
           "HEALTH_REQUIRED_TASKS", "HEALTH_START_DATA", "REQUEST_CONTRACT", "REQUEST_START_DATA",
           "REQUIRED_TASKS", "ROLLOUT_CONTRACT", "ROLLOUT_REQUIRED_TASKS", "ROLLOUT_START_DATA", "SERVICES"]

SERVICES: ServiceTable = {
    "request/evaluate": ServiceSpec(
        result="evaluation", fn=evaluate.evaluate, reads=("request",),
        writes=("ok", "model", "version", "prompt_tokens_est", "output_budget", "output_estimate", "priority",
                "deadline_s", "tier", "tier_score",
                "status", "code", "message", "param"),
        doc="Resolve the model (a model alias: its tier), estimate prompt tokens and output budget, priority "
            "and deadline."),
    "admission/admit": ServiceSpec(
        result="admission", fn=admission.admit, reads=("evaluation", "request"),
        writes=("admitted", "queue", "reason", "status", "retry_after_s", "code", "type", "message",
                "record_status", "queue_wait_ms"),
        params={"max_inflight": "gateway-wide cap on admitted requests (default INFERLB_MAX_INFLIGHT)"},
        doc="Backpressure: tenant limits (429), the pool's slots; admit, queue, or shed (503 + Retry-After)."),
    "admission/wait": ServiceSpec(
        result="queued", external=True, reads=("admission",), writes=("outcome", "waited_ms"),
        doc="External: the gateway waits in the pool's priority queue until a slot frees, the wait "
            "ends or the request is shed; then the process goes back to admit."),
    "routing/select": ServiceSpec(
        result="routing", fn=routing.select, reads=("evaluation",),
        writes=("ok", "node", "model", "ranked", "version", "reason"),
        doc="Filter → score → pick over live node snapshots of the request's model version; skips nodes "
            "already tried."),
    "upstream/dispatch": ServiceSpec(
        result="outcome", external=True, reads=("routing",),
        writes=("kind", "status", "error_class", "node", "retry_after_s", "tried"),
        doc="External: the gateway sends the request to the node route picked (routing['node']) and "
            "streams the answer."),
    "retry/backoff": ServiceSpec(
        result="retry", fn=retry.backoff, reads=("outcome", "evaluation"),
        writes=("retry", "delay_s", "attempt", "reason"),
        params={"max_attempts": "attempts per request, all nodes and fallbacks together (default 3)"},
        doc="Full-jitter exponential backoff; no retry past max_attempts, the deadline or the pool's "
            "retry budget."),
    "clock/wait": ServiceSpec(
        result="waited", external=True, writes=("seconds",), params={"seconds": "how long the async layer waits"},
        doc="External: the gateway waits (never the engine)."),
    "routing/fallback": ServiceSpec(
        result="fallback", fn=routing.fallback, reads=("evaluation", "request", "routing", "outcome"),
        writes=("ok", "model", "reason"),
        doc="Switch to the next model of the model's fallback list whose context fits the request."),
    "audit/record": ServiceSpec(
        result="result", fn=audit.record, reads=("evaluation", "admission", "routing", "outcome", "tags"),
        writes=("status", "http_status", "retry_after_s", "error"),
        doc="Decide the final status and hand the audit record to the batched writer."),
    # node_health.bpmn (one monitoring round; the scope is a HealthScope)
    "health/probe": ServiceSpec(
        result="probe", external=True, writes=("samples", "count"),
        doc="External: the monitor probes / scrapes every node concurrently; writes {samples: [...]}."),
    "health/assess": ServiceSpec(
        result="assessment", fn=health.assess, reads=("probe",), writes=("nodes", "stale_after_s"),
        params={"stale_after_s": "samples older than this are unknown (default health.probe.stale_after_s)"},
        doc="Pure: each node's newest sample per source → ok / loading / fail / stale, load, GPU report."),
    "health/isolate": ServiceSpec(
        result="isolated", fn=health.isolate, reads=("probe", "assessment"), writes=("events", "count"),
        params={"unhealthy_threshold": "failed probes in a row before down",
                "hardware": "act on GPU faults (default true)", "outliers": "run the outlier sweep (default true)"},
        doc="Keep the samples; take nodes out: loading, down, hardware eject / drain, outlier ejections."),
    "health/restore": ServiceSpec(
        result="restored", fn=health.restore, writes=("events", "count"),
        params={"healthy_threshold": "good probes in a row before a down / loading node is back"},
        doc="Bring nodes back: cooldown over, ejection over (half-open), probes good, throttling cleared."),
    "health/record": ServiceSpec(
        result="recorded", fn=health.record, writes=("count", "dropped"),
        doc="Hand every queued node state change to the event writer (table node_events)."),
    # autoscale.bpmn (one scaling round; the scope is an AutoscaleScope)
    "autoscale/observe": ServiceSpec(
        result="observed", external=True, writes=("models", "step_s", "end", "points", "replicas", "capacity"),
        doc="External: load per model from the audit trail, capacity at SLO per pool, replicas in place."),
    "autoscale/forecast": ServiceSpec(
        result="forecast", external=True, reads=("observed",), writes=("models", "fallbacks"),
        doc="External: the forecaster, off the event loop; too little history falls back to reactive."),
    "autoscale/plan": ServiceSpec(
        result="plan", fn=autoscale.plan, reads=("observed", "forecast"),
        writes=("changes", "pools", "cost_per_hour", "notes"),
        params={"target_utilisation": "overrides autoscale.target_utilisation (0.01-1)",
                "headroom": "overrides autoscale.headroom (extra share of the demand provisioned)"},
        doc="Replicas per pool: demand over the cold-start lead, capacity at SLO, min/max, stabilisation, cost cap."),
    "autoscale/actuate": ServiceSpec(
        result="actuation", external=True, reads=("plan",), writes=("ok", "failed", "error", "results"),
        doc="External: the actuator applies the plan pool by pool; failures are results."),
    "autoscale/record": ServiceSpec(
        result="recorded", fn=autoscale.record, writes=("count", "statuses"),
        doc="Every change, failure, held scale-down and forecaster fallback to table scaling_events."),
    # rollout.bpmn (one decision round of one canary rollout; the scope is a RolloutScope)
    "rollout/observe": ServiceSpec(
        result="observation", fn=rollout.observe, reads=("rollout",),
        writes=("canary", "baseline", "percent", "step_age_s", "window_s", "slo"),
        doc="Both versions' counts (attempts, failures, successes, SLO misses) and node times over the step's "
            "sliding window."),
    "rollout/decide": ServiceSpec(
        result="decision", fn=rollout.decide, reads=("observation",),
        writes=("action", "reason", "checks", "percent", "next_percent"),
        params={"min_requests": "per version before any decision but hold", "confidence": "one-sided level",
                "max_error_rate_increase": "error-rate margin", "max_slo_miss_increase": "SLO-miss margin",
                "max_latency_ratio": "how many times slower the canary's node times may be",
                "min_step_s": "least time at a step before a promotion",
                "max_step_s": "a step not shown safe by then is rolled back"},
        doc="The statistical guard: promote, hold or roll back (Newcombe bounds on the difference in error "
            "and SLO-miss rates, Welch bounds on the ratio of node times, minimum sample size)."),
    "rollout/promote": ServiceSpec(
        result="promoted", fn=rollout.promote, writes=("percent", "state", "completed"),
        doc="Move to the next step's weights, or complete after the last."),
    "rollout/rollback": ServiceSpec(
        result="rolled_back", fn=rollout.rollback, reads=("decision",), writes=("percent", "state"),
        doc="Restore the weights from before the rollout."),
    "rollout/record": ServiceSpec(
        result="recorded", fn=rollout.record, reads=("decision", "observation"), writes=("count", "action"),
        doc="Queue this round's event for the rollout_events table (written after the round)."),
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

# Element ids every autoscale process must contain (actuate may be left out: a recommender).
AUTOSCALE_REQUIRED_TASKS: dict[str, str] = {
    "autoscale/observe": "observe",
    "autoscale/forecast": "forecast",
    "autoscale/plan": "plan",
    "autoscale/record": "record",
}

# The data every instance starts with (name -> the keys it holds; None: free keys). The request
# process's ``request`` is what ``Gateway.handle`` builds; ``tags`` is the process author's own.
REQUEST_START_DATA: dict[str, tuple[str, ...] | None] = {
    "request": ("id", "endpoint", "model", "stream", "tenant", "priority", "max_tokens", "prompt_bytes",
                "deadline_s", "key_id", "n", "model_version"),
    "tags": None,
}

# What ``HealthMonitor.run_once`` starts each node-health round with.
HEALTH_START_DATA: dict[str, tuple[str, ...] | None] = {"round": None, "nodes": None}

# What ``AutoscaleRunner.run_once`` starts each round with.
AUTOSCALE_START_DATA: dict[str, tuple[str, ...] | None] = {"round": None, "at": None}

REQUEST_CONTRACT = ProcessContract(REQUIRED_TASKS, REQUEST_START_DATA)
HEALTH_CONTRACT = ProcessContract(HEALTH_REQUIRED_TASKS, HEALTH_START_DATA)
AUTOSCALE_CONTRACT = ProcessContract(AUTOSCALE_REQUIRED_TASKS, AUTOSCALE_START_DATA)

# Element ids every rollout process must contain (promote and rollback are the process's choice).
ROLLOUT_REQUIRED_TASKS: dict[str, str] = {
    "rollout/observe": "observe",
    "rollout/decide": "decide",
    "rollout/record": "record",
}

# What ``RolloutManager.run_once`` starts each rollout round with (Rollout.data()).
ROLLOUT_START_DATA: dict[str, tuple[str, ...] | None] = {
    "rollout": ("id", "model", "from_version", "to_version", "percent", "step", "steps", "next_percent", "state"),
}

ROLLOUT_CONTRACT = ProcessContract(ROLLOUT_REQUIRED_TASKS, ROLLOUT_START_DATA)
