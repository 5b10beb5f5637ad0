"""The load generator behind ``inferlb bench run | compare | capacity``.

Layout: ``workload`` (arrival processes, length distributions, tenants → a seeded request plan),
``trace`` (recorded load: JSONL / CSV / audit export → a plan), ``runner`` (the HTTP client, open
or closed loop, and the node sampler), ``results`` (goodput, percentiles, errors, node figures),
``report`` (rich / markdown tables, matplotlib charts), ``stack`` (simulated nodes and gateway
processes), ``cli`` (the commands).
"""

from inferlb.bench.loadgen.results import summarize
from inferlb.bench.loadgen.runner import Outcome, RunData, run_plan
from inferlb.bench.loadgen.trace import load_trace, parse_trace
from inferlb.bench.loadgen.workload import (
    BUILTIN_WORKLOADS,
    Arrival,
    LengthDist,
    PlannedRequest,
    Workload,
    load_workload,
    plan,
)

__all__ = [
    "BUILTIN_WORKLOADS",
    "Arrival",
    "LengthDist",
    "Outcome",
    "PlannedRequest",
    "RunData",
    "Workload",
    "load_trace",
    "load_workload",
    "parse_trace",
    "plan",
    "run_plan",
    "summarize",
]
