"""Node health: sources (HTTP probe, Prometheus scrapes, the NVML node agent, DCGM), the pure
rules, the sweeps that isolate and restore nodes, the monitor that runs ``node_health.bpmn``.

Layout: ``config`` (the ``health:`` section), ``types`` (samples, node events), ``prometheus``
(exposition parsers), ``gpu`` (throttle bits, Xid names), ``rules`` (pure isolation rules),
``assess`` (samples → verdicts), ``isolation`` (sweeps over the fleet), ``probe`` (the async
sources, aiohttp), ``monitor`` (the timer loop driving the BPMN process), ``nvml`` and ``agent``
(``inferlb agent``). This package's ``__init__`` imports nothing, so ``settings`` can import
``config`` without pulling in I/O libraries.
"""

__all__: list[str] = []
