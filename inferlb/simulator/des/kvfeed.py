"""The event-fed prefix index in the discrete-event simulation: the nodes' prefix caches publish
their KV events (inferlb/simulator/prefix_cache.py ``sink``), which reach the gateway's index
(:class:`~inferlb.routing.kvindex.KVIndex`, the one the gateway runs) ``lag_s`` later; routing
reads the index as the gateway does (the request's emulated tokens, chained:
:func:`~inferlb.routing.kvindex.sim_chain_keys`), and falls back to the gateway-side hash when
the index says a node's stream is stale.

Contract of :class:`KVFeed`:

* :meth:`sink_for` is a node's cache sink: the event is stamped with the simulation's time
  (``clock``, set by the caller: ``feed.clock = lambda: sim.now``) and queued; it is applied to
  the index when the time reaches its stamp + ``lag_s``. From ``drop_at`` on (None: never) a
  node's events are lost, as a stream that died (``drop_nodes``: the nodes whose stream dies,
  None: all).
* :meth:`route_inputs` is what ``SimRequests._dispatch`` reads: the per-node hits on the
  candidates (every node the index knows, or whose stream is fresh), the full blocks, and the
  fallback reason (None when the index was used). A node whose stream is stale counts as a
  fallback for the whole request (the index's view of the fleet is then partial: mixing it with
  the hash would send the request where the index's blind spot is least visible), as the
  gateway's service does.
* :meth:`sent` is told a request with at least one full block went to a node (the index's
  silence detection).
* Counters: ``used``, ``fallbacks`` (by reason), ``applied``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from inferlb.routing.kvindex import KVIndex, sim_chain_keys
from inferlb.simulator.prefix_cache import BLOCK_TOKENS, RemovedEvent, StoredEvent

__all__ = ["KVFeed"]

_MAX_BLOCKS = 1 << 16


class KVFeed:
    """Per-node KV events, delayed by ``lag_s``, feeding one :class:`KVIndex`."""

    def __init__(self, index: KVIndex | None = None, *, lag_s: float = 0.0, drop_at: float | None = None,
                 drop_nodes: Iterable[str] | None = None) -> None:
        self.index = index if index is not None else KVIndex()
        self.lag_s = lag_s
        self.drop_at = drop_at
        self.drop_nodes = frozenset(drop_nodes) if drop_nodes is not None else None
        self.clock: Callable[[], float] = lambda: 0.0
        self._queue: deque[tuple[float, str, StoredEvent | RemovedEvent]] = deque()
        self.used = 0
        self.fallbacks: dict[str, int] = {}
        self.applied = 0

    def sink_for(self, node: str) -> Callable[[StoredEvent | RemovedEvent], None]:
        def sink(event: StoredEvent | RemovedEvent) -> None:
            now = self.clock()
            if self.drop_at is not None and now >= self.drop_at and \
                    (self.drop_nodes is None or node in self.drop_nodes):
                return
            self._queue.append((now + self.lag_s, node, event))
        return sink

    def advance(self, now: float) -> None:
        """Apply every event due at ``now``."""
        q = self._queue
        idx = self.index
        while q and q[0][0] <= now:
            due, node, ev = q.popleft()
            idx.batch(node, None, due - self.lag_s, due)
            if isinstance(ev, StoredEvent):
                idx.stored(node, ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size)
            else:
                idx.removed(node, ev.block_hashes)
            self.applied += 1

    def route_inputs(self, text: str, names: Iterable[str], now: float
                     ) -> tuple[tuple[tuple[str, int], ...] | None, int, str | None]:
        self.advance(now)
        keys = sim_chain_keys(text, BLOCK_TOKENS, max_blocks=_MAX_BLOCKS)
        names = list(names)
        if not keys:
            return None, 0, "no full block"
        idx = self.index
        for n in names:
            why = idx.usable(n, now)
            if why is not None and why != "no stream":
                self.fallbacks[why] = self.fallbacks.get(why, 0) + 1
                return None, len(keys), f"{n}: {why}"
        self.used += 1
        hits = idx.match(keys, names)
        return tuple(hits.items()), len(keys), None

    def sent(self, node: str, blocks: int, now: float) -> None:
        if blocks:
            self.index.sent(node, now)
