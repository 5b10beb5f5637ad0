"""Routing vocabulary: what the decision core reads and returns. No I/O, no project imports.

The core sees the fleet only through :class:`NodeView` snapshots and a :class:`RouteRequest`;
it returns a :class:`Decision` whose ``to_json()`` goes into the audit record verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Decision", "Elimination", "Filter", "NodeView", "Picker", "RouteRequest", "Scorer"]


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as routing sees it at one instant.

    ``inflight_*`` are the gateway's own counts; ``waiting`` and ``kv_usage`` come from scraped
    node metrics (None when unknown); ``healthy`` is False while ejected or cooling down.
    """

    name: str
    models: frozenset[str]
    capacity_tokens: int
    max_concurrency: int
    weight: float = 1.0
    inflight_requests: int = 0
    inflight_tokens: int = 0
    waiting: int | None = None
    kv_usage: float | None = None
    healthy: bool = True
    unhealthy_reason: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    tokens_per_s: float | None = None          # learned decode speed (EWMA)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What is being routed: model, token estimate, priority, nodes to avoid."""

    model: str
    prompt_tokens: int
    output_tokens: int
    priority: str | None = None
    exclude: frozenset[str] = frozenset()

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class Elimination:
    node: str
    by: str
    reason: str


@dataclass
class Decision:
    """Candidates, eliminations with reasons, per-scorer scores, the ranked pick."""

    profile: str
    candidates: list[str]
    eliminated: list[Elimination] = field(default_factory=list)
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    ranked: list[str] = field(default_factory=list)
    picker: str = ""

    @property
    def pick(self) -> str | None:
        return self.ranked[0] if self.ranked else None

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "candidates": self.candidates,
            "eliminated": [{"node": e.node, "by": e.by, "reason": e.reason} for e in self.eliminated],
            "scores": self.scores,
            "ranked": self.ranked,
            "picker": self.picker,
            "pick": self.pick,
        }


class Filter(Protocol):
    """Keeps the nodes that may serve; returns (kept, eliminated-with-reason)."""

    type_name: str

    def apply(self, req: RouteRequest, nodes: list[NodeView]) -> tuple[list[NodeView], list[Elimination]]: ...


class Scorer(Protocol):
    """A score in [0, 1] per node; higher is better. The profile weights scorers."""

    type_name: str

    def score(self, req: RouteRequest, node: NodeView) -> float: ...


class Picker(Protocol):
    """Ranks scored nodes; the first is used, the rest are fallbacks. Randomness from ``rng``."""

    type_name: str

    def rank(self, scored: list[tuple[NodeView, float]], rng: Any) -> list[str]: ...
