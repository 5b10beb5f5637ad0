"""The pair pick of prefill/decode disaggregation: one prefill node and one decode node per request.

Contract: :func:`pick_pair` is pure and I/O-free. It reads the request (:class:`RouteRequest`), the
node views and each node's role (``prefill`` | ``decode`` | ``both``, from the fleet file) and
returns a :class:`PairDecision`: a :class:`Decision` per leg, each with its candidates,
eliminations with reasons, per-scorer scores and ranking, so the audit record shows why each
node of the pair was chosen.

- Both legs keep only nodes that serve the model, are healthy, are not in ``req.exclude``
  (already tried: a failed prefill node is not picked again for the retried pair), are among
  ``req.only`` (the model version's nodes) and meet ``req.selector``.
- Prefill leg (roles ``prefill``, ``both``): a node at its ``max_concurrency`` is eliminated.
  Scores: ``prefill-load`` = 1 − (prompt tokens queued on the node + this prompt) ÷ its token
  capacity (the gateway counts a prefill leg as its prompt tokens, so on a prefill node its
  in-flight tokens are the prompt tokens queued there), ``queue`` = 1 ÷ (1 + the node's scraped
  waiting count); total = 0.8 · prefill-load + 0.2 · queue.
- Decode leg (roles ``decode``, ``both``): a node at its ``max_concurrency`` or without room for the
  request's tokens (prompt + output) is eliminated. Scores: ``decode-load`` = 1 − (in-flight tokens
  + this request's) ÷ capacity, ``kv`` = 1 − the scraped KV-cache use (the decode-load score when
  unscraped); total = 0.5 · decode-load + 0.5 · kv.
- Each leg ranks by total, ties broken by ``rng`` (so equal nodes share the load), the rest of the
  ranking being the fallbacks.
- ``mode`` ``"colocated"`` (no prefill leg, the decode pick serves the whole request) when the
  prompt is under ``min_prompt_tokens``, when ``colocated`` is asked (an endpoint that cannot be
  split), when the best prefill node is the decode node itself (a ``both`` node), or when no
  prefill node is up and ``colocated_fallback`` allows it; ``"none"`` when no pair can serve.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferlb.routing.types import Decision, Elimination, NodeView, RouteRequest

__all__ = ["PROFILE", "PairDecision", "pick_pair"]

PROFILE = "prefill-decode"
_PREFILL = frozenset({"prefill", "both"})
_DECODE = frozenset({"decode", "both"})
_PREFILL_KEYS = ("prefill-load", "queue", "total")
_DECODE_KEYS = ("decode-load", "kv", "total")


@dataclass(frozen=True)
class PairDecision:
    """The pair: ``decode`` (its pick serves the client), ``prefill`` (None: no prefill leg),
    ``mode`` (``disaggregated`` | ``colocated`` | ``none``) and ``reason`` in words."""

    decode: Decision
    prefill: Decision | None
    mode: str
    reason: str

    @property
    def prefill_node(self) -> str | None:
        """The prefill leg's node (None: colocated, or no pair)."""
        return self.prefill.pick if self.prefill is not None and self.mode == "disaggregated" else None

    @property
    def decode_node(self) -> str | None:
        return self.decode.pick

    def to_json(self) -> dict[str, Any]:
        """The audit record's routing part: the decode leg's decision (its pick is the node that
        answers), with ``disaggregation``: mode, reason, the pair, and the prefill leg's decision."""
        out = self.decode.to_json()
        out["disaggregation"] = {
            "mode": self.mode, "reason": self.reason,
            "pair": {"prefill": self.prefill_node, "decode": self.decode_node},
            "prefill": self.prefill.to_json() if self.prefill is not None else None,
        }
        return out


def _common(req: RouteRequest, v: NodeView, roles: Mapping[str, str], wanted: frozenset[str]) -> str | None:
    """Why ``v`` cannot run this leg at all (None: it can be considered)."""
    if req.model not in v.models:
        return "does not serve the model"
    if roles.get(v.name, "both") not in wanted:
        return f"role {roles.get(v.name, 'both')}"
    if v.name in req.exclude:
        return "already tried"
    if req.only is not None and v.name not in req.only:
        return "not a node of the model version"
    if not v.healthy:
        return v.unhealthy_reason or "unhealthy"
    if req.selector is not None and not req.selector.matches(v.labels):
        return f"does not meet {req.selector.describe()}"
    return None


