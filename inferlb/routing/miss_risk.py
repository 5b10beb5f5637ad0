"""A learned probability that an answer misses its SLO, per (node, load band, kind): the risk term.

Goodput counts a request by whether it met its SLO. On a node whose KV cache is nearly full a few
answers wait seconds while most are fast (docs/benchmarks.md, "Why learned's streams miss their TTFT
on homog12 / bimodal"), so a regression of the *mean* latency stays low there while the *share* of
misses is plain in the gateway's own load: the in-flight tokens it has placed on the node ÷ the
node's token capacity, at the decision. :class:`MissRisk` keeps, for each key (node name, band of
that load, *kind* of request: an int the caller draws, e.g. streamed or not), decayed
Beta-Bernoulli counts of the answers' outcomes, and answers P(miss) for a candidate by one
dictionary lookup.

Contract:

* **Bands.** ``edges`` (increasing, in (0, ∞)): a load ``u`` = in-flight tokens ÷ capacity is in
  band ``k`` = the number of edges ≤ ``u``. A node with no capacity (≤ 0) has no band: it is never
  charged and teaches nothing.
* **Estimate.** With ``m``, ``n`` the key's decayed misses and answers, and ``M``, ``N`` those of
  its (band, kind) pooled over every node: ``pool = (M + r₀·s₀) / (N + s₀)`` (the prior rate
  ``r₀`` with strength ``s₀`` pseudo-answers), and ``P = (m + s₀·pool) / (n + s₀)``, so a node
  never seen in a band is judged by the band's pool, and the pool by the prior.
* **Forgetting.** Each update of a key (and of its pool) multiplies that key's counts by
  ``γ = 0.5 ** (1 / half_life)`` before adding the answer: an answer ``half_life`` answers of the
  same key ago weighs one half. No clock: the same answers give the same state.
* **Cost.** :meth:`probabilities` is O(candidates), a dictionary lookup each and one output list;
  :meth:`observe` is O(1).
* **Key.** ``key`` "node" (the default) counts each node apart, by its name; "class" pools the
  nodes of one GPU class under one key (:func:`class_of`: the node's ``gpu`` / ``gpu_type`` label,
  as routing/features.py reads it, else its token capacity), so a class learns from all its nodes'
  answers. Callers give :meth:`observe` the key :meth:`key_of` draws from the pick's view.
* **State** lives in memory only: not saved with the predictor (routing/predictor_state.py) nor
  shared between gateway processes (learned/share.py); a restarted gateway starts from the prior
  and re-learns from its next answers.

Pure and synchronous; no I/O, no clock.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Literal

from inferlb.routing.types import NodeView

__all__ = ["MissRisk", "class_of"]


def class_of(view: NodeView) -> str:
    """The GPU class of a node: its first ``gpu`` / ``gpu_type`` label, lower-cased (the label
    routing/features.py reads), else ``"cap:<its token capacity>"`` (nodes of one GPU type serving
    one model share it; the simulator's views carry no labels)."""
    for k, v in view.labels:
        if k in ("gpu", "gpu_type"):
            return v.lower()
    return f"cap:{view.capacity_tokens}"


class MissRisk:
    """Decayed Beta-Bernoulli miss counts per (node, load band, kind); see the module docstring."""

    def __init__(self, edges: Sequence[float] = (0.8, 0.9, 0.95), *, half_life: float = 200.0,
                 prior_rate: float = 0.01, prior_n: float = 20.0,
                 key: Literal["node", "class"] = "node") -> None:
        es = [float(e) for e in edges]
        if any(not (e > 0) for e in es) or any(b <= a for a, b in itertools.pairwise(es)):
            raise ValueError(f"band edges must be > 0 and increasing, got {list(edges)!r}")
        if not half_life > 0 or not 0 <= prior_rate <= 1 or not prior_n > 0:
            raise ValueError("half_life and prior_n must be > 0, prior_rate in [0, 1]")
        if key not in ("node", "class"):
            raise ValueError(f"key must be 'node' or 'class', got {key!r}")
        self.by_class = key == "class"
        self.edges = es
        self.decay = 0.5 ** (1.0 / half_life)
        self.prior_rate = prior_rate
        self.prior_n = prior_n
        # (band, kind) -> {node name -> [misses, answers], both decayed; None -> the band's pool}:
        # a decision looks its table up once per band, then each candidate by its name alone (no
        # key built per candidate).
        self.tables: dict[tuple[int, int], dict[str | None, list[float]]] = {}
        self.observed = 0

    def key_of(self, view: NodeView) -> str:
        """The counts' key of ``view``: its name, or its GPU class (:func:`class_of`) when keyed by class."""
        return class_of(view) if self.by_class else view.name

    def band(self, inflight_tokens: int, capacity_tokens: int) -> int | None:
        """The load band of a node with these in-flight tokens and capacity (None: no capacity)."""
        if capacity_tokens <= 0:
            return None
        u = (inflight_tokens if inflight_tokens > 0 else 0) / capacity_tokens
        return bisect.bisect_right(self.edges, u)

    def counts(self, node: str | None, band: int, kind: int) -> list[float] | None:
        """The decayed [misses, answers] of ``node`` (None: the band's pool) in ``band`` and ``kind``."""
        t = self.tables.get((band, kind))
        return None if t is None else t.get(node)

    def observe(self, node: str, inflight_tokens: int, capacity_tokens: int, kind: int, missed: bool) -> None:
        """One answer of ``node`` (a key: :meth:`key_of` of the pick's view), placed when the
        gateway counted these in-flight tokens there."""
        k = self.band(inflight_tokens, capacity_tokens)
        if k is None:
            return
        g = self.decay
        x = 1.0 if missed else 0.0
        t = self.tables.setdefault((k, kind), {})
        for key in (node, None):
            c = t.get(key)
            if c is None:
                t[key] = [x, 1.0]
            else:
                c[0] = c[0] * g + x
                c[1] = c[1] * g + 1.0
        self.observed += 1

    def probability(self, node: str, band: int, kind: int) -> float:
        """P(miss) of an answer placed on ``node`` (a key, as :meth:`observe` takes it) in ``band``
        (see the module docstring)."""
        s = self.prior_n
        pool = self.counts(None, band, kind)
        p0 = self.prior_rate if pool is None else (pool[0] + self.prior_rate * s) / (pool[1] + s)
        c = self.counts(node, band, kind)
        return p0 if c is None else (c[0] + s * p0) / (c[1] + s)

    def probabilities(self, nodes: Sequence[NodeView], kind: int) -> list[float]:
        """P(miss) for each candidate as it is now (0.0 for a node with no capacity): what
        :meth:`band` and :meth:`probability` give, inlined (one call per decision, not three per
        candidate), the same floats."""
        edges = self.edges
        tables = self.tables
        s = self.prior_n
        r0s = self.prior_rate * s
        bisect_right = bisect.bisect_right
        by_class = self.by_class
        empty: dict[str | None, list[float]] = {}
        seen: dict[int, tuple[dict[str | None, list[float]], float]] = {}   # band -> (its table, its pool)
        out: list[float] = []
        for n in nodes:
            cap = n.capacity_tokens
            if cap <= 0:
                out.append(0.0)
                continue
            t = n.inflight_tokens
            k = bisect_right(edges, (t if t > 0 else 0) / cap)
            tp = seen.get(k)
            if tp is None:
                tab = tables.get((k, kind), empty)
                pool = tab.get(None)
                tp = seen[k] = (tab, self.prior_rate if pool is None else (pool[0] + r0s) / (pool[1] + s))
            tab, p0 = tp
            c = tab.get(class_of(n) if by_class else n.name)
            out.append(p0 if c is None else (c[0] + s * p0) / (c[1] + s))
        return out
