"""Routing profiles: named filter → scorer → picker pipelines, and the :class:`Router` that runs one.

Built-in profiles:

Every profile but ``round-robin`` samples 16 candidates on larger fleets (see :class:`Router`).

Every profile filters by ``node-selector`` after ``serves-model`` (a no-op unless the model has a
``node_selector``).

- ``token-aware`` (default): healthy, serves-model, has-capacity; outstanding-tokens ×1.0,
  queue-depth ×0.5, kv-cache ×0.5, decode-speed ×1.0 (long requests to nodes that decode fast
  under their current load; see docs/benchmarks.md for what it changed); max-score.
- ``least-connections``: healthy, serves-model; least-requests; max-score (random ties).
- ``round-robin``: healthy, serves-model; round-robin.
- ``power-of-two``: healthy, serves-model, has-capacity; outstanding-tokens; power-of-two.
- ``weighted``: healthy, serves-model; static-weight; weighted-random.
- ``learned``: healthy, serves-model, has-capacity; predicted-latency ×7 (with the interference
  terms on and the tail reservation off: :data:`LEARNED_LATENCY`),
  outstanding-tokens ×1; softmax-bandit (exploration
  rate ``epsilon``, never for the critical class), guarded by its predictor's lifecycle: while the
  predictor warms up, drifts or faults, ``token-aware`` decides (routing/guarded.py).
- ``prefix-affinity``: token-aware's filters and scorers plus rtt ×0.5; the ``affinity`` picker:
  a request with a session (``x-session-id`` / ``user``) or a prompt of at least one full block
  goes to its key's node in rendezvous-hash order, escaping to the next when that node is past
  (1 + ε) × the candidates' mean load (routing/affinity.py); others by score.
- ``lora-affinity`` (the default of a fleet with a LoRA model, config/lora.py): token-aware's
  filters plus ``lora-available``, its scorers plus lora-affinity ×2 (routing/lora.py: nodes
  running the request's adapter first, then queued, then a free adapter slot; a saturated node
  with the adapter counts as a free slot, so hot adapters spread); max-score.

A profile may be customised in the fleet file (``routing.filters/scorers/picker/params``); a
plugin's params given there are merged over the profile's own (key by key).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from math import trunc
from typing import Any

from inferlb.errors import ConfigError
from inferlb.routing.learned import SoftmaxBandit
from inferlb.routing.memo import MIN_POOL, FilterMemo, per_view
from inferlb.routing.plugins import (
    DecodeSpeed,
    HasCapacity,
    Healthy,
    KVCacheScorer,
    MaxScore,
    OutstandingTokens,
    QueueDepth,
    ServesModel,
    healthy_and_serving,
    token_aware_kept_totals,
    token_aware_totals,
)
from inferlb.routing.registry import make_plugin
from inferlb.routing.selector import NodeSelectorFilter
from inferlb.routing.types import Decision, Elimination, Filter, NodeView, Picker, RouteRequest, Scorer

__all__ = ["FALLBACK_PROFILE", "LEARNED_LATENCY", "PROFILES", "ProfileSpec", "Router", "build_router"]


@dataclass(frozen=True)
class ProfileSpec:
    filters: tuple[str, ...]
    scorers: dict[str, float] = field(default_factory=dict)
    picker: str = "max-score"
    sample: int = 0     # power-of-k: consider k random nodes of the model's pool (0: all)
    # The profile's own plugin params (plugin name → params), under what the caller gives: a
    # caller's key replaces the profile's, the profile's other keys stay.
    params: dict[str, dict[str, Any]] = field(default_factory=dict)


# k = 16 for the score-based profiles: figures and the cost in routing quality in
# docs/benchmarks.md ("Routing decision cost"). A fleet of at most k nodes is never sampled.
SAMPLE = 16

_BASE = ("healthy", "serves-model", "node-selector")
_TOKEN_AWARE = {"outstanding-tokens": 1.0, "queue-depth": 0.5, "kv-cache": 0.5, "decode-speed": 1.0}

# The learned profile's predicted-latency setting (docs/benchmarks.md, "an adaptive tail
# reservation" and its sixth pass): charge short requests (≤ 64 output tokens) 1.25 × the decode
# slowdown they cause the others, and every request the prefill stall it causes. The tail
# reservation (hold 90 % of the fast nodes' token capacity for the top 1.5 % of output budgets)
# is OFF (reserve 0.0; its cut settings kept so ``{"reserve": 0.9}`` turns that setting back on):
# with only the gateway's budget estimates it cost mean e2e and regret in every family of the
# train-seed matrix, most on bimodal lengths where the cut falls inside the long-document mode
# and sends those documents to the slow nodes (docs/benchmarks.md, "The tail reservation off:
# regret in the scenario matrix", issue 22 item 4).
LEARNED_LATENCY: dict[str, Any] = {
    "reserve": 0.0, "reserve_quantile": 0.985, "reserve_window": 4096, "reserve_min_output": 800,
    "reserve_fast": 0.1, "interference": 1.25, "interference_max_output": 64, "prefill_interference": 1.0}

PROFILES: dict[str, ProfileSpec] = {
    "token-aware": ProfileSpec((*_BASE, "has-capacity"), dict(_TOKEN_AWARE), sample=SAMPLE),
    "least-connections": ProfileSpec(_BASE, {"least-requests": 1.0}, sample=SAMPLE),
    "round-robin": ProfileSpec(_BASE, {}, "round-robin"),
    "power-of-two": ProfileSpec((*_BASE, "has-capacity"), {"outstanding-tokens": 1.0}, "power-of-two",
                                sample=SAMPLE),
    "weighted": ProfileSpec(_BASE, {"static-weight": 1.0}, "weighted-random", sample=SAMPLE),
    # predicted-latency ×7 + outstanding-tokens ×1: slack alone sends every request to the fastest
    # predicted node, short ones included, which fills the fast GPUs and slows the long requests
    # that need them (docs/benchmarks.md, "Learned routing: the goals"); with the load term,
    # predicted slack decides where it differs much (long requests) and load where it hardly does
    # (short ones). The weight 7 (was 3, chosen when the router was handed true answer lengths and
    # the tail reservation was on) was chosen among 3/5/7/10 on the scenario matrix's train seeds
    # 1-5 with predicted lengths and the reservation off, then judged once on its test seeds
    # (docs/benchmarks.md, "The learned profile's latency weight, chosen on the train seeds").
    # Its predicted-latency params: LEARNED_LATENCY (below).
    "learned": ProfileSpec((*_BASE, "has-capacity"), {"predicted-latency": 7.0, "outstanding-tokens": 1.0},
                           "softmax-bandit", sample=SAMPLE, params={"predicted-latency": LEARNED_LATENCY}),
    "lora-affinity": ProfileSpec((*_BASE, "lora-available", "has-capacity"), {**_TOKEN_AWARE, "lora-affinity": 2.0},
                                 sample=SAMPLE),
    "prefix-affinity": ProfileSpec((*_BASE, "has-capacity"), {**_TOKEN_AWARE, "rtt": 0.5}, "affinity",
                                   sample=SAMPLE),
}
FALLBACK_PROFILE = "token-aware"   # what a learned profile falls back to
_TOKEN_AWARE_TYPES = (OutstandingTokens, QueueDepth, KVCacheScorer, DecodeSpeed)


class Router:
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

    Model versions: when ``req.only`` is set (the nodes of the request's version), the pool is
    cut to those nodes first, before sampling (so a canary served by 1 node of 100 is always in
    the sample), and the nodes left out are counted under ``model-version`` in the decision.

    A decision over a whole pool (``round-robin``, or a sample that found no candidate) whose
    filters each judge a node by its own view keeps its filter stage for the next one
    (routing/memo.py): only the views that are new objects since the last decision are filtered
    again, with the same result as a full pass.
    """

    def __init__(self, name: str, filters: list[Filter], scorers: list[tuple[Scorer, float]],
                 picker: Picker, rng: random.Random, sample: int = 0) -> None:
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
        # A picker that ranks from the views alone (round-robin: the scores are not read): no
        # (node, score) pairs are built for it. Only when it reads nothing else either.
        rank_views = getattr(picker, "rank_views", None)
        self._rank_views = rank_views if self._rank_for is None and self._rank_detail is None else None
        # The softmax bandit's ranking straight from the nodes and their totals
        # (SoftmaxBandit.rank_totals_for: the same ranking, draws and ``last``, no (node, total)
        # pairs built); not for a subclass with a rank_for of its own.
        self._rank_totals_for: Callable[[RouteRequest, list[NodeView], list[float], random.Random], list[str]] \
            | None = getattr(picker, "rank_totals_for", None) \
            if getattr(type(picker), "rank_for", None) is SoftmaxBandit.rank_for and self._rank_detail is None \
            else None
        plugins: list[Any] = [*filters, *(s for s, _ in scorers), picker]
        self.prefix_blocks: int = max((int(getattr(p, "prefix_blocks", 0)) for p in plugins), default=0)
        self.uses_selector = any(f.type_name == "node-selector" for f in filters)
        # Resolved once: the plugin lists are fixed when the router is built (build_router).
        # The filters to run, by (exact pool, request has a selector): on an exact model pool
        # (NodeList.exact) the built-in serves-model filter would drop nothing, nor would the
        # node-selector filter for a request without a selector; a filter that drops nothing
        # leaves no trace in the decision, so those are skipped.
        # The built-in healthy and serves-model filters, when they come first in that order, run
        # as one (plugins.healthy_and_serving: the same result in fewer passes).
        def applies(exact: bool, sel: bool) -> list[Callable[..., Any]]:
            fs = [f for f in filters
                  if not ((exact and type(f) is ServesModel) or (not sel and type(f) is NodeSelectorFilter))]
            if len(fs) >= 2 and type(fs[0]) is Healthy and type(fs[1]) is ServesModel:
                return [healthy_and_serving, *(f.apply for f in fs[2:])]
            return [f.apply for f in fs]

        self._apply_by = {(exact, sel): applies(exact, sel) for exact in (False, True) for sel in (False, True)}
        # Decisions over a whole pool (unsampled) keep their filter stage from one decision to the
        # next when every filter judges a node by its own view alone (routing/memo.py: the same
        # result); the picker may then read the survivors' names from the memo (``rank_names``).
        self._memo = FilterMemo() if all(per_view(a) for fs in self._apply_by.values() for a in fs) else None
        self._rank_names = getattr(picker, "rank_names", None) if self._rank_views is not None else None
        self._batch = [_batch_of(s) for s, _ in scorers]
        self._keys = (*(s.type_name for s, _ in scorers), "total")
        self._weigh = _weigher([w for _, w in scorers], self._total_w)
        # The built-in token-aware scorers, in the profile's order: their totals in one pass
        # (plugins.token_aware_totals), used when the columns may wait (scores_when_read).
        self._fused: Callable[[RouteRequest, list[NodeView]], list[float]] | None = None
        if tuple(type(s) for s, _ in scorers) == _TOKEN_AWARE_TYPES:
            ws = (scorers[0][1], scorers[1][1], scorers[2][1], scorers[3][1])
            decode = scorers[3][0]
            assert isinstance(decode, DecodeSpeed)
            speed, total_w = decode.p, self._total_w
            self._fused = lambda req, nodes: token_aware_totals(req, nodes, ws, total_w, speed)
        # max-score's ranking straight from the nodes and their totals (MaxScore.rank_totals: the
        # same ranking, no (node, total) pairs built); not for a subclass with a rank of its own.
        self._rank_totals: Callable[[list[NodeView], list[float], random.Random], list[str]] | None = \
            getattr(picker, "rank_totals", None) if getattr(type(picker), "rank", None) is MaxScore.rank \
            and self._rank_for is None and self._rank_detail is None and self._rank_views is None else None
        # token-aware itself (its filters, scorers and max-score) on a sampled exact pool: the
        # filters and the totals in one pass (plugins.token_aware_kept_totals) when they keep
        # every sampled node, as they mostly do; see _decided.
        self._kept_totals: Callable[[RouteRequest, list[NodeView]], list[float] | None] | None = None
        fast_filters = [getattr(a, "__self__", None) for a in self._apply_by[True, False]]
        if self._fused is not None and self._rank_totals is not None and self._preselect is None \
                and [type(f) for f in fast_filters] == [Healthy, HasCapacity]:
            cap = fast_filters[1]
            assert isinstance(cap, HasCapacity)
            self._kept_totals = token_aware_kept_totals(ws, total_w, speed, cap.p.token_headroom)
        # True: a caller that reads only the pick (the discrete-event simulation) lets each
        # decision compute its per-scorer columns when they are first read (its score rows, its
        # audit copy), not while deciding. The same scores either way; only when they are computed.
        self.scores_when_read = False

    def decide(self, req: RouteRequest, nodes: list[NodeView]) -> Decision:
        """Filter, score, rank. Nodes in ``req.exclude`` are eliminated first ("already tried").

        ``nodes`` (and a NodeList's ``by_model`` lists) are never changed here. The decision
        keeps the pool it considered: a copy of the caller's list, or the list itself when it
        is the router's own (cut to ``req.only``) or a :class:`~inferlb.routing.types.NodeList`
        whose maker promises it never changes (``fixed``)."""
        pool: list[NodeView] = nodes
        counts: dict[str, int] = {}
        by_model = getattr(nodes, "by_model", None) if self._by_model else None
        exact = False
        own = getattr(nodes, "fixed", False)   # the pool may be kept as it is (never changed)
        hint = None
        if by_model is not None:
            pool = by_model.get(req.model, [])
            exact = getattr(nodes, "exact", False)
            if len(nodes) > len(pool):
                counts["serves-model"] = len(nodes) - len(pool)
            if own:   # which views changed since an earlier pool (NodeList.delta): for the filter memo
                delta = getattr(nodes, "delta", None)
                if delta:
                    hint = delta.get(req.model)
        only = req.only
        if only is not None:
            size = len(pool)
            pool = [n for n in pool if n.name in only]
            own = True
            hint = None
            if len(pool) < size:
                counts["model-version"] = size - len(pool)
        k = self.sample
        size = len(pool)
        if 0 < k < size:
            pre = self._preselect
            picked = pre(req, pool, k) if pre is not None else None
            drawn = picked is None      # a preselected list is the picker's: only copies are kept
            if picked is None:
                # k draws with replacement, repeats dropped: cheaper than rng.sample, same family.
                # trunc(x) is int(x) for a float (the same int), at a third of the cost of the call.
                rnd = self.rng.random
                picked = [pool[i] for i in {trunc(rnd() * size) for _ in range(k)}]
                kept_totals = self._kept_totals
                # What _decide would run here: healthy and has-capacity alone (an exact pool, no
                # selector), no retry eliminations, the columns left until read.
                if kept_totals is not None and exact and not req.exclude and req.selector is None \
                        and self.scores_when_read:
                    totals = kept_totals(req, picked)
                    if totals is not None:
                        return self._decided(req, picked, len(nodes), counts, totals)
            d = self._decide(req, picked, len(nodes), dict(counts), len(picked), drawn, exact)
            if d.ranked:
                return d
        return self._decide(req, pool, len(nodes), counts, None, own, exact, hint)

    def _decided(self, req: RouteRequest, picked: list[NodeView], offered: int, counts: dict[str, int],
                 totals: list[float]) -> Decision:
        """The decision :meth:`_decide` makes over the drawn sample ``picked`` (the router's own
        list) when the filters keep every node and ``totals`` are their token-aware totals
        (``_kept_totals``): no elimination, the candidates and the live nodes both ``picked``
        (equal lists there: each filter's kept list is a copy of its input), the columns
        computed when read, and max-score's ranking of the totals (the same draws). ``counts``
        is the caller's, not read after this: no copy."""
        batch = self._batch
        picker = self.picker
        assert isinstance(picker, MaxScore)
        # max-score's ranking as its sorted keys: the names listed only when read (Decision._sampled).
        return Decision._sampled(self.name, picked, picker.type_name, offered, counts, self._keys,
                                 lambda: [score_all(req, picked) for score_all in batch], totals,
                                 picker.keys(picked, totals, self.rng))

    def _decide(self, req: RouteRequest, nodes: list[NodeView], offered: int, counts: dict[str, int],
                sampled: int | None, own: bool, exact: bool = False,
                hint: tuple[list[NodeView], tuple[int, ...]] | None = None) -> Decision:
        """``own``: ``nodes`` is a list the decision may keep (the router's own, such as the
        sample, or a caller's that never changes: see :meth:`decide`); otherwise it belongs to
        the caller and only copies are kept. ``exact``: every node serves ``req.model`` (drawn
        from an exact NodeList pool). ``hint``: ``nodes``' changes since an earlier pool
        (``NodeList.delta``; only for a pool that never changes), passed to the filter memo."""
        # The candidate names are read from the views when first needed (the caller's list is
        # copied, a pointer per node, since the decision keeps it, unless it never changes).
        snap = nodes if own else list(nodes)
        d = Decision._lazy(self.name, snap, self.picker.type_name, offered, sampled, counts)
        eliminated = d.eliminated
        live = nodes
        exclude = req.exclude
        if exclude:
            live = []
            for n in nodes:
                if n.name in exclude:
                    eliminated.append(Elimination(n.name, "retry", "already tried for this request"))
                else:
                    live.append(n)
            for e in eliminated:
                counts[e.by] = counts.get(e.by, 0) + 1
        memo = self._memo if sampled is None and not exclude and len(nodes) >= MIN_POOL else None
        if memo is not None:
            applies = self._apply_by[exact, req.selector is not None]
            # The memo keeps the decision's own copy of the pool (never changed: the candidates').
            live, d.eliminated, by_filter = memo.filter(req, snap, applies,
                                                        (req.model, exact, req.selector, id(applies)),
                                                        hint if snap is nodes else None)
            for by, c in by_filter.items():
                counts[by] = counts.get(by, 0) + c
        else:
            for apply in self._apply_by[exact, req.selector is not None]:
                if not live:
                    break
                live, out = apply(req, live)
                if out:
                    eliminated.extend(out)
                    for e in out:
                        by = e.by
                        counts[by] = counts.get(by, 0) + 1
        if not live:
            return d
        if live is nodes and not own:
            live = list(live)      # the decision keeps it (score rows): not the caller's list
        batch = self._batch
        rank_views = self._rank_views
        if batch:
            fused = self._fused
            if fused is not None and self.scores_when_read:
                totals = fused(req, live)
                scored_live = live
                d._set_scores(self._keys, live, lambda: [score_all(req, scored_live) for score_all in batch], totals)
            else:
                cols = [score_all(req, live) for score_all in batch]
                totals = self._weigh(cols)
                d._set_scores(self._keys, live, cols, totals)
            if rank_views is not None:
                d.ranked = self._rank_names(memo.names(), self.rng) if memo is not None and self._rank_names \
                    else rank_views(live, self.rng)
                return d
            rank_totals = self._rank_totals
            if rank_totals is not None:   # the same ranking as rank() over the (node, total) pairs
                d.ranked = rank_totals(live, totals, self.rng)
                return d
            rank_totals_for = self._rank_totals_for
            if rank_totals_for is not None and len(totals) == len(live):   # the same as rank_for() below
                d.ranked = rank_totals_for(req, live, totals, self.rng)
                return d
            scored = list(zip(live, totals, strict=True))
        elif rank_views is not None:
            ranked = self._rank_names(memo.names(), self.rng) if memo is not None and self._rank_names \
                else rank_views(live, self.rng)
            d._set_zero_scores(self._keys, live, ranked)
            return d
        else:
            d._set_zero_scores(self._keys, live)
            scored = [(n, 0.0) for n in live]
        rank_detail, rank_for = self._rank_detail, self._rank_for
        if rank_detail is not None:
            d.ranked, d.pick_detail = rank_detail(req, scored, self.rng)
        elif rank_for is not None:
            d.ranked = rank_for(req, scored, self.rng)
        else:
            d.ranked = self.picker.rank(scored, self.rng)
        return d


