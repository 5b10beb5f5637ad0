"""The fleet simulator: OpenAI-compatible GPU-node emulators (``inferlb sim``).

Layout: ``latency`` (fixed-speed timing model), ``batching`` (the vLLM-like engine as a pure
discrete-event model), ``driver`` (runs it in real time), ``spec`` (node, engine, GPU and fault
descriptions), ``presets`` (h100 / a100 / l4 / t4-like relative presets, named fleets, fleet files),
``openai_format`` (wire formats), ``respond`` (writing a generation), ``node`` (one aiohttp server),
``control`` (its probe and control endpoints), ``metrics`` (vLLM Prometheus names, NVML-like GPU
JSON), ``stats`` (its counters), ``emulator`` (``SimFleet``, ``serve_sim``). The load generator and
the benchmarks that drive these nodes live in :mod:`inferlb.bench`.
"""

__all__: list[str] = []
