"""Node states now (for ``/metrics``) and over time (for the dashboard's state timeline).

Contract:

* :func:`node_states` classifies each node of a :class:`~inferlb.fleet.state.Fleet` into one of
  :data:`NODE_STATES` from the routing snapshot (``Fleet.views()``), the view every router sees:
  ``healthy``; ``ejected`` (passive ejection after consecutive failures); ``cooldown`` (a 429's
  Retry-After); ``unhealthy`` (any other reason a node is out, e.g. failed probes).
* :class:`NodeStateHistory` keeps the last ``size`` samples in memory (a ring; nothing is
  persisted: the timeline covers this process's uptime). ``sample()`` takes one now; the
  observability hub (hub.py) calls it on its interval, on the background runner.
  ``snapshot()`` returns JSON-able data: ``{"states": [...], "nodes": [...], "samples":
  [{"t": epoch_s, "states": {node: state}}], "now": epoch_s}`` with consecutive identical samples
  kept (the client draws runs; the last one lasts until ``now``, the gateway's clock, not the
  browser's).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from inferlb.fleet.state import Fleet
from inferlb.routing.types import NodeView
from inferlb.types import Clock

__all__ = ["NODE_STATES", "NodeStateHistory", "classify", "node_states"]

NODE_STATES = ("healthy", "cooldown", "ejected", "unhealthy")


def classify(view: NodeView) -> str:
    """One of :data:`NODE_STATES` for a routing view."""
    if view.healthy:
        return "healthy"
    reason = (view.unhealthy_reason or "").lower()
    if reason.startswith("ejected"):
        return "ejected"
    if reason.startswith("cooling"):
        return "cooldown"
    return "unhealthy"


def node_states(fleet: Fleet) -> list[tuple[NodeView, str]]:
    return [(v, classify(v)) for v in fleet.views()]


class NodeStateHistory:
    """A bounded in-memory timeline of node states, sampled from the live fleet."""

    def __init__(self, fleet: Callable[[], Fleet | None], clock: Clock, size: int = 480) -> None:
        self._fleet = fleet
        self._clock = clock
        self._samples: collections.deque[tuple[float, dict[str, str]]] = collections.deque(maxlen=size)

    def sample(self) -> None:
        fleet = self._fleet()
        if fleet is None:
            return
        states = {v.name: state for v, state in node_states(fleet)}
        self._samples.append((round(self._clock.time(), 3), states))

    def snapshot(self) -> dict[str, Any]:
        nodes: dict[str, None] = {}
        for _, states in self._samples:
            nodes.update(dict.fromkeys(states))
        return {
            "states": list(NODE_STATES),
            "nodes": list(nodes),
            "samples": [{"t": t, "states": dict(s)} for t, s in self._samples],
            "now": round(self._clock.time(), 3),
        }
