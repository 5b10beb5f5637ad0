"""A predictor of known answers for the predicted-latency scorer's tests: per node name, (TTFT, TPOT)."""

from __future__ import annotations

from inferlb.routing.types import NodeView, RouteRequest


class TablePredictor:
    """Per node name: (TTFT, TPOT)."""

    version = 1

    def __init__(self, table: dict[str, tuple[float, float]]) -> None:
        self.table = table

    def predict_nodes(self, req: RouteRequest, nodes: list[NodeView]) -> list[tuple[float, float]]:
        return [self.table[n.name] for n in nodes]
