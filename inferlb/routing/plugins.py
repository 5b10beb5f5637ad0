"""Built-in routing plugins: filters, scorers and pickers.

Each plugin has a stable ``type_name``, a params model rejecting unknown keys, and a docstring
saying what it reads. All are pure and synchronous.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from inferlb.routing.types import Elimination, NodeView, RouteRequest, set_terms

__all__ = [
    "DecodeSpeed",
    "HasCapacity",
    "Healthy",
    "KVCacheScorer",
    "LeastRequests",
    "MaxScore",
    "NoParams",
    "OutstandingTokens",
    "PowerOfTwo",
    "QueueDepth",
    "RoundRobin",
    "ServesModel",
    "StaticWeight",
    "WeightedRandom",
    "healthy_and_serving",
    "token_aware_kept_totals",
    "token_aware_totals",
]


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- filters

# Elimination reasons, formatted only when read (Elimination.later): a decision's audit copy
# reads the first few; the count by filter and the discrete-event simulation read none.


def _not_served(model: str) -> str:
    return f"does not serve {model}"


def _at_max(inflight_requests: int) -> str:
    return f"{inflight_requests} requests in flight (max)"


def _never_fits(tokens: int, capacity: int) -> str:
    return f"{tokens} tokens never fit capacity {capacity}"


def _over_capacity(inflight_tokens: int, tokens: int, capacity: int) -> str:
    return f"{inflight_tokens}+{tokens} tokens over capacity {capacity}"



class Healthy:
    """Drops nodes that are ejected, cooling down (429) or loading. Reads ``healthy``."""

    type_name = "healthy"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        pass

    def apply(self, req: RouteRequest, nodes: list[NodeView]) -> tuple[list[NodeView], list[Elimination]]:
        kept = [n for n in nodes if n.healthy]
        if len(kept) == len(nodes):
            return kept, []
        out = [Elimination(n.name, self.type_name, n.unhealthy_reason or "unhealthy") for n in nodes if not n.healthy]
        return kept, out


class ServesModel:
    """Drops nodes that do not serve ``req.model``. Reads ``models``."""

    type_name = "serves-model"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        pass

    def apply(self, req: RouteRequest, nodes: list[NodeView]) -> tuple[list[NodeView], list[Elimination]]:
        model = req.model
        kept = [n for n in nodes if model in n.models]
        if len(kept) == len(nodes):
            return kept, []
        by = self.type_name
        out = [Elimination.later(n.name, by, _not_served, model) for n in nodes if model not in n.models]
        return kept, out


def healthy_and_serving(req: RouteRequest, nodes: list[NodeView]) -> tuple[list[NodeView], list[Elimination]]:
    """``healthy`` then ``serves-model`` (the router runs them as one filter when a profile lists
    them first, one after the other): the same nodes kept, the same eliminations in the same order
    (the unhealthy nodes, then the healthy ones that do not serve ``req.model``), in one pass over
    the nodes when none is dropped, two when only unhealthy ones are, instead of two or three."""
    model = req.model
    kept = [n for n in nodes if n.healthy and model in n.models]
    if len(kept) == len(nodes):
        return kept, []
    out = [Elimination(n.name, "healthy", n.unhealthy_reason or "unhealthy") for n in nodes if not n.healthy]
    if len(kept) + len(out) < len(nodes):   # some healthy nodes do not serve the model
        later = Elimination.later
        out.extend([later(n.name, "serves-model", _not_served, model) for n in nodes
                    if n.healthy and model not in n.models])
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

    def apply(self, req: RouteRequest, nodes: list[NodeView]) -> tuple[list[NodeView], list[Elimination]]:
        room = self.p.token_headroom
        tokens = req.tokens
        fits_somewhere = False
        for n in nodes:
            if tokens <= n.capacity_tokens * room:
                fits_somewhere = True
                break
        # The rules below, each capacity × room computed once: ``tokens <= c or not fits`` is
        # ``not (fits and tokens > c)``, ``it <= 0 or it + tokens <= c`` is ``not (it > 0 and
        # it + tokens > c)`` (integers and a finite c: no NaN to tell them apart).
        kept: list[NodeView] = [n for n in nodes if n.inflight_requests < n.max_concurrency
                and ((c := n.capacity_tokens * room) >= tokens or not fits_somewhere)
                and ((it := n.inflight_tokens) <= 0 or it + tokens <= c)]
        if len(kept) == len(nodes):
            return kept, []
        kept = []
        out: list[Elimination] = []
        by = self.type_name
        later = Elimination.later
        for n in nodes:   # the same rules, in order, now naming why (formatted only if read)
            if n.inflight_requests >= n.max_concurrency:
                out.append(later(n.name, by, _at_max, n.inflight_requests))
            elif fits_somewhere and tokens > n.capacity_tokens * room:
                out.append(later(n.name, by, _never_fits, tokens, n.capacity_tokens))
            elif n.inflight_tokens > 0 and n.inflight_tokens + tokens > n.capacity_tokens * room:
                # An idle node always takes a request, even one larger than its budget.
                out.append(later(n.name, by, _over_capacity, n.inflight_tokens, tokens, n.capacity_tokens))
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
        # ``x if x > 0.0 else 0.0`` is max(0.0, x) without the call (NaN and -0.0 give 0.0 in both).
        return [x if (x := 1.0 - (n.inflight_tokens + t) / n.capacity_tokens) > 0.0 else 0.0 for n in nodes]


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
        return [1.0 / (1.0 + (w if (w := n.waiting) is not None else (r - 1 if (r := n.inflight_requests) > 1 else 0)))
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
        # max(0.0, min(1.0, y)) without the calls: y below 1 is clamped at 0; 1 and above, or NaN, give 1.0.
        return [0.5 if (kv := n.kv_usage) is None else ((y if y > 0.0 else 0.0) if (y := 1.0 - kv) < 1.0 else 1.0)
                for n in nodes]


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
            best: float | None = None     # the fastest known speed (max() keeps the first of equals too)
            for n in nodes:
                s = n.tokens_per_s
                if s is not None and s > 0 and (best is None or s > best):
                    best = s
            if best is not None:
                prior = best
        ref, out = self.p.reference_s, req.output_tokens
        return [ref / (ref + out / (s if (s := n.tokens_per_s) is not None and s > 0 else prior)) for n in nodes]


def token_aware_totals(req: RouteRequest, nodes: list[NodeView], ws: tuple[float, float, float, float],
                       total_w: float, speed: DecodeSpeedParams) -> list[float]:
    """The weighted totals of ``outstanding-tokens``, ``queue-depth``, ``kv-cache`` and
    ``decode-speed`` (weights ``ws`` in that order, divided by ``total_w``) in one pass over the
    nodes, without their columns: each term is the scorer's own ``score_all`` expression and the
    sum runs in the router's order, ``((0.0 + a·w0) + b·w1 + c·w2 + e·w3) / total_w``, so every
    total is the very float the four scorers and the router's weigher give."""
    w0, w1, w2, w3 = ws
    t = req.tokens
    prior = speed.unknown_tokens_per_s
    if req.output_tokens <= speed.optimistic_max_tokens:
        # As DecodeSpeed.score_all: the fastest known speed (max() keeps the first of equals;
        # NaN and ≤ 0 are not known speeds).
        best = max([s for n in nodes if (s := n.tokens_per_s) is not None and s > 0], default=None)
        if best is not None:
            prior = best
    ref, out = speed.reference_s, req.output_tokens
    return [(0.0 + (x if (x := 1.0 - (n.inflight_tokens + t) / n.capacity_tokens) > 0.0 else 0.0) * w0
             + 1.0 / (1.0 + (q if (q := n.waiting) is not None else (r - 1 if (r := n.inflight_requests) > 1 else 0)))
             * w1
             + (0.5 if (kv := n.kv_usage) is None else ((y if y > 0.0 else 0.0) if (y := 1.0 - kv) < 1.0 else 1.0))
             * w2
             + ref / (ref + out / (v if (v := n.tokens_per_s) is not None and v > 0 else prior)) * w3) / total_w
            for n in nodes]


