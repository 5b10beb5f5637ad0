"""The gateway's KV-event service: the event-fed index (inferlb/routing/kvindex.py) for the
nodes whose engines publish, what routing reads from it, and its counters.

Contract of :class:`KVEventsService`:

* :meth:`configure` takes a fleet config (at start and at every reload): the models whose
  ``kv_events`` is set, with their tokenizer (``emulator``: ``sim_token_ids``; ``model``: the
  model's tokenizer.json, loaded once per path; one that does not load makes that model's
  decisions fall back, reason ``no tokenizer``), and the nodes with a ``kv_events`` endpoint
  (a node that left is forgotten). It returns the nodes whose subscription must (re)start and
  those whose must stop; the runner (:mod:`.subscriber`) acts on them.
* :meth:`route_inputs` (the routing step, tasks/routing.py) returns ``(kv_hits, kv_blocks,
  kv_fallback)`` for :class:`~inferlb.routing.types.RouteRequest`: ``(None, 0, None)`` for a model
  without ``kv_events`` (the feature is off: nothing to say); the hits when the request has a
  full block, every candidate publishes and every candidate's stream is fresh; otherwise None
  and the reason (``no prompt text``, ``no tokenizer``, ``no full block``, ``<node>: no events``,
  ``<node>: gap`` / ``lagging`` / ``silent`` / ``disconnected``). A single stale candidate makes
  the whole decision fall back: the hash's order is consistent, a half-known index is not.
  Every decision is counted by outcome and fallback reason (the metrics of :mod:`.metrics`).
* :meth:`sent` is told each dispatch with at least one full block (silence detection).
* :meth:`on_message` handles one subscriber message ``[topic, seq, payload]``: a malformed one
  is counted and skipped; a duplicate (``seq`` not past the last) skipped; a gap returns a
  :class:`Gap` for the subscriber to replay and :meth:`close_gap` closes it (the replayed
  batches, then the one that revealed the gap); otherwise the batch is applied.
* :meth:`snapshot` is the JSON the dashboard and ``/admin`` show: per node, its blocks, stream
  state and counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from inferlb.config.kvevents import KVEventsModel, KVEventsNode
from inferlb.config.settings import FleetConfig
from inferlb.kvevents.wire import (
    AllBlocksCleared,
    Batch,
    BlockRemoved,
    BlockStored,
    decode_batch,
    decode_seq,
    indexable,
)
from inferlb.routing.kvindex import KVIndex, chain_keys, sim_chain_keys, sim_token_ids
from inferlb.types import Clock

__all__ = ["Gap", "KVEventsService", "load_hf_tokenizer"]

_MAX_BLOCKS = 1 << 16        # a request's blocks looked up, at most (1 M tokens at 16 a block)
Tokenize = Callable[[str], Sequence[int]]


def load_hf_tokenizer(path: str) -> Tokenize:
    """A tokenizer.json's ``encode(text).ids`` (needs the ``tokenizers`` extra)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    return lambda text: tok.encode(text).ids


@dataclass(frozen=True, slots=True)
class Gap:
    """Batches ``first`` … ``seq - 1`` were missed; ``batch`` (number ``seq``) waits for them."""

    node: str
    first: int
    seq: int
    batch: Batch


