"""The routing core as it was before its speed work (main at 21e94db): the built-in plugins of
routing/plugins.py (in routing_reference_plugins.py), ``Router`` and ``Decision`` copied verbatim
(renamed ``Ref*``), so tests/routing/test_routing_differential.py can hold the optimised core to the
same decisions. Plugins that work did not touch (node-selector, rtt, affinity, learned) come from
the registry.

Not used by the product. Change it only to mirror a deliberate change of routing behaviour.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from inferlb.routing.registry import make_plugin
from inferlb.routing.types import JSON_ELIMINATED, JSON_NAMES, JSON_RANKED, JSON_SCORED, NodeView, RouteRequest
from tests.routing.routing_reference_plugins import REF_PLUGINS, RefElimination

__all__ = ["REF_PLUGINS", "RefDecision", "RefElimination", "RefRouter", "ref_router"]


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


class RefRouter:
    """Runs one profile. ``decide`` is pure apart from the picker's own state and ``rng``.

    Sampling (``sample`` = k > 0, the power-of-k-choices family): when more than k nodes could
    serve the request, the filters, scorers and picker see k of them drawn at random (with
    ``rng``; k draws with replacement, repeats dropped, so sometimes a few fewer), so a decision
    costs about the same at 10 and at 1,000 nodes. When the nodes come as a
    :class:`~inferlb.routing.types.NodeList` and the profile filters by model, the draw is
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