def view_terms(n: NodeView) -> tuple[float, float, float, float | None] | tuple[()]:
    """What token-aware's rules compute from the view alone, in one tuple memoised on the view
    (``NodeView._terms``: a view never changes, so neither do these): its ``queue-depth`` and
    ``kv-cache`` scores (their ``score_all`` expressions: the same floats), its capacity as a
    float (``capacity_tokens * 1.0``: has-capacity's bound for a ``token_headroom`` of 1) and its
    known decode speed (``tokens_per_s`` when not None and > 0, else None); or ``()`` (false) for a view that
    is unhealthy or at ``max_concurrency`` (the healthy filter's and has-capacity's first test
    drop it) or whose scores cannot be computed (a division by zero, a value too large: a bad
    ``waiting``), which the one-pass path then leaves to the filters and scorers as usual (they
    drop it, or raise as they did)."""
    t = n._terms
    if t is None:
        r = n.inflight_requests
        if n.healthy and r < n.max_concurrency:
            s = n.tokens_per_s
            try:
                t = (1.0 / (1.0 + (q if (q := n.waiting) is not None else (r - 1 if r > 1 else 0))),
                     0.5 if (kv := n.kv_usage) is None else ((y if y > 0.0 else 0.0) if (y := 1.0 - kv) < 1.0 else 1.0),
                     n.capacity_tokens * 1.0,
                     s if s is not None and s > 0 else None)
            except (ArithmeticError, TypeError):
                t = ()
        else:
            t = ()
        set_terms(n, t)
    return t