def _rank(rows: dict[str, tuple[float, ...]], rng: random.Random) -> list[str]:
    keyed = [(-row[-1], rng.random(), name) for name, row in rows.items()]
    keyed.sort()
    return [name for _, _, name in keyed]


def _prefill_leg(req: RouteRequest, views: Sequence[NodeView], roles: Mapping[str, str],
                 rng: random.Random) -> Decision:
    cand: list[str] = []
    elim: list[Elimination] = []
    rows: dict[str, tuple[float, ...]] = {}
    for v in views:
        if req.model not in v.models:
            continue
        why = _common(req, v, roles, _PREFILL)
        if why is None and v.inflight_requests >= v.max_concurrency:
            why = f"full: {v.inflight_requests} requests in flight (max {v.max_concurrency})"
        if why is not None:
            elim.append(Elimination(v.name, "prefill-leg", why))
            continue
        cand.append(v.name)
        load = max(0.0, 1.0 - (v.inflight_tokens + req.prompt_tokens) / max(1, v.capacity_tokens))
        queue = 1.0 / (1.0 + (v.waiting or 0))
        rows[v.name] = (load, queue, 0.8 * load + 0.2 * queue)
    return Decision(PROFILE, cand, elim, _PREFILL_KEYS, rows, _rank(rows, rng), picker="max-score",
                    offered=len(views))


def _decode_leg(req: RouteRequest, views: Sequence[NodeView], roles: Mapping[str, str],
                rng: random.Random) -> Decision:
    cand: list[str] = []
    elim: list[Elimination] = []
    rows: dict[str, tuple[float, ...]] = {}
    need = req.tokens
    for v in views:
        if req.model not in v.models:
            continue
        why = _common(req, v, roles, _DECODE)
        if why is None and v.inflight_requests >= v.max_concurrency:
            why = f"full: {v.inflight_requests} requests in flight (max {v.max_concurrency})"
        if why is None and v.inflight_tokens > 0 and v.inflight_tokens + need > v.capacity_tokens:
            why = f"no room: {v.inflight_tokens} + {need} tokens over {v.capacity_tokens}"
        if why is not None:
            elim.append(Elimination(v.name, "decode-leg", why))
            continue
        cand.append(v.name)
        load = max(0.0, 1.0 - (v.inflight_tokens + need) / max(1, v.capacity_tokens))
        kv = 1.0 - min(1.0, max(0.0, v.kv_usage)) if v.kv_usage is not None else load
        rows[v.name] = (load, kv, 0.5 * load + 0.5 * kv)
    return Decision(PROFILE, cand, elim, _DECODE_KEYS, rows, _rank(rows, rng), picker="max-score",
                    offered=len(views))


def pick_pair(req: RouteRequest, views: Sequence[NodeView], roles: Mapping[str, str], *,
              rng: random.Random, min_prompt_tokens: int = 0, colocated_fallback: bool = True,
              colocated: bool = False) -> PairDecision:
    """The pair for ``req`` (see the module docstring); ``roles``: node name → role (absent: both)."""
    decode = _decode_leg(req, views, roles, rng)
    if decode.pick is None:
        return PairDecision(decode, None, "none", "no decode-capable node can serve")
    if colocated:
        return PairDecision(decode, None, "colocated", "the endpoint is served whole")
    if req.prompt_tokens < min_prompt_tokens:
        return PairDecision(decode, None, "colocated",
                            f"prompt of {req.prompt_tokens} tokens under min_prompt_tokens {min_prompt_tokens}")
    prefill = _prefill_leg(RouteRequest(req.model, req.prompt_tokens, 1, req.priority, req.exclude, False,
                                        req.deadline_s, req.prefix, req.session, req.selector, req.only),
                           views, roles, rng)
    if prefill.pick is None:
        if colocated_fallback:
            return PairDecision(decode, prefill, "colocated", "no prefill-capable node up: served whole")
        return PairDecision(Decision(PROFILE, decode.candidates, decode.eliminated, decode.score_keys,
                                     decode.score_rows, [], picker=decode.picker, offered=decode.offered),
                            prefill, "none", "no prefill-capable node up")
    if prefill.pick == decode.pick:
        # A ``both`` node is best for both legs: prefer the best other prefill node, else serve whole.
        other = [n for n in prefill.ranked if n != decode.pick]
        if not other:
            return PairDecision(decode, prefill, "colocated", "the only prefill-capable node is the decode node")
        prefill.ranked = [*other, decode.pick]
    return PairDecision(decode, prefill, "disaggregated", "picked")
