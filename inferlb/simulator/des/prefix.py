"""The discrete-event simulator's per-node prefix caches: the real-time emulator's cache model
(:class:`~inferlb.simulator.prefix_cache.PrefixCache`, one model for both) behind the
simulation's ``prefill_cached`` hook, and the prompt text routing hashes.

Contract:

* A request's prompt comes from ``prompt_of(request)`` (:class:`PromptInfo`: the text the
  gateway's validator would join, messages joined with newlines, and the session id the client
  sends, if any; None: the request has no text, so no prefix key and no cache hit). The
  simulation reads it through :meth:`PrefixCaches.prompt` for routing
  (``RouteRequest.prefix`` / ``session``, hashed as engine/scope.py ``begin_request`` does) and the
  hook reads it again for the cache; :meth:`PrefixCaches.prompt` remembers the last request's, so
  the text is built once a dispatch.
* :meth:`PrefixCaches.__call__` is the hook: on a node whose spec has ``prefix_cache`` it looks
  the text up in that node's cache (which then holds the whole prompt, as the emulator's does)
  and returns ``min(hit blocks × 16, prompt tokens − 1)`` cached tokens (the last token is always
  computed), exactly what the emulator's node passes to its engine (inferlb/simulator/node.py);
  elsewhere 0. A node's cache is made on its first request with the emulator's capacity rule
  (``prefix_cache_tokens``, else the engine's KV tokens). A node added under a name used before
  gets a cold cache (a new process).
* :meth:`PrefixCaches.finished` is told when a row that reached a node with a cache leaves it:
  when it completed (``output_tokens`` given), its prompt and its answer (the emulator's text for
  that many tokens, ``openai_format.answer_text``, joined as the next turn's prompt joins the
  resent assistant message: :func:`~inferlb.simulator.prefix_cache.finished_sequence`) go into
  that node's cache, as the emulator's node inserts them when its body is written to the end; a
  failed or timed-out row leaves nothing. ``decoded=False`` keeps the older prompt-only model (the
  answer is never cached), for comparison.
* :meth:`PrefixCaches.totals` / :meth:`PrefixCaches.per_node`: the caches' token counters
  (``queries_tokens``: prompt tokens in full blocks, ``hits_tokens``: the cached ones), the hit
  rate being their ratio, as ``/sim/stats`` reports it; :attr:`PrefixCaches.cached` the cached
  tokens the hook returned, by the simulation's row (only rows that reached a node with a cache).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferlb.simulator.des.node import DesNode
from inferlb.simulator.openai_format import answer_text
from inferlb.simulator.prefix_cache import BLOCK_TOKENS, PrefixCache, RemovedEvent, StoredEvent, finished_sequence

__all__ = ["PrefixCaches", "PromptInfo", "PromptOf"]


@dataclass(frozen=True, slots=True)
class PromptInfo:
    """A request's prompt text (as the gateway joins it) and its session id (None: none sent)."""

    text: str
    session: str | None = None


PromptOf = Callable[[Any], "PromptInfo | None"]


class PrefixCaches:
    """One :class:`PrefixCache` per node that has one; see the module docstring."""

    def __init__(self, prompt_of: PromptOf, *, decoded: bool = True,
                 sink_of: Callable[[str], Callable[[StoredEvent | RemovedEvent], None]] | None = None) -> None:
        self._prompt_of = prompt_of
        self.decoded = decoded
        self.sink_of = sink_of     # a node's KV-event sink (simulator/des/kvfeed.py), None: no events
        self._running: dict[int, tuple[PrefixCache, str]] = {}   # row → (its node's cache, its prompt)
        self._last: tuple[object, PromptInfo | None] | None = None
        self._caches: dict[str, tuple[DesNode, PrefixCache]] = {}
        self._retired: list[PrefixCache] = []
        self.cached: dict[int, int] = {}

    def prompt(self, request: object) -> PromptInfo | None:
        """``prompt_of(request)``, remembered for the last request (by identity)."""
        last = self._last
        if last is not None and last[0] is request:
            return last[1]
        info = self._prompt_of(request)
        self._last = (request, info)
        return info

    def cache_of(self, node: DesNode) -> PrefixCache | None:
        """``node``'s cache (made on first use), None when its spec has none."""
        spec = node.spec
        if not spec.prefix_cache:
            return None
        got = self._caches.get(node.name)
        if got is not None and got[0] is node:
            return got[1]
        if got is not None:
            self._retired.append(got[1])
        tokens = spec.prefix_cache_tokens or (spec.batching.kv_tokens if spec.batching is not None else 65_536)
        sink = self.sink_of(node.name) if self.sink_of is not None else None
        cache = PrefixCache(max(1, tokens // BLOCK_TOKENS), sink=sink)
        self._caches[node.name] = (node, cache)
        return cache

    def __call__(self, row: int, request: Any, node: DesNode) -> int:
        cache = self.cache_of(node)
        if cache is None:
            return 0
        info = self.prompt(request)
        if info is None or not info.text:
            self.cached[row] = 0
            return 0
        hit = cache.lookup(info.text)
        cached = min(hit * BLOCK_TOKENS, max(0, int(request.prompt_tokens) - 1))
        self.cached[row] = cached
        if self.decoded:
            self._running[row] = (cache, info.text)
        return cached

    def finished(self, row: int, output_tokens: int | None) -> None:
        """``row`` left its node: completed with ``output_tokens`` (None: failed, timed out)."""
        got = self._running.pop(row, None)
        if got is not None and output_tokens is not None:
            cache, text = got
            cache.insert(finished_sequence(text, answer_text(output_tokens)))

    def per_node(self) -> dict[str, dict[str, int]]:
        """Each live cache's counters (``PrefixCache.to_json``) by node name."""
        return {name: c.to_json() for name, (_, c) in self._caches.items()}

    def totals(self) -> dict[str, float]:
        """Summed counters of every cache (retired ones included) and the hit rate (NaN: no query)."""
        caches = [c for _, c in self._caches.values()] + self._retired
        q = sum(c.queries_tokens for c in caches)
        h = sum(c.hits_tokens for c in caches)
        return {"queries_tokens": q, "hits_tokens": h, "hit_rate": h / q if q else float("nan")}
