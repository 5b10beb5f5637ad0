"""The ``affinity`` picker: prefix and session affinity by rendezvous hashing with bounded load.

Why a picker and not a scorer: affinity is a *choice among* nodes (this key belongs to that
node, and when that node is too loaded, to the next one in the key's own order), not a property
of one node to be blended with load scores; a scorer's weighted sum can neither keep a key on one
node nor guarantee a load bound. The scorers of the profile still run: requests without a key are
ranked by their total (as ``max-score`` does), and the filters ran before, so affinity never
picks an unhealthy, too small or too loaded node (filters first, then the picker).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from inferlb.routing.prefix import hrw_weights, name_hash
from inferlb.routing.types import NodeView, RouteRequest

__all__ = ["Affinity", "AffinityParams", "affinity_key", "load_bound"]


def _kv_hits(req: RouteRequest) -> dict[str, int] | None:
    """The request's KV-index hits by node when some node holds a leading block, else None
    (no index, or no node holds any: the key's own order decides, as without an index)."""
    kv = req.kv_hits
    if kv is None or not any(h for _, h in kv):
        return None
    return dict(kv)

_MAX_NAMES = 100_000      # node-name hashes kept (a fleet's names; cleared past it)
_DETAIL_ESCAPED = 4       # over-bound nodes listed in the audit detail (all are counted)


class AffinityParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    epsilon: float = Field(0.5, gt=0, le=10)         # load bound: (1 + ε) × the candidates' mean
    min_bound: int = Field(8, ge=1, le=100_000)      # ... but never below this many requests a node
    prefix_blocks: int = Field(16, ge=1, le=1024)    # the key is the hash of this block (or the last full one)
    min_blocks: int = Field(1, ge=1, le=1024)        # fewer full blocks: no prefix key
    session: bool = True                             # a session id, when sent, is the key
    cache_keys: int = Field(4096, ge=0, le=1_000_000)   # keys whose top-k HRW nodes are remembered


def affinity_key(req: RouteRequest, p: AffinityParams) -> tuple[str, int, int] | None:
    """(kind, key, blocks) for ``req``: its session when it sent one (and ``p.session``), else the
    hash of block ``min(prefix_blocks, full blocks)`` of its prompt; None when neither applies."""
    if p.session and req.session is not None:
        return "session", req.session, 0
    n = len(req.prefix)
    if n >= p.min_blocks:
        b = min(n, p.prefix_blocks)
        return "prefix", req.prefix[b - 1], b
    return None


def load_bound(epsilon: float, total_inflight: int, capacity: int, total_capacity: int, min_bound: int = 1) -> int:
    """The most requests a node may hold *with* the new one: ``ceil((1 + ε) × (m + 1) × c / C)``,
    ``m`` the candidates' in-flight requests, ``c / C`` the node's share of their capacity (Mirrokni,
    Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads", weighted by capacity), and
    never below ``min_bound``. The shares add up to 1, so the bounds add up to more than ``m``:
    some node is always under its bound, and the picker never has to break it.

    Why a floor: at low load the rule alone is all granularity (4 nodes, 2 requests in flight:
    the bound is 1, so a node holding one request loses the next turn of its own conversation
    and its cache); a GPU server runs a few sequences at once for the price of one, so a node
    under ``min_bound`` requests is not overloaded (the emulator's engine, after vLLM's, takes
    10 ms a decode step plus 0.1 ms a running sequence: 8 sequences cost 8 % more a step than
    one). SGLang's cache-aware router likewise keeps cache affinity until loads differ by 32
    requests. The defaults (ε = 0.5, floor 8) are HAProxy's ``hash-balance-factor`` 150 with that
    floor; the affinity benchmark (docs/benchmarks.md) shows what ε = 0.25 / floor 4 cost."""
    fair = math.ceil((1.0 + epsilon) * (total_inflight + 1) * capacity / max(1, total_capacity))
    return max(fair, min_bound)


class Affinity:
    """Rendezvous (HRW) order for the request's key, with bounded load. Reads ``name``,
    ``inflight_requests``, ``capacity_tokens`` and the request's ``session`` / ``prefix``.

    For a request with a key (:func:`affinity_key`): the candidates in HRW order for the key; a
    node whose in-flight requests + 1 would pass :func:`load_bound` moves to the end (still a
    fallback), so the pick is the first node in the key's order that is under the bound
    (``epsilon``, ``min_bound``). A
    request without a key is ranked by score (ties at random), as ``max-score``.

    On a sampled fleet (the profile's ``sample``), :meth:`preselect` hands the router the key's
    top-k nodes in HRW order of the model's whole pool instead of a random draw, so a key keeps its
    node at any fleet size; the top-k of the last ``cache_keys`` keys are remembered (a
    conversation's next turn costs a lookup, not a hash a node).

    ``Decision.pick_detail`` says what happened: ``affinity`` (``session`` / ``prefix`` /
    ``none``), the key (12 hex digits, never the session id itself), the block it came from, the
    node HRW put first, and the nodes skipped for load with their load and bound; when the pick
    is not the key's own node because of the load bound, ``escape`` (``from``, ``to`` and a
    ``why`` sentence).

    **KV index.** When the request carries ``kv_hits`` (an event-fed index, routing/kvindex.py,
    says some candidate holds its leading blocks), the order is by blocks held, most first, then
    the key's HRW order (``affinity`` = ``kv-index``); the load bound applies the same way. The
    detail's ``kv_index`` says whether the index was used, the blocks held by the best nodes, or
    the fallback's reason (``req.kv_fallback``: then the order is the gateway-side hash's).
    """

    type_name = "affinity"
    Params = AffinityParams

    def __init__(self, params: AffinityParams | None = None) -> None:
        self.p = params or AffinityParams()
        self.prefix_blocks = self.p.prefix_blocks   # what the request's data must carry (Router reads it)
        self._names: dict[str, int] = {}
        self._top: OrderedDict[tuple[int, int, int], tuple[tuple[int, ...], tuple[str, ...]]] = OrderedDict()

    def _hashes(self, nodes: list[NodeView]) -> list[int]:
        names = self._names
        if len(names) > _MAX_NAMES:
            names.clear()
        out: list[int] = []
        for n in nodes:
            h = names.get(n.name)
            if h is None:
                h = names[n.name] = name_hash(n.name)
            out.append(h)
        return out

    def preselect(self, req: RouteRequest, pool: list[NodeView], k: int) -> list[NodeView] | None:
        found = affinity_key(req, self.p)
        hits = _kv_hits(req)
        if hits is not None:
            # The nodes the KV index says hold the most leading blocks first, then the key's HRW order.
            held = sorted((i for i, n in enumerate(pool) if hits.get(n.name, 0) > 0),
                          key=lambda i: -hits.get(pool[i].name, 0))[:k]
            if found is not None and len(held) < k:
                weights = hrw_weights(self._hashes(pool), found[1])
                taken = set(held)
                rest = heapq.nlargest(k, (i for i in range(len(pool)) if i not in taken), key=weights.__getitem__)
                held.extend(rest[:k - len(held)])
            return [pool[i] for i in held]
        if found is None:
            return None
        key = found[1]
        size = len(pool)
        ck = (key, size, k)
        hit = self._top.get(ck)
        if hit is not None:
            idx, names = hit
            if all(pool[i].name == nm for i, nm in zip(idx, names, strict=True)):
                self._top.move_to_end(ck)
                return [pool[i] for i in idx]
        weights = hrw_weights(self._hashes(pool), key)
        top = tuple(heapq.nlargest(k, range(size), key=weights.__getitem__))
        if self.p.cache_keys:
            self._top[ck] = (top, tuple(pool[i].name for i in top))
            if len(self._top) > self.p.cache_keys:
                self._top.popitem(last=False)
        return [pool[i] for i in top]

    def rank(self, scored: list[tuple[NodeView, float]], rng: random.Random) -> list[str]:
        """Without the request: by score (the router calls :meth:`rank_detail`)."""
        # As max-score ranks: a list comprehension, sorted in place (a generator's frame per item costs more).
        r = rng.random
        keyed = [(-s, r(), n.name) for n, s in scored]
        keyed.sort()
        return [name for _, _, name in keyed]

    def rank_for(self, req: RouteRequest, scored: list[tuple[NodeView, float]], rng: random.Random) -> list[str]:
        """The ranking of :meth:`rank_detail` without its explanation (an off-policy replay's view)."""
        return self.rank_detail(req, scored, rng)[0]

    def rank_detail(self, req: RouteRequest, scored: list[tuple[NodeView, float]],
                    rng: random.Random) -> tuple[list[str], dict[str, Any]]:
        found = affinity_key(req, self.p)
        hits = _kv_hits(req)
        if found is None and hits is None:
            why = "no session id and no full prompt block" if self.p.session else "no full prompt block"
            detail: dict[str, Any] = {"affinity": "none", "reason": why}
            if req.kv_fallback is not None:
                detail["kv_index"] = {"used": False, "fallback": req.kv_fallback}
            return self.rank(scored, rng), detail
        if not scored:
            return [], {"affinity": "kv-index" if hits is not None else found[0] if found else "none",
                        "reason": "no candidate"}
        nodes = [n for n, _ in scored]
        if hits is not None:
            # Longest cached prefix first (the engines' own word, through their KV events); among
            # equals the key's HRW order (so a new prefix still lands where its key belongs), else
            # the profile's score.
            kind = "kv-index"
            if found is not None:
                key, blocks = found[1], found[2]
                w = hrw_weights(self._hashes(nodes), key)
                order = sorted(range(len(nodes)), key=lambda i: (hits.get(nodes[i].name, 0), w[i]), reverse=True)
            else:
                key, blocks = 0, 0
                order = sorted(range(len(nodes)), reverse=True,
                               key=lambda i: (hits.get(nodes[i].name, 0), scored[i][1], rng.random()))
        else:
            kind, key, blocks = found   # type: ignore[misc]
            weights = hrw_weights(self._hashes(nodes), key)
            order = sorted(range(len(nodes)), key=weights.__getitem__, reverse=True)
        total = sum(n.inflight_requests for n in nodes)
        eps, floor = self.p.epsilon, self.p.min_bound
        # load_bound, inlined: the per-candidate part is one multiply
        per_cap = (1.0 + eps) * (total + 1) / max(1, sum(n.capacity_tokens for n in nodes))
        ceil = math.ceil
        under: list[str] = []
        over: list[str] = []
        escaped: list[dict[str, Any]] = []   # the nodes ahead of the pick in the key's order: over their bound
        skipped = 0
        for i in order:
            n = nodes[i]
            if n.inflight_requests < floor or n.inflight_requests + 1 <= ceil(per_cap * n.capacity_tokens):
                under.append(n.name)
            else:
                over.append(n.name)
                if not under:
                    skipped += 1
                    if len(escaped) < _DETAIL_ESCAPED:
                        escaped.append({"node": n.name, "inflight": n.inflight_requests,
                                        "bound": max(ceil(per_cap * n.capacity_tokens), floor)})
        first = nodes[order[0]].name
        detail = {"affinity": kind, "key": f"{key:016x}"[:12], "hrw_first": first,
                  "epsilon": eps, "min_bound": floor, "candidates_inflight": total,
                  "escaped": escaped, "escaped_total": skipped}
        if kind == "prefix":
            detail["blocks"] = blocks
        if hits is not None:
            best = sorted(((hits.get(n.name, 0), n.name) for n in nodes), reverse=True)[:_DETAIL_ESCAPED]
            detail["kv_index"] = {"used": True, "blocks": req.kv_blocks,
                                  "held": {name: h for h, name in best if h > 0}}
        elif req.kv_hits is not None:
            detail["kv_index"] = {"used": True, "blocks": req.kv_blocks, "held": {}}
        elif req.kv_fallback is not None:
            detail["kv_index"] = {"used": False, "fallback": req.kv_fallback}
        if skipped and under:
            # The key's own node was passed over for load alone (bounded-load rule): say so in
            # words; the request-end metrics count these (inferlb_routing_affinity_escapes_total).
            top = escaped[0]
            detail["escape"] = {
                "from": first, "to": under[0],
                "why": (f"{first}, first in this {kind} key's order, holds {top['inflight']} request(s): one more "
                        f"would pass its load bound of {top['bound']} ((1 + {eps:g}) × its capacity share of the "
                        f"candidates' {total} in flight, at least {floor}), so {under[0]}, the next under its "
                        f"bound in the key's order, takes it")}
        return under + over, detail
