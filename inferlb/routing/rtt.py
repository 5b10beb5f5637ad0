"""The ``rtt`` scorer: prefer nodes the gateway reaches quickly (near nodes over edge nodes)."""

from __future__ import annotations

import statistics

from pydantic import BaseModel, ConfigDict, Field

from inferlb.routing.types import NodeView, RouteRequest

__all__ = ["Rtt", "RttParams"]


class RttParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reference_ms: float = Field(10.0, gt=0)   # the round trip that scores 0.5


class Rtt:
    """``reference_ms / (reference_ms + rtt_ms)``: 1 for a node next door, 0.5 at the reference
    round trip, falling towards 0 for far ones. Reads ``rtt_ms`` (the EWMA of the node's
    readiness-probe time, kept by the health monitor).

    A node with no round trip yet (no probe answered) is scored at the candidates' median
    (``score_all``, what the router calls): neither favoured nor punished until it is measured;
    alone (``score``) or with no candidate measured, at the reference (0.5)."""

    type_name = "rtt"
    Params = RttParams

    def __init__(self, params: RttParams | None = None) -> None:
        self.p = params or RttParams()

    def score(self, req: RouteRequest, node: NodeView) -> float:
        ref = self.p.reference_ms
        rtt = node.rtt_ms
        return ref / (ref + (ref if rtt is None or rtt < 0 else rtt))

    def score_all(self, req: RouteRequest, nodes: list[NodeView]) -> list[float]:
        ref = self.p.reference_ms
        known = [r for n in nodes if (r := n.rtt_ms) is not None and r >= 0]
        prior = statistics.median(known) if known and len(known) < len(nodes) else ref
        return [ref / (ref + (r if (r := n.rtt_ms) is not None and r >= 0 else prior)) for n in nodes]