class KVEventsService:
    """See the module docstring."""

    def __init__(self, fleet_cfg: FleetConfig, *, clock: Clock,
                 load_tokenizer: Callable[[str], Tokenize] = load_hf_tokenizer) -> None:
        self.clock = clock
        self._load_tokenizer = load_tokenizer
        k = fleet_cfg.kv_index
        self.index = KVIndex(max_blocks_per_node=k.max_blocks_per_node, max_blocks=k.max_blocks,
                             max_lag_s=k.max_lag_s, recover_s=k.recover_s)
        self.models: dict[str, KVEventsModel] = {}
        self.nodes: dict[str, KVEventsNode] = {}
        self._tokenizers: dict[str, Tokenize | str] = {}    # path → tokenizer, or why it did not load
        self._model_tok: dict[str, Tokenize | str] = {}
        self.decisions: dict[tuple[str, str], int] = {}      # (model, used | fallback) → count
        self.fallbacks: dict[tuple[str, str], int] = {}      # (model, reason) → count
        self.events: dict[tuple[str, str], int] = {}         # (node, event type) → count
        self.batches: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.gaps: dict[tuple[str, str], int] = {}           # (node, replayed | lost) → count
        self.skipped: dict[str, int] = {}                    # blocks kept out (LoRA, other group or medium)
        self.configure(fleet_cfg)

    # -- configuration ---------------------------------------------------------------------

    def configure(self, cfg: FleetConfig) -> tuple[list[str], list[str]]:
        """Take ``cfg``; returns (nodes to (re)subscribe, nodes to unsubscribe)."""
        k = cfg.kv_index
        idx = self.index
        idx.max_blocks_per_node, idx.max_blocks = k.max_blocks_per_node, k.max_blocks
        idx.max_lag_s, idx.recover_s = k.max_lag_s, k.recover_s
        self.models = {m.name: m.kv_events for m in cfg.models if m.kv_events is not None}
        self._model_tok = {}
        for m in cfg.models:
            if m.kv_events is None:
                continue
            if m.kv_events.tokenizer == "emulator":
                self._model_tok[m.name] = sim_token_ids
            elif m.tokenizer:
                got = self._tokenizers.get(m.tokenizer)
                if got is None:
                    try:
                        got = self._load_tokenizer(m.tokenizer)
                    except Exception as exc:   # an optional extra or a file: the decisions fall back, saying why
                        got = f"{type(exc).__name__}: {exc}"[:200]
                    self._tokenizers[m.tokenizer] = got
                self._model_tok[m.name] = got
            else:
                self._model_tok[m.name] = "no tokenizer configured"
        new = {n.name: n.kv_events for n in cfg.nodes if n.kv_events is not None}
        start = [n for n, c in new.items() if self.nodes.get(n) != c]
        stop = [n for n, c in self.nodes.items() if new.get(n) != c]
        for n in stop:
            if n not in new:
                idx.drop_node(n)
            else:
                idx.disconnected(n, self.clock.time())   # a new endpoint: what the old one said is void
        self.nodes = new
        return start, stop

    def tokenizer_problem(self, model: str) -> str | None:
        tok = self._model_tok.get(model)
        return tok if isinstance(tok, str) else None

    # -- the routing step ------------------------------------------------------------------

    def route_inputs(self, model: str, text: str | None, names: Iterable[str]
                     ) -> tuple[tuple[tuple[str, int], ...] | None, int, str | None]:
        mk = self.models.get(model)
        if mk is None:
            return None, 0, None
        now = self.clock.time()
        why: str | None = None
        keys: list[int] = []
        names = list(names)
        tok = self._model_tok.get(model)
        if not text:
            why = "no prompt text"
        elif tok is None or isinstance(tok, str):
            why = "no tokenizer"
        else:
            keys = (sim_chain_keys(text, mk.block_size, max_blocks=_MAX_BLOCKS) if tok is sim_token_ids
                    else chain_keys(tok(text), mk.block_size, max_blocks=_MAX_BLOCKS))
            if not keys:
                why = "no full block"
        if why is None:
            for n in names:
                if n not in self.nodes:
                    why = f"{n}: no events"
                    break
                state = self.index.usable(n, now)
                if state is not None and state != "no stream":
                    why = f"{n}: {state}"
                    break
        if why is not None:
            self._count(self.decisions, (model, "fallback"))
            self._count(self.fallbacks, (model, why.rpartition(": ")[2]))
            return None, len(keys), why
        self._count(self.decisions, (model, "used"))
        hits = self.index.match(keys, names)
        return tuple(hits.items()), len(keys), None

    def sent(self, node: str, blocks: int) -> None:
        if blocks and node in self.nodes:
            self.index.sent(node, self.clock.time())

    # -- the stream ------------------------------------------------------------------------

    def on_message(self, node: str, frames: Sequence[bytes]) -> Gap | None:
        if len(frames) != 3:
            self._count(self.errors, node)
            return None
        try:
            seq = decode_seq(frames[1])
            batch = decode_batch(frames[2])
        except ValueError:
            self._count(self.errors, node)
            return None
        nx = self.index.node(node)
        expected = 0 if nx.last_seq is None else nx.last_seq + 1
        state = self.index.batch(node, seq, batch.ts, self.clock.time())
        if state == "old":
            return None
        if state == "gap":
            return Gap(node, expected, seq, batch)
        self.apply(node, batch)
        return None

    def close_gap(self, gap: Gap, replayed: Sequence[tuple[int, bytes]]) -> bool:
        """Apply the replayed ``(seq, payload)`` batches of ``gap`` (in order, duplicates and
        others skipped), then ``gap.batch``; True when they filled it. Otherwise the node's view
        is cleared and stale (``KVIndex.gap_lost``) and only ``gap.batch`` is applied."""
        want = gap.first
        batches: list[Batch] = []
        for seq, payload in replayed:
            if seq < want or seq >= gap.seq:
                continue
            if seq != want:
                break
            try:
                batches.append(decode_batch(payload))
            except ValueError:
                self._count(self.errors, gap.node)
                break
            want += 1
        if want == gap.seq:
            for b in batches:
                self.apply(gap.node, b)
            self.index.resumed(gap.node, gap.seq)
            self._count(self.gaps, (gap.node, "replayed"))
        else:
            self.index.gap_lost(gap.node, gap.seq, self.clock.time())
            self._count(self.gaps, (gap.node, "lost"))
        self.apply(gap.node, gap.batch)
        return want == gap.seq

    def apply(self, node: str, batch: Batch) -> None:
        idx = self.index
        self._count(self.batches, node)
        for ev in batch.events:
            if isinstance(ev, AllBlocksCleared):
                self._count(self.events, (node, "AllBlocksCleared"))
                idx.clear(node)
                continue
            if not indexable(ev):
                self._count(self.skipped, node, len(ev.block_hashes))
            elif isinstance(ev, BlockStored):
                idx.stored(node, ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size)
            elif isinstance(ev, BlockRemoved):
                idx.removed(node, ev.block_hashes)
            self._count(self.events, (node, type(ev).__name__))

    def disconnected(self, node: str) -> None:
        self.index.disconnected(node, self.clock.time())

    # -- reports ---------------------------------------------------------------------------

    def stale(self, node: str) -> str | None:
        state = self.index.usable(node, self.clock.time())
        return None if state == "no stream" else state

    def snapshot(self) -> dict[str, Any]:
        idx = self.index
        nodes: dict[str, Any] = {}
        for name, cfg in sorted(self.nodes.items()):
            nx = idx.nodes.get(name)
            nodes[name] = {
                "endpoint": cfg.endpoint, "replay": cfg.replay_endpoint is not None,
                "blocks": idx.blocks(name), "stale": self.stale(name),
                "last_seq": nx.last_seq if nx is not None else None,
                "last_batch_at": nx.last_batch_at if nx is not None else None,
                "batches": self.batches.get(name, 0), "errors": self.errors.get(name, 0),
                "gaps_replayed": self.gaps.get((name, "replayed"), 0), "gaps_lost": self.gaps.get((name, "lost"), 0),
                "orphan_blocks": nx.orphans if nx is not None else 0,
                "evicted_blocks": nx.evicted if nx is not None else 0,
            }
        models = {m: {"tokenizer": c.tokenizer, "block_size": c.block_size,
                      "tokenizer_problem": self.tokenizer_problem(m),
                      "used": self.decisions.get((m, "used"), 0),
                      "fallback": self.decisions.get((m, "fallback"), 0)} for m, c in sorted(self.models.items())}
        return {"models": models, "nodes": nodes, "blocks": idx.total,
                "max_blocks": idx.max_blocks, "max_blocks_per_node": idx.max_blocks_per_node}

    @staticmethod
    def _count(d: dict[Any, int], key: Any, n: int = 1) -> None:
        d[key] = d.get(key, 0) + n
