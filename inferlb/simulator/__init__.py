"""The fleet simulator: OpenAI-compatible GPU-node emulators for tests, demos and benchmarks.

Layout: ``latency`` (pure timing model), ``spec`` (node and fault descriptions), ``openai_format``
(wire formats), ``node`` (one aiohttp server), ``stats`` (its counters), ``emulator`` (``SimFleet``, ``serve_sim``).
"""

from .emulator import SimFleet, serve_sim
from .latency import LatencyModel, TokenSchedule, estimate_tokens
from .node import EmulatedNode
from .spec import FaultSpec, NodeSpec, demo_specs
from .stats import NodeStats

__all__ = [
    "EmulatedNode",
    "FaultSpec",
    "LatencyModel",
    "NodeSpec",
    "NodeStats",
    "SimFleet",
    "TokenSchedule",
    "demo_specs",
    "estimate_tokens",
    "serve_sim",
]