def _batch_of(s: Scorer) -> Callable[[RouteRequest, list[NodeView]], list[float]]:
    """The scorer's ``score_all``, or ``score`` applied per node."""
    batch: Callable[[RouteRequest, list[NodeView]], list[float]] | None = getattr(s, "score_all", None)
    if batch is not None:
        return batch
    score = s.score
    return lambda req, nodes: [score(req, n) for n in nodes]


def _weigher(ws: list[float], total_w: float) -> Callable[[list[list[float]]], list[float]]:
    """Per node, the weighted total of the scorer columns divided by ``total_w``. The sum runs in
    scorer order from 0.0, ``((0.0 + c0·w0) + c1·w1) + …``, so every total is the same float
    whatever the number of scorers: one comprehension over the columns, written as source for
    this many scorers (as :mod:`dataclasses` writes its methods), instead of a pass per scorer.
    A product by a weight of 1 and the division by a total of 1 are left out: ``x · 1`` and
    ``x / 1`` are ``x`` itself for every float (−0.0, infinities and NaN included), and an int
    score meets ``0.0 +`` first, which converts it as ``· 1.0`` would. The columns must be of one
    length (ValueError otherwise, as ``zip(strict=True)`` raises)."""
    n = len(ws)
    if n == 0:
        return lambda cols: []
    terms = "".join(f" + a{j}" if ws[j] == 1.0 else f" + a{j} * w{j}" for j in range(n))
    total = f"(0.0{terms})" if total_w == 1.0 else f"(0.0{terms}) / total_w"
    cs = ", ".join(f"c{j}" for j in range(n))
    a_s = ", ".join(f"a{j}" for j in range(n))
    check = "".join(f"    if len(c{j}) != len(c0):\n        raise ValueError('score columns of unequal length')\n"
                    for j in range(1, n))
    src = (f"def weigh(cols):\n    {cs}, = cols\n{check}"
           + (f"    return [{total} for a0 in c0]\n" if n == 1 else f"    return [{total} for {a_s} in zip({cs})]\n"))
    env: dict[str, Any] = {f"w{j}": w for j, w in enumerate(ws)}
    env["total_w"] = total_w
    code: dict[str, Any] = {}
    exec(src, env, code)   # our own source: the number of scorers, nothing from config
    weigh: Callable[[list[list[float]]], list[float]] = code["weigh"]
    return weigh


