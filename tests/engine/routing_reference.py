"""The routing core as it was before its speed work (main at
21e94db): the built-in plugins of routing/plugins.py, ``Router`` and ``Decision`` copied verbatim
(renamed ``Ref*``), so tests/engine/test_routing_differential.py can hold the optimised core to the
same decisions. Plugins that work did not touch (node-selector, rtt, affinity, learned) come from
the registry.

Not used by the product. Change it only to mirror a deliberate change of routing behaviour.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from inferlb.engine.routing.registry import make_plugin
from inferlb.engine.routing.types import JSON_ELIMINATED, JSON_NAMES, JSON_RANKED, JSON_SCORED, NodeView, RouteRequest

__all__ = ["REF_PLUGINS", "RefDecision", "RefElimination", "RefRouter", "ref_router"]


@dataclass(frozen=True, slots=True)
class RefElimination:
    node: str
    by: str
    reason: str


@dataclass
class RefDecision:
    """Candidates, eliminations with reasons, per-scorer scores, the ranked pick.

    ``candidates``: the nodes the filters saw (the sample when the router sampled);
    ``offered``: how many nodes routing was offered; ``sampled``: the sample size, None when every
    node was considered; ``counts``: eliminations by filter, nodes skipped for another model
    without being looked at included.
    """

    profile: str
    candidates: list[str]
    eliminated: list[RefElimination] = field(default_factory=list)
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



class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- filters


class Healthy:
    """Drops nodes that are ejected, cooling down (429) or loading. Reads ``healthy``."""

    type_name = "healthy"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        pass

    def apply(self, req: RouteRequest, nodes: list[NodeView]) -> tuple[list[NodeView], list[RefElimination]]:
        kept = [n for n in nodes if n.healthy]
        if len(kept) == len(nodes):
            return kept, []
        out = [RefElimination(n.name, self.type_name, n.unhealthy_reason or "unhealthy")
               for n in nodes if not n.healthy]
        return kept, out


class ServesModel:
    """Drops nodes that do not serve ``req.model``. Reads ``models``."""

    type_name = "serves-model"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        pass

    def apply(self, req: RouteRequest, nodes: list[NodeView]) -> tuple[list[NodeView], list[RefElimination]]:
        model = req.model
        kept = [n for n in nodes if model in n.models]
        if len(kept) == len(nodes):
            return kept, []
        out = [RefElimination(n.name, self.type_name, f"does not serve {model}")
               for n in nodes if model not in n.models]
        return kept, out


class HasCapacityParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token_headroom: float = Field(1.0, gt=0, le=4)   # allowed share of capacity_tokens


class HasCapacity:
    """Drops nodes whose in-flight tokens + this request's would pass capacity, or that are at
    ``max_concurrency``. Reads ``inflight_tokens``, ``capacity_tokens``, ``inflight_requests``.

    A node whose whole capacity is smaller than the request is dropped when another candidate's
    capacity could hold it (a small GPU would refuse it, or thrash); when none could, the old rule
    stands: an idle node always takes a request."""

    type_name = "has-capacity"
    Params = HasCapacityParams

    def __init__(self, params: HasCapacityParams | None = None) -> None:
        self.p = params or HasCapacityParams()

    def apply(self, req: RouteRequest, nodes: list[NodeView]) -> tuple[list[NodeView], list[RefElimination]]:
        room = self.p.token_headroom
        tokens = req.tokens
        fits_somewhere = any(tokens <= n.capacity_tokens * room for n in nodes)
        kept: list[NodeView] = [n for n in nodes if n.inflight_requests < n.max_concurrency
                and not (fits_somewhere and tokens > n.capacity_tokens * room)
                and not (n.inflight_tokens > 0 and n.inflight_tokens + tokens > n.capacity_tokens * room)]
        if len(kept) == len(nodes):
            return kept, []
        kept = []
        out: list[RefElimination] = []
        for n in nodes:   # the same rules, in order, now naming why
            if n.inflight_requests >= n.max_concurrency:
                out.append(RefElimination(n.name, self.type_name, f"{n.inflight_requests} requests in flight (max)"))
            elif fits_somewhere and tokens > n.capacity_tokens * room:
                out.append(RefElimination(n.name, self.type_name,
                                       f"{tokens} tokens never fit capacity {n.capacity_tokens}"))
            elif n.inflight_tokens > 0 and n.inflight_tokens + tokens > n.capacity_tokens * room:
                # An idle node always takes a request, even one larger than its budget.
                out.append(RefElimination(
                    n.name, self.type_name,
                    f"{n.inflight_tokens}+{tokens} tokens over capacity {n.capacity_tokens}"))
            else:
                kept.append(n)
        return kept, out


# ---------------------------------------------------------------- scorers


class OutstandingTokens:
    """1 − (in-flight tokens + this request's) / capacity, floored at 0. Reads
    ``inflight_tokens``, ``capacity_tokens``. The token-aware heart of the default profile."""

    type_name = "outstanding-tokens"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        pass

    def score(self, req: RouteRequest, node: NodeView) -> float:
        return max(0.0, 1.0 - (node.inflight_tokens + req.tokens) / node.capacity_tokens)

    def score_all(self, req: RouteRequest, nodes: list[NodeView]) -> list[float]:
        t = req.tokens
        return [max(0.0, 1.0 - (n.inflight_tokens + t) / n.capacity_tokens) for n in nodes]


class QueueDepth:
    """1 / (1 + waiting requests) from the node's metrics (in-flight requests when unknown)."""

    type_name = "queue-depth"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        pass

    def score(self, req: RouteRequest, node: NodeView) -> float:
        waiting = node.waiting if node.waiting is not None else max(0, node.inflight_requests - 1)
        return 1.0 / (1.0 + waiting)

    def score_all(self, req: RouteRequest, nodes: list[NodeView]) -> list[float]:
        return [1.0 / (1.0 + (w if (w := n.waiting) is not None else max(0, n.inflight_requests - 1)))
                for n in nodes]


class KVCacheScorer:
    """1 − KV-cache use (0..1) from node metrics; 0.5 when unknown."""

    type_name = "kv-cache"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        pass

    def score(self, req: RouteRequest, node: NodeView) -> float:
        return 0.5 if node.kv_usage is None else max(0.0, min(1.0, 1.0 - node.kv_usage))

    def score_all(self, req: RouteRequest, nodes: list[NodeView]) -> list[float]:
        return [0.5 if (kv := n.kv_usage) is None else max(0.0, min(1.0, 1.0 - kv)) for n in nodes]


class DecodeSpeedParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reference_s: float = Field(10.0, gt=0)   # the predicted decode time that scores 0.5
    unknown_tokens_per_s: float = Field(20.0, gt=0)   # assumed until a node's speed is learned
    optimistic_max_tokens: int = Field(256, ge=0)     # up to this output: unknown = fastest known


class DecodeSpeed:
    """``reference_s / (reference_s + output_tokens / tokens_per_s)``: how soon this node would
    finish *this* request's decode at the speed it showed lately (``tokens_per_s``, the gateway's
    EWMA of per-request decode speed, which already reflects the node's batch load). Long requests
    are steered to fast nodes while short ones hardly care, so slow nodes take the short work.
    Reads ``tokens_per_s``.

    A node whose speed is not learned yet is, for a request of at most ``optimistic_max_tokens``
    output tokens, scored as fast as the fastest candidate that has one (``score_all``, what the
    router calls): optimism under uncertainty, so at low load it wins its share of the ties and
    learns its speed from one short answer. Assumed slow, it would lose every request at low load
    to the first node that learned and never learn its own; assumed average (the median), it
    would still lose every tie to the faster nodes. A longer request assumes it slow-ish
    (``unknown_tokens_per_s``): a cold slow GPU must not learn on a 1,024-token answer
    (docs/benchmarks.md). ``unknown_tokens_per_s`` also applies when no candidate has a speed, or
    when one node is scored alone (``score``)."""

    type_name = "decode-speed"
    Params = DecodeSpeedParams

    def __init__(self, params: DecodeSpeedParams | None = None) -> None:
        self.p = params or DecodeSpeedParams()

    def score(self, req: RouteRequest, node: NodeView) -> float:
        speed = node.tokens_per_s
        if speed is None or speed <= 0:
            speed = self.p.unknown_tokens_per_s
        ref = self.p.reference_s
        return ref / (ref + req.output_tokens / speed)

    def score_all(self, req: RouteRequest, nodes: list[NodeView]) -> list[float]:
        prior = self.p.unknown_tokens_per_s
        if req.output_tokens <= self.p.optimistic_max_tokens:
            prior = max((s for n in nodes if (s := n.tokens_per_s) is not None and s > 0), default=prior)
        ref, out = self.p.reference_s, req.output_tokens
        return [ref / (ref + out / (s if (s := n.tokens_per_s) is not None and s > 0 else prior)) for n in nodes]


class StaticWeightParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_weight: float = Field(10.0, gt=0)


class StaticWeight:
    """``weight`` / ``max_weight`` from the fleet file, capped at 1."""

    type_name = "static-weight"
    Params = StaticWeightParams

    def __init__(self, params: StaticWeightParams | None = None) -> None:
        self.p = params or StaticWeightParams()

    def score(self, req: RouteRequest, node: NodeView) -> float:
        return min(1.0, node.weight / self.p.max_weight)


class LeastRequests:
    """1 / (1 + in-flight requests): least-connections as a scorer. Reads ``inflight_requests``."""

    type_name = "least-requests"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        pass

    def score(self, req: RouteRequest, node: NodeView) -> float:
        return 1.0 / (1.0 + node.inflight_requests)

    def score_all(self, req: RouteRequest, nodes: list[NodeView]) -> list[float]:
        return [1.0 / (1.0 + n.inflight_requests) for n in nodes]


# ---------------------------------------------------------------- pickers


class MaxScore:
    """Highest total first; ties broken at random (so equal nodes share load)."""

    type_name = "max-score"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        pass

    def rank(self, scored: list[tuple[NodeView, float]], rng: random.Random) -> list[str]:
        keyed = [(-s, rng.random(), n.name) for n, s in scored]
        keyed.sort()
        return [name for _, _, name in keyed]


class WeightedRandom:
    """Samples without replacement with probability ∝ score (a small floor keeps 0-score nodes
    as last-resort fallbacks)."""

    type_name = "weighted-random"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        pass

    def rank(self, scored: list[tuple[NodeView, float]], rng: random.Random) -> list[str]:
        pool = [(n.name, max(s, 1e-6)) for n, s in scored]
        out: list[str] = []
        while pool:
            total = sum(w for _, w in pool)
            x = rng.random() * total
            for i, (name, w) in enumerate(pool):
                x -= w
                if x <= 0 or i == len(pool) - 1:
                    out.append(name)
                    pool.pop(i)
                    break
        return out


class PowerOfTwo:
    """Two random candidates, the better one first, then the rest by score."""

    type_name = "power-of-two"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        pass

    def rank(self, scored: list[tuple[NodeView, float]], rng: random.Random) -> list[str]:
        if len(scored) <= 2:
            return MaxScore().rank(scored, rng)
        a, b = rng.sample(range(len(scored)), 2)
        first = scored[a] if scored[a][1] >= scored[b][1] else scored[b]
        rest = sorted((x for x in scored if x is not first), key=lambda x: -x[1])
        return [first[0].name] + [n.name for n, _ in rest]


class RoundRobin:
    """Ignores scores: rotates through the candidates in name order (a baseline)."""

    type_name = "round-robin"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        self._i = 0

    def rank(self, scored: list[tuple[NodeView, float]], rng: Any) -> list[str]:
        names = sorted(n.name for n, _ in scored)
        if not names:
            return []
        k = self._i % len(names)
        self._i += 1
        return names[k:] + names[:k]


class RefRouter:
    """Runs one profile. ``decide`` is pure apart from the picker's own state and ``rng``.

    Sampling (``sample`` = k > 0, the power-of-k-choices family): when more than k nodes could
    serve the request, the filters, scorers and picker see k of them drawn at random (with
    ``rng``; k draws with replacement, repeats dropped, so sometimes a few fewer), so a decision
    costs about the same at 10 and at 1,000 nodes. When the nodes come as a
    :class:`~inferlb.engine.routing.types.NodeList` and the profile filters by model, the draw is
    from the model's own pool. When no sampled node passes the filters, every node is considered,
    so sampling never turns a servable request away. A picker with ``preselect`` (the
    ``affinity`` picker) chooses the k instead of the random draw, when it has a reason to.

    ``prefix_blocks``: how many prompt blocks the request's data must carry (the largest any of
    the profile's plugins reads; 0: none, and the prompt is not hashed at all).
    """

    def __init__(self, name: str, filters: list[Any], scorers: list[tuple[Any, float]],
                 picker: Any, rng: random.Random, sample: int = 0) -> None:
        self.name = name
        self.filters = filters
        self.scorers = scorers
        self.picker = picker
        self.rng = rng
        self.sample = sample
        self._by_model = any(f.type_name == "serves-model" for f in filters)
        self._total_w = sum(w for _, w in scorers) or 1.0
        self._rank_for = getattr(picker, "rank_for", None)   # a picker that reads the request (priority)
        self._rank_detail = getattr(picker, "rank_detail", None)   # ... and explains its ranking (affinity)
        self._preselect = getattr(picker, "preselect", None)
        plugins: list[Any] = [*filters, *(s for s, _ in scorers), picker]
        self.prefix_blocks: int = max((int(getattr(p, "prefix_blocks", 0)) for p in plugins), default=0)
        self.uses_selector = any(f.type_name == "node-selector" for f in filters)

    def decide(self, req: RouteRequest, nodes: list[NodeView]) -> RefDecision:
        """Filter, score, rank. Nodes in ``req.exclude`` are eliminated first ("already tried")."""
        pool: list[NodeView] = nodes
        counts: dict[str, int] = {}
        by_model = getattr(nodes, "by_model", None) if self._by_model else None
        if by_model is not None:
            pool = by_model.get(req.model, [])
            if len(nodes) > len(pool):
                counts["serves-model"] = len(nodes) - len(pool)
        k = self.sample
        size = len(pool)
        if 0 < k < size:
            pre = self._preselect
            picked = pre(req, pool, k) if pre is not None else None
            if picked is None:
                # k draws with replacement, repeats dropped: cheaper than rng.sample, same family.
                rnd = self.rng.random
                picked = [pool[i] for i in {int(rnd() * size) for _ in range(k)}]
            d = self._decide(req, picked, len(nodes), dict(counts), len(picked))
            if d.ranked:
                return d
        return self._decide(req, pool, len(nodes), counts, None)

    def _decide(self, req: RouteRequest, nodes: list[NodeView], offered: int, counts: dict[str, int],
                sampled: int | None) -> RefDecision:
        d = RefDecision(self.name, [n.name for n in nodes], picker=self.picker.type_name, offered=offered,
                     sampled=sampled, counts=counts)
        live = nodes
        if req.exclude:
            live = []
            for n in nodes:
                if n.name in req.exclude:
                    d.eliminated.append(RefElimination(n.name, "retry", "already tried for this request"))
                else:
                    live.append(n)
        for f in self.filters:
            if not live:
                break
            live, out = f.apply(req, live)
            if out:
                d.eliminated.extend(out)
        for e in d.eliminated:
            counts[e.by] = counts.get(e.by, 0) + 1
        if not live:
            return d
        if self.scorers:
            keys: list[str] = []
            totals = [0.0] * len(live)
            cols: list[list[float]] = []
            for s, w in self.scorers:
                batch = getattr(s, "score_all", None)
                col = batch(req, live) if batch is not None else [s.score(req, n) for n in live]
                keys.append(s.type_name)
                cols.append(col)
                totals = [t + c * w for t, c in zip(totals, col, strict=True)]
            total_w = self._total_w
            totals = [t / total_w for t in totals]
            keys.append("total")
            d.score_keys = tuple(keys)
            d.score_rows = {n.name: row for n, row in zip(live, zip(*cols, totals, strict=True), strict=True)}
            scored = list(zip(live, totals, strict=True))
        else:
            scored = [(n, 0.0) for n in live]
            d.score_keys = ("total",)
            d.score_rows = {n.name: (0.0,) for n in live}
        rank_detail, rank_for = self._rank_detail, self._rank_for
        if rank_detail is not None:
            d.ranked, d.pick_detail = rank_detail(req, scored, self.rng)
        elif rank_for is not None:
            d.ranked = rank_for(req, scored, self.rng)
        else:
            d.ranked = self.picker.rank(scored, self.rng)
        return d


REF_PLUGINS: dict[str, Any] = {
    "healthy": Healthy, "serves-model": ServesModel, "has-capacity": HasCapacity,
    "outstanding-tokens": OutstandingTokens, "queue-depth": QueueDepth, "kv-cache": KVCacheScorer,
    "static-weight": StaticWeight, "least-requests": LeastRequests, "decode-speed": DecodeSpeed,
    "max-score": MaxScore, "weighted-random": WeightedRandom, "power-of-two": PowerOfTwo, "round-robin": RoundRobin,
}


def ref_router(filters: tuple[str, ...], scorers: dict[str, float], picker: str, *, seed: int, sample: int,
               params: dict[str, dict[str, Any]] | None = None, name: str = "ref") -> RefRouter:
    """A reference router with the old plugins (params validated as ``make_plugin`` does)."""
    params = params or {}

    def make(n: str) -> Any:
        cls = REF_PLUGINS.get(n)
        if cls is None:
            return make_plugin(n, params.get(n))
        return cls(cls.Params.model_validate(params.get(n) or {}))

    return RefRouter(name, [make(f) for f in filters], [(make(s), w) for s, w in scorers.items()], make(picker),
                     random.Random(seed), sample)
