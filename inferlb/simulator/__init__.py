"""The fleet simulator: OpenAI-compatible GPU-node emulators (``inferlb sim``).

Layout: ``latency`` (fixed-speed timing model), ``batching`` (the vLLM-like engine as a pure
discrete-event model), ``driver`` (runs it in real time), ``spec`` (node, engine, GPU and fault
descriptions), ``presets`` (h100 / a100 / l4 / t4-like relative presets, named fleets, fleet files),
``openai_format`` (wire formats), ``respond`` (writing a generation), ``node`` (one aiohttp server),
``control`` (its probe and control endpoints), ``metrics`` (vLLM Prometheus names, NVML-like GPU
JSON), ``stats`` (its counters), ``emulator`` (``SimFleet``, ``serve_sim``). The load generator and
the benchmarks that drive these nodes live in :mod:`inferlb.bench`.
"""

from inferlb.simulator.batching import BatchCore
from inferlb.simulator.emulator import SimFleet, serve_sim
from inferlb.simulator.latency import LatencyModel, TokenSchedule, estimate_tokens
from inferlb.simulator.node import EmulatedNode
from inferlb.simulator.presets import PRESETS, fleet_specs, preset_spec
from inferlb.simulator.spec import BatchSpec, FaultSpec, GpuSpec, NodeSpec, demo_specs
from inferlb.simulator.stats import NodeStats

__all__ = [
    "PRESETS",
    "BatchCore",
    "BatchSpec",
    "EmulatedNode",
    "FaultSpec",
    "GpuSpec",
    "LatencyModel",
    "NodeSpec",
    "NodeStats",
    "SimFleet",
    "TokenSchedule",
    "demo_specs",
    "estimate_tokens",
    "fleet_specs",
    "preset_spec",
    "serve_sim",
]