def _fastest(nodes: list[NodeView], default: float) -> float:
    """The fastest known speed among ``nodes`` (``tokens_per_s`` not None and > 0: NaN and ≤ 0
    are not known speeds), ``default`` when none has one: ``DecodeSpeed.score_all``'s prior."""
    return max([s for n in nodes if (s := n.tokens_per_s) is not None and s > 0], default=default)


def token_aware_kept_totals(ws: tuple[float, float, float, float], total_w: float, speed: DecodeSpeedParams,
                            room: float) -> Callable[[RouteRequest, list[NodeView]], list[float] | None]:
    """``healthy`` then ``has-capacity`` (``token_headroom`` ``room``) and, when they keep every
    node, :func:`token_aware_totals` over them, in one pass: a function of ``(req, nodes)`` that
    gives the totals, or None when a node would be eliminated (the caller then runs the filters as
    usual; nothing was changed or drawn).

    The same totals: a node is kept by both filters exactly when it is healthy and below
    ``max_concurrency`` (its :func:`view_terms` are not ``()``) and passes has-capacity's token
    rules (``HasCapacity.apply``'s comprehension, with ``fits_somewhere`` over every node: when
    every node is kept, every node is healthy, so that is the set has-capacity would look at).
    Each term is :func:`token_aware_totals`' expression (queue-depth's and kv-cache's as the view
    memoised them), summed in the same order; the
    fastest known speed (decode-speed's prior for a node without one) is found when a node first
    needs it, over every node (the same set, the same value), so a fleet whose speeds are all known
    skips that pass. Written as source for these weights, as ``profiles._weigher`` is: ``x · 1`` is
    ``x`` for every float, and ``0.0 + a`` is ``a`` for the first term, which is ``+0.0`` or
    positive (never ``-0.0`` or NaN) when its weight is 1; the division by a total weight of 1 is
    left out (``x / 1`` is ``x``)."""
    w0, w1, w2, w3 = ws
    # m: the view's own terms (view_terms): queue-depth, kv-cache, capacity, known speed; () when not kept.
    a = "(x if (x := 1.0 - u / n.capacity_tokens) > 0.0 else 0.0)"   # u: it + t, bound by the test below
    b = "m[0]"
    c = "m[1]"
    e = ("ref / (ref + out / (v if (v := m[3]) is not None else "
         "(prior if prior is not None else (prior := fastest(nodes, unknown)))))")
    total = a if w0 == 1.0 else f"(0.0 + {a} * w0)"
    for term, w, wname in ((b, w1, "w1"), (c, w2, "w2"), (e, w3, "w3")):
        total += f"\n               + {term}" if w == 1.0 else f"\n               + {term} * {wname}"
    if total_w != 1.0:
        total = f"({total}) / total_w"
    # capacity × room: the view's own capacity as a float (m[2], the same product) for a room of 1.0
    cap = "m[2]" if type(room) is float and room == 1.0 else "n.capacity_tokens * room"
    # A loop, not a comprehension: the names its tests and terms bind (m, c, it, u, x, v, prior)
    # would be cells of the function in a comprehension (each read and write through the cell,
    # the cells and the comprehension's function made on every call); here they are plain
    # locals. The same tests and the same expressions in the same order, for every node (a node
    # that fails a test is skipped, as the comprehension's ``if`` skips it), so the same totals,
    # the same memo writes and the same errors.
    src = ("def kept_totals(req, nodes):\n"
           "    out = req.output_tokens\n"
           "    t = req.prompt_tokens + out   # req.tokens, without the property's call\n"
           "    fits = False\n"
           "    for n in nodes:\n"
           "        if t <= n.capacity_tokens * room:\n"
           "            fits = True\n"
           "            break\n"
           "    prior = None if out <= optimistic else unknown   # None: the fastest known, when needed\n"
           "    totals = []\n"
           "    add = totals.append\n"
           "    for n in nodes:\n"
           "        if not (m := n._terms or terms_of(n)):\n"
           "            continue\n"
           f"        if not ((c := {cap}) >= t or not fits):\n"
           "            continue\n"
           # has-capacity's ``it <= 0 or it + t <= c``, the other way round (pure tests of
           # numbers: the same truth), so that it + t is bound for the totals
           "        if not ((u := (it := n.inflight_tokens) + t) <= c or it <= 0):\n"
           "            continue\n"
           f"        add({total})\n"
           "    return totals if len(totals) == len(nodes) else None\n")
    env: dict[str, Any] = {"w0": w0, "w1": w1, "w2": w2, "w3": w3, "total_w": total_w, "room": room,
                           "ref": speed.reference_s, "unknown": speed.unknown_tokens_per_s,
                           "optimistic": speed.optimistic_max_tokens, "fastest": _fastest,
                           "terms_of": view_terms}
    code: dict[str, Any] = {}
    exec(src, env, code)   # our own source: the weights decide which terms are written, nothing from config
    kept_totals: Callable[[RouteRequest, list[NodeView]], list[float] | None] = code["kept_totals"]
    return kept_totals


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

    def score_all(self, req: RouteRequest, nodes: list[NodeView]) -> list[float]:
        m = self.p.max_weight
        # ``x if x < 1.0 else 1.0`` is min(1.0, x) without the call (NaN gives 1.0 in both).
        return [x if (x := n.weight / m) < 1.0 else 1.0 for n in nodes]


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
        r = rng.random
        return _sorted_names([(-s, r(), n.name) for n, s in scored])

    def rank_totals(self, nodes: list[NodeView], totals: list[float], rng: random.Random) -> list[str]:
        """``rank(list(zip(nodes, totals)), rng)`` without building the pairs (what the router
        calls): the same keys, the same draws in the same order, so the same ranking and the same
        generator state. ``nodes`` and ``totals`` must be of one length (ValueError otherwise)."""
        return _sorted_names(self.keys(nodes, totals, rng))

    def keys(self, nodes: list[NodeView], totals: list[float], rng: random.Random) -> list[tuple[float, float, str]]:
        """The sort keys :meth:`rank_totals` sorts, in ``nodes``' order (its draws, one per node)."""
        if len(nodes) != len(totals):
            raise ValueError("nodes and totals of unequal length")
        r = rng.random
        # Checked above: zip's strict keyword is parsed on every call, a cost per decision.
        return [(-s, r(), n.name) for n, s in zip(nodes, totals)]  # noqa: B905