def build_router(profile: str, *, filters: list[str] | None = None, scorers: dict[str, float] | None = None,
                 picker: str | None = None, params: dict[str, dict[str, Any]] | None = None,
                 seed: int | None = None, sample: int | None = None, predictor: dict[str, Any] | None = None,
                 lifecycle: Any = None, clock: Any = None, reward: dict[str, Any] | None = None) -> Router:
    """Build a router from a profile name plus overrides; plugin errors raise ConfigError.
    ``sample``: the power-of-k sample size (0: consider every node; default: the profile's).

    A profile with a scorer that needs a latency predictor (one with ``bind``, such as
    ``predicted-latency``) comes back as a :class:`~inferlb.routing.guarded.GuardedRouter`:
    its predictor's lifecycle is ``lifecycle`` when given, else one built from ``predictor`` (the
    fleet file's ``routing.predictor``; ``clock`` gives its events' times), and it falls back to
    :data:`FALLBACK_PROFILE` while the predictor cannot be used; ``reward`` (the fleet file's
    ``routing.reward``) adds its reward bandit (routing/reward.py)."""
    base = PROFILES.get(profile)
    if base is None and filters is None:
        raise ConfigError(f"unknown routing profile {profile!r} (known: {', '.join(sorted(PROFILES))})",
                          path="routing.profile")
    spec = base or ProfileSpec(())
    given = params or {}
    params = {n: {**spec.params.get(n, {}), **given.get(n, {})} for n in {*spec.params, *given}}
    fs: list[Filter] = [make_plugin(n, params.get(n)) for n in (filters if filters is not None else spec.filters)]
    sc: list[tuple[Scorer, float]] = []
    for n, w in (scorers if scorers is not None else spec.scorers).items():
        if w < 0:
            raise ConfigError(f"scorer weight must be ≥ 0, got {w}", path=f"routing.scorers.{n}")
        sc.append((make_plugin(n, params.get(n)), w))
    pk: Picker = make_plugin(picker or spec.picker, params.get(picker or spec.picker))
    k = spec.sample if sample is None else sample
    if k < 0:
        raise ConfigError(f"sample must be ≥ 0, got {k}", path="routing.sample")
    rng = random.Random(seed)
    if any(hasattr(s, "bind") for s, _ in sc):
        from inferlb.routing.guarded import make_guarded

        return make_guarded(profile, fs, sc, pk, rng, k, fallback=build_router(FALLBACK_PROFILE, sample=sample),
                            predictor=predictor, lifecycle=lifecycle, clock=clock, reward=reward)
    return Router(profile, fs, sc, pk, rng, k)
