"""Routing vocabulary: what the decision core reads and returns. No I/O, no project imports.

The core sees the fleet only through :class:`NodeView` snapshots and a :class:`RouteRequest`;
it returns a :class:`Decision` whose ``to_json()`` goes into the audit record verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Decision", "Elimination", "Filter", "LabelSelector", "NodeList", "NodeView", "Picker", "RouteRequest",
           "Scorer"]

# Bounds of Decision.to_json (the routing part of one audit record), whatever the fleet's size.
JSON_NAMES = 16        # candidate names listed
JSON_ELIMINATED = 6    # eliminations listed one by one (all are counted by filter)
JSON_RANKED = 8        # ranked names listed
JSON_SCORED = 4        # nodes whose per-scorer scores are listed (the best ranked)


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as routing sees it at one instant.

    ``inflight_*`` are the gateway's own counts; ``waiting`` and ``kv_usage`` come from scraped
    node metrics (None when unknown); ``healthy`` is False while ejected or cooling down.
    ``labels``: the node's labels from the fleet file (sorted pairs; the ``node-selector`` filter
    reads them); ``rtt_ms``: the gateway's EWMA of the node's readiness-probe time (None until a
    probe answered; the ``rtt`` scorer reads it).
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
    ttft_s: float | None = None                # recent streamed time to first token (EWMA, seconds)
    rtt_ms: float | None = None                # probe round trip (EWMA), engine/health/isolation.py


class NodeList(list[NodeView]):
    """A list of node views that also carries ``by_model``: model → the views of the nodes
    configured to serve it (same objects, same order). A router may read a model's pool from it
    instead of scanning every node; a plain list works everywhere a NodeList does."""

    __slots__ = ("by_model",)

    def __init__(self, views: list[NodeView], by_model: dict[str, list[NodeView]]) -> None:
        super().__init__(views)
        self.by_model = by_model


class LabelSelector(Protocol):
    """Node labels a request requires (see :mod:`.selector`): ``matches`` a node's labels."""

    def matches(self, labels: tuple[tuple[str, str], ...]) -> bool: ...

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What is being routed: model, token estimate, priority, nodes to avoid; whether the answer
    is streamed and how many seconds are left before its deadline (None: no deadline).

    ``prefix``: chained hashes of the prompt's leading text blocks (:mod:`.prefix`), computed only
    when the router asks for them (``Router.prefix_blocks``); ``session``: a stable 64-bit hash of
    the client's session (``x-session-id`` header, else the body's ``user``), None without one;
    ``selector``: the node labels the model requires (None: any node).
    """

    model: str
    prompt_tokens: int
    output_tokens: int
    priority: str | None = None
    exclude: frozenset[str] = frozenset()
    stream: bool = False
    deadline_s: float | None = None
    prefix: tuple[int, ...] = ()
    session: int | None = None
    selector: LabelSelector | None = None

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
    """Candidates, eliminations with reasons, per-scorer scores, the ranked pick.

    ``candidates``: the nodes the filters saw (the sample when the router sampled);
    ``offered``: how many nodes routing was offered; ``sampled``: the sample size, None when every
    node was considered; ``counts``: eliminations by filter, nodes skipped for another model
    without being looked at included.
    """

    profile: str
    candidates: list[str]
    eliminated: list[Elimination] = field(default_factory=list)
    score_keys: tuple[str, ...] = ()                                    # scorer type names, then "total"
    score_rows: dict[str, tuple[float, ...]] = field(default_factory=dict)   # node → its scores, in that order
    ranked: list[str] = field(default_factory=list)
    picker: str = ""
    offered: int = 0
    sampled: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    # Set by a profile that learns (routing/learned.py): predictions, propensity, exploration,
    # predictor version or why it fell back; its ``to_json()`` is bounded (routing/explain.py).
    learned: Any = None
    pick_detail: dict[str, Any] | None = None   # why the picker ranked as it did (small JSON; None: by score)

    @property
    def scores(self) -> dict[str, dict[str, float]]:
        """Per scored node: each scorer's score and the weighted ``total`` (built when read)."""
        keys = self.score_keys
        return {n: dict(zip(keys, row, strict=True)) for n, row in self.score_rows.items()}

    @property
    def pick(self) -> str | None:
        return self.ranked[0] if self.ranked else None

    def to_json(self) -> dict[str, Any]:
        """The audit record's routing part, bounded whatever the fleet's size (≈ 2 KB at most with
        node names of ~12 characters): the first :data:`JSON_NAMES` candidates, the first
        :data:`JSON_ELIMINATED` eliminations with their reasons and the count of all of them by
        filter, the first :data:`JSON_RANKED` ranked nodes, and the per-scorer scores of the best
        :data:`JSON_SCORED` (rounded to 4 places). ``*_total`` fields give the full lengths of the cut lists.
        ``pick_detail`` is there only when the picker explained its ranking (the ``affinity``
        picker: which key, which node HRW chose, which nodes were over the load bound)."""
        counts = dict(self.counts)
        if not counts:
            for e in self.eliminated:
                counts[e.by] = counts.get(e.by, 0) + 1
        top = self.ranked[:JSON_SCORED]
        keys, rows = self.score_keys, self.score_rows
        out: dict[str, Any] = {
            "profile": self.profile,
            "offered": self.offered or len(self.candidates),
            "sampled": self.sampled,
            "candidates": self.candidates[:JSON_NAMES],
            "candidates_total": len(self.candidates),
            "eliminated": [{"node": e.node, "by": e.by, "reason": e.reason}
                           for e in self.eliminated[:JSON_ELIMINATED]],
            "eliminated_counts": counts,
            "scores": {n: {k: round(v, 4) for k, v in zip(keys, rows[n], strict=True)} for n in top if n in rows},
            "ranked": self.ranked[:JSON_RANKED],
            "ranked_total": len(self.ranked),
            "picker": self.picker,
            "pick": self.pick,
            **({"learned": self.learned.to_json()} if self.learned is not None else {}),
        }
        if self.pick_detail is not None:
            out["pick_detail"] = self.pick_detail
        return out


class Filter(Protocol):
    """Keeps the nodes that may serve; returns (kept, eliminated-with-reason)."""

    type_name: str

    def apply(self, req: RouteRequest, nodes: list[NodeView]) -> tuple[list[NodeView], list[Elimination]]: ...


class Scorer(Protocol):
    """A score in [0, 1] per node; higher is better. The profile weights scorers.

    A scorer may also define ``score_all(req, nodes) -> list[float]`` (one score per node, in
    order); the router then calls it once per decision instead of ``score`` per node. It must
    agree with ``score`` except where it documents what it reads from the other candidates.
    """

    type_name: str

    def score(self, req: RouteRequest, node: NodeView) -> float: ...


class Picker(Protocol):
    """Ranks scored nodes; the first is used, the rest are fallbacks. Randomness from ``rng``.

    A picker that needs the request may also define ``rank_for(req, scored, rng) -> ranked``
    (the router then calls it instead of ``rank``), or ``rank_detail(req, scored, rng) -> (ranked,
    detail)`` (called before either; ``detail``, a small JSON dict or None, is kept as
    :attr:`Decision.pick_detail`). A picker may define ``preselect(req, pool, k)
    -> list[NodeView] | None``: the k candidates to consider on a sampled fleet instead of a random
    draw (None: draw at random); it must be deterministic for a request, pool and k.
    """

    type_name: str

    def rank(self, scored: list[tuple[NodeView, float]], rng: Any) -> list[str]: ...