def _sorted_names(keyed: list[tuple[float, float, str]]) -> list[str]:
    """max-score's ranking from its sort keys ``(-total, draw, name)`` (sorted in place)."""
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
        # Names and weights in two lists: each draw sums the weights left (``sum`` over the list,
        # in order: the same float as over (name, weight) pairs) and walks them subtracting, the
        # first to bring x to ≤ 0 taken, else the last (x NaN included).
        names = [n.name for n, _ in scored]
        ws = [1e-6 if s < 1e-6 else s for _, s in scored]   # max(s, 1e-6) (NaN kept, as max keeps it)
        out: list[str] = []
        r = rng.random
        while ws:
            x = r() * sum(ws)
            i = 0
            for w in ws:
                x -= w
                if x <= 0:
                    break
                i += 1
            else:
                i -= 1
            out.append(names.pop(i))
            del ws[i]
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
    """Ignores scores: rotates through the candidates in name order (a baseline).

    ``rank_views`` is what the router calls (the scores are not read, so no (node, score) pairs
    are built for it); ``rank`` is the same over scored pairs. Both visit every candidate, so
    the cost is linear in the fleet: one pass for the names, one sort (nearly free when the
    names come in order, as a fleet file's usually do; skipped when they are the very names of
    the previous call), one rotation. ``rank_names`` starts from the names: the router's filter
    memo (routing/memo.py) hands over the same list while the candidates stay the same, so the
    rotation alone is left."""

    type_name = "round-robin"
    Params = NoParams

    def __init__(self, params: NoParams | None = None) -> None:
        self._i = 0
        self._last_in: list[str] = []        # the previous call's names as given ...
        self._last_sorted: list[str] = []    # ... and sorted, twice over (each rotation is one slice of it)

    def rank(self, scored: list[tuple[NodeView, float]], rng: Any) -> list[str]:
        return self._rotate([n.name for n, _ in scored])

    def rank_views(self, nodes: list[NodeView], rng: Any) -> list[str]:
        return self._rotate([n.name for n in nodes])

    def rank_names(self, names: list[str], rng: Any) -> list[str]:
        """``rank_views`` from the candidates' names (in the views' order; a list the caller
        never changes: the router's filter memo hands the same one over while the candidates stay)."""
        return self._rotate(names)

    def _rotate(self, names: list[str]) -> list[str]:
        if not names:
            return []
        # The same names as last time (the very list, or compared by identity first: the views'
        # own strings, so this is a pointer check per node) sort the same: keep that order.
        if names is self._last_in or names == self._last_in:
            twice = self._last_sorted
        else:
            order = sorted(names)
            twice = order + order
            self._last_in, self._last_sorted = names, twice
        n = len(names)
        k = self._i % n
        self._i += 1
        # order[k:] + order[:k], as one slice of the order written twice (one list built, not three).
        return twice[k:k + n]
