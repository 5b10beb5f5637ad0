"""The load generator behind ``inferlb bench run | compare | capacity``.

Layout: ``workload`` (arrival processes, length distributions, tenants → a seeded request plan),
``trace`` (recorded load: JSONL / CSV / audit export → a plan), ``runner`` (the HTTP client, open
or closed loop, and the node sampler), ``results`` (goodput, percentiles, errors, node figures),
``report`` (rich / markdown tables, matplotlib charts), ``stack`` (simulated nodes and gateway
processes), ``cli`` (the commands).
"""

__all__: list[str] = []
