"""The KV-event-fed prefix index: which token blocks each node's engine holds, as its KV events
said (vLLM's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``). Pure: no I/O, time is
passed in.

**Keys are the gateway's own, not the engine's.** An engine names a block by its own hash
(vLLM: a seeded hash of the parent's hash, the block's token ids and extra keys; the seed is
per deployment, ``PYTHONHASHSEED`` or a random one), which the gateway cannot recompute for a
request. The events carry the blocks' token ids, so the index re-keys every stored block with
:func:`chain_keys` (BLAKE2b over the parent's key and the block's token ids): a request's
tokens, chained the same way, give the same keys. An event's ``parent_block_hash`` is the
engine's name of the parent, found in the node's map from engine hash to gateway key; a
parent the index no longer knows (evicted here, or stored before the subscription began)
leaves the blocks unkeyable: they are counted (``orphans``) and skipped, never guessed.
llm-d's KV-cache manager keys its index the same way (engine keys mapped to request keys
computed from the events' token ids).

**Bounded.** Each node keeps at most ``max_blocks_per_node`` keys (LRU: a block stored again
moves to the young end) and all nodes together at most ``max_blocks``: past it the node holding
the most loses its oldest. An evicted key only makes the index under-count a node's cache.

**Fresh or stale.** :meth:`KVIndex.usable` says why a node's view cannot be trusted now (None:
it can): a sequence gap the publisher could not replay (the node is cleared and stale until
``recover_s`` of clean stream have passed), a batch that arrived more than ``max_lag_s`` after
its own timestamp (stale until a timely one arrives), or silence: a request with at least one
full block was sent to the node more than ``max_lag_s`` ago and no batch came since (the
stream dropped; an idle engine publishes nothing, so silence alone proves nothing).

**Emulated tokens.** :func:`sim_token_ids` is the emulator's tokenizer (4 characters a token,
the emulator's 4 bytes a token on ASCII text), the one function both the emulator's publisher
(inferlb/simulator/prefix_cache.py) and the gateway (for a model whose ``kv_events.tokenizer`` is
``emulator``) use, so their block chains agree by construction.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["ROOT_KEY", "SIM_CHARS_PER_TOKEN", "KVIndex", "NodeIndex", "chain_keys", "sim_chain_keys", "sim_token_ids"]

ROOT_KEY = 0                  # the parent key of a chain's first block
SIM_CHARS_PER_TOKEN = 4       # the emulator's tokens: 4 characters each


def _piece_id(piece: str) -> int:
    return int.from_bytes(hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=4).digest(),
                          "little") & 0x7FFFFFFF


_PIECES: dict[str, int] = {}      # piece → id, memoised (a text's pieces repeat); cleared past _MAX_PIECES
_MAX_PIECES = 1 << 18


def sim_token_ids(text: str) -> list[int]:
    """The emulator's token ids of ``text``: one id (31 bits of BLAKE2b) per 4 characters, the
    last group possibly shorter. Equal texts give equal ids; a shared leading text, equal
    leading ids."""
    memo = _PIECES
    if len(memo) > _MAX_PIECES:
        memo.clear()
    step = SIM_CHARS_PER_TOKEN
    out: list[int] = []
    for i in range(0, len(text), step):
        piece = text[i:i + step]
        t = memo.get(piece)
        if t is None:
            t = memo[piece] = _piece_id(piece)
        out.append(t)
    return out


def chain_keys(token_ids: Sequence[int], block_size: int, parent: int = ROOT_KEY,
               max_blocks: int | None = None) -> list[int]:
    """The gateway's keys of the full ``block_size``-token blocks of ``token_ids``, chained from
    ``parent``: ``k[i] = H(k[i-1] ‖ tokens of block i)``. A partial last block has none."""
    n = len(token_ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    out: list[int] = []
    prev = parent.to_bytes(8, "little")
    pack = struct.Struct(f"<{block_size}I").pack
    blake = hashlib.blake2b
    for i in range(n):
        data = prev + pack(*(t & 0xFFFFFFFF for t in token_ids[i * block_size:(i + 1) * block_size]))
        digest = blake(data, digest_size=8).digest()
        out.append(int.from_bytes(digest, "little"))
        prev = digest
    return out


_CHAINS: dict[tuple[int, str], int] = {}   # (parent key, block text) → key, for sim_chain_keys
_MAX_CHAINS = 1 << 18


def sim_chain_keys(text: str, block_size: int, max_blocks: int | None = None) -> list[int]:
    """The keys of the full ``4 × block_size``-character blocks of ``text`` (what the emulator's
    cache holds and publishes: :func:`chain_keys` of each block's :func:`sim_token_ids`),
    memoised by block: a conversation that resends its history costs a dict lookup a block
    already seen instead of its tokens and a hash (the last :data:`_MAX_CHAINS` blocks are
    remembered). Unlike ``chain_keys(sim_token_ids(text))`` it never counts a block whose last
    token is cut short by the end of the text (a partial block the emulator does not cache)."""
    memo = _CHAINS
    if len(memo) > _MAX_CHAINS:
        memo.clear()
    width = block_size * SIM_CHARS_PER_TOKEN
    n = len(text) // width
    if max_blocks is not None:
        n = min(n, max_blocks)
    out: list[int] = []
    parent = ROOT_KEY
    for i in range(n):
        block = text[i * width:(i + 1) * width]
        key = memo.get((parent, block))
        if key is None:
            key = memo[(parent, block)] = chain_keys(sim_token_ids(block), block_size, parent)[0]
        out.append(key)
        parent = key
    return out


@dataclass
class NodeIndex:
    """One node's blocks: gateway key → engine hash (LRU order) and the reverse map, with its
    stream's state (``stale_until`` / ``stale_reason``; ``lagging``; ``sent_at``: the first
    request sent since the last batch, None when a batch came after it)."""

    keys: OrderedDict[int, Hashable]
    engine: dict[Hashable, int]
    stale_until: float = float("-inf")
    stale_reason: str = ""
    lagging: bool = False
    sent_at: float | None = None
    last_batch_at: float | None = None
    last_seq: int | None = None
    stored: int = 0
    removed: int = 0
    orphans: int = 0
    cleared: int = 0
    gaps: int = 0
    evicted: int = 0


class KVIndex:
    """Per-node prefix blocks fed by KV events; see the module docstring."""

    def __init__(self, *, max_blocks_per_node: int = 1_000_000, max_blocks: int = 4_000_000,
                 max_lag_s: float = 2.0, recover_s: float = 30.0) -> None:
        if max_blocks_per_node < 1 or max_blocks < 1:
            raise ValueError("the index holds at least one block")
        self.max_blocks_per_node = max_blocks_per_node
        self.max_blocks = max_blocks
        self.max_lag_s = max_lag_s
        self.recover_s = recover_s
        self.nodes: dict[str, NodeIndex] = {}
        self._holders: dict[int, set[str]] = {}
        self.total = 0

    def node(self, name: str) -> NodeIndex:
        got = self.nodes.get(name)
        if got is None:
            got = self.nodes[name] = NodeIndex(OrderedDict(), {})
        return got

    def drop_node(self, name: str) -> None:
        """Forget ``name`` (removed from the fleet)."""
        if name in self.nodes:
            self.clear(name)
            del self.nodes[name]

    # -- events ----------------------------------------------------------------------------

    def stored(self, name: str, engine_hashes: Sequence[Hashable], parent: Hashable | None,
               token_ids: Sequence[int], block_size: int) -> int:
        """Apply a ``BlockStored``: returns the blocks keyed (0 when the parent is unknown)."""
        nx = self.node(name)
        if parent is None:
            pkey = ROOT_KEY
        else:
            got = nx.engine.get(parent)
            if got is None:
                nx.orphans += len(engine_hashes)
                return 0
            pkey = got
            nx.keys.move_to_end(pkey)
        keys = chain_keys(token_ids, block_size, pkey, max_blocks=len(engine_hashes))
        for eh, key in zip(engine_hashes, keys, strict=False):
            self._put(name, nx, key, eh)
        nx.stored += len(keys)
        return len(keys)

    def removed(self, name: str, engine_hashes: Iterable[Hashable]) -> int:
        """Apply a ``BlockRemoved``: returns the blocks it knew."""
        nx = self.node(name)
        n = 0
        for eh in engine_hashes:
            key = nx.engine.pop(eh, None)
            if key is not None:
                self._forget(name, nx, key)
                n += 1
        nx.removed += n
        return n

    def clear(self, name: str) -> None:
        """Apply an ``AllBlocksCleared`` (or forget a node's view after a gap)."""
        nx = self.node(name)
        for key in nx.keys:
            h = self._holders.get(key)
            if h is not None:
                h.discard(name)
                if not h:
                    del self._holders[key]
        self.total -= len(nx.keys)
        nx.keys.clear()
        nx.engine.clear()
        nx.cleared += 1

    def _put(self, name: str, nx: NodeIndex, key: int, eh: Hashable) -> None:
        old = nx.keys.get(key)
        if old is not None:
            nx.keys.move_to_end(key)
            if old != eh:
                nx.engine.pop(old, None)
                nx.keys[key] = eh
                nx.engine[eh] = key
            return
        nx.keys[key] = eh
        nx.engine[eh] = key
        self._holders.setdefault(key, set()).add(name)
        self.total += 1
        if len(nx.keys) > self.max_blocks_per_node:
            self._evict(name, nx)
        while self.total > self.max_blocks:
            big = max(self.nodes, key=lambda n: len(self.nodes[n].keys))
            self._evict(big, self.nodes[big])

    def _evict(self, name: str, nx: NodeIndex) -> None:
        key, eh = nx.keys.popitem(last=False)
        nx.engine.pop(eh, None)
        self._drop_holder(name, key)
        self.total -= 1
        nx.evicted += 1

    def _forget(self, name: str, nx: NodeIndex, key: int) -> None:
        nx.keys.pop(key, None)
        self._drop_holder(name, key)
        self.total -= 1

    def _drop_holder(self, name: str, key: int) -> None:
        h = self._holders.get(key)
        if h is not None:
            h.discard(name)
            if not h:
                del self._holders[key]

    # -- the stream ------------------------------------------------------------------------

    def batch(self, name: str, seq: int | None, ts: float | None, now: float) -> str | None:
        """A batch numbered ``seq`` (stamped ``ts`` by the engine) arrived at ``now``: updates the
        node's stream state and returns ``"gap"`` when numbers were skipped, a first batch past 0
        included (the caller replays, then calls :meth:`resumed`, or calls :meth:`gap_lost`), else
        None. A batch whose number is not past the last one (a replayed duplicate) returns
        ``"old"``: the caller skips it."""
        nx = self.node(name)
        out: str | None = None
        if seq is not None and nx.last_seq is not None:
            if seq <= nx.last_seq:
                return "old"
            if seq != nx.last_seq + 1:
                out = "gap"
        elif seq is not None and seq > 0:
            out = "gap"      # the first batch heard is not the publisher's first: 0 … seq - 1 were missed
        if seq is not None and out is None:
            nx.last_seq = seq
        nx.last_batch_at = now
        nx.sent_at = None
        nx.lagging = ts is not None and now - ts > self.max_lag_s
        return out

    def resumed(self, name: str, seq: int) -> None:
        """The batches up to ``seq`` were applied (a replay filled the gap)."""
        self.node(name).last_seq = seq

    def gap_lost(self, name: str, seq: int, now: float) -> None:
        """A gap that could not be replayed: the node's view is cleared and stale for
        ``recover_s`` (the blocks stored in the gap are unknown); the stream resumes at ``seq``."""
        nx = self.node(name)
        self.clear(name)
        nx.gaps += 1
        nx.last_seq = seq
        nx.stale_until = now + self.recover_s
        nx.stale_reason = "gap"

    def disconnected(self, name: str, now: float) -> None:
        """The subscription was lost: stale until a new one has run ``recover_s``."""
        nx = self.node(name)
        self.clear(name)
        nx.last_seq = None
        nx.stale_until = now + self.recover_s
        nx.stale_reason = "disconnected"

    def sent(self, name: str, now: float) -> None:
        """A request with at least one full block was sent to ``name`` at ``now``."""
        nx = self.node(name)
        if nx.sent_at is None:
            nx.sent_at = now

    def usable(self, name: str, now: float) -> str | None:
        """Why ``name``'s view is not to be trusted at ``now`` (``gap``, ``disconnected``,
        ``lagging``, ``silent``, ``no stream``), None when it is."""
        nx = self.nodes.get(name)
        if nx is None:
            return "no stream"
        if now < nx.stale_until:
            return nx.stale_reason or "stale"
        if nx.lagging:
            return "lagging"
        if nx.sent_at is not None and now - nx.sent_at > self.max_lag_s:
            return "silent"
        return None

    # -- lookups ---------------------------------------------------------------------------

    def match(self, keys: Sequence[int], names: Iterable[str]) -> dict[str, int]:
        """How many of ``keys``' leading blocks each of ``names`` holds (consecutive from the first;
        a node holding none is 0)."""
        alive = {n for n in names}
        out = dict.fromkeys(alive, 0)
        holders = self._holders
        for i, key in enumerate(keys):
            h = holders.get(key)
            if not h:
                break
            alive &= h
            if not alive:
                break
            for n in alive:
                out[n] = i + 1
        return out

    def blocks(self, name: str) -> int:
        nx = self.nodes.get(name)
        return len(nx.keys) if nx is not None else 0
