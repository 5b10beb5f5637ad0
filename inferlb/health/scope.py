"""What the node-health service operations act on: the fleet, the clock and the event sink.

One :class:`HealthScope` per process instance (one monitoring round); the workflow treats it as
opaque and passes it to each operation of ``tasks/health.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inferlb.fleet.state import Fleet
from inferlb.node_types import NodeEvent
from inferlb.types import Clock

__all__ = ["HealthScope"]


@dataclass
class HealthScope:
    fleet: Fleet
    clock: Clock
    record: Callable[[list[NodeEvent]], None]    # non-blocking hand-off to the event writer
    round: int = 0
