"""The emulated node's prefix cache: which blocks' KV it still holds (vLLM's automatic prefix
caching, reduced to what routing can change: the hit length).

Contract: :class:`PrefixCache` is an LRU over chained block hashes
(:func:`inferlb.routing.prefix.block_hashes`: 64-character blocks, 16 tokens at the
emulator's 4 bytes a token, vLLM's default block size; only full blocks). :meth:`PrefixCache.lookup`
returns how many of a prompt's leading blocks are cached and then caches every block of the prompt
(the newest at the LRU's young end). :meth:`PrefixCache.insert` is called when a request has
finished, with :func:`finished_sequence` (its prompt, the separator the next prompt puts before
the assistant message, and the answer the node generated): vLLM keeps every full block of a
finished sequence, the decoded ones included, until it is evicted (SGLang's radix cache keeps
prompt and output alike), so a next turn that resends the answer hits it. A partial last block is
never cached. The capacity is the node's KV tokens in blocks; both calls evict the least recently
used blocks past it. It models the *reuse*, not the memory: cached blocks are not subtracted from
the KV cache a running batch uses. A hit cuts the request's prefill in proportion (the engine
prefills only the uncached tokens; see :mod:`.batching` and :mod:`.node`). Only on when the node's
spec asks for it (``NodeSpec.prefix_cache``): the load generator's prompts all share their leading
text, which would otherwise turn every older benchmark into a cache benchmark.

**KV events.** With ``sink`` set (a callable), every block newly cached is handed a
:class:`StoredEvent` (a run of new blocks of one chain: their hashes, the hash of the block before
them, None at the chain's start, their token ids by :func:`inferlb.routing.kvindex.sim_token_ids`,
:data:`BLOCK_TOKENS` a block) and every eviction a :class:`RemovedEvent` (one per call), in the order they
happened: what vLLM's ``BlockStored`` / ``BlockRemoved`` say. The block hashes are the cache's own
(text hashes), not the tokens' chain a consumer computes: as a real engine's, they are names only.
The emulator's server publishes them (:mod:`.kv_publisher`); the DES feeds them to an index.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from inferlb.routing.kvindex import SIM_CHARS_PER_TOKEN, sim_token_ids
from inferlb.routing.prefix import BLOCK_CHARS, block_hashes

__all__ = ["BLOCK_TOKENS", "PrefixCache", "RemovedEvent", "StoredEvent", "finished_sequence"]

BLOCK_TOKENS = BLOCK_CHARS // SIM_CHARS_PER_TOKEN   # tokens per block at the emulator's 4 bytes a token
_MAX_PROMPT_BLOCKS = 1 << 16        # a 4 MiB prompt's blocks, at most


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """New blocks of one chain (vLLM's ``BlockStored``)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int = BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class RemovedEvent:
    """Blocks evicted (vLLM's ``BlockRemoved``)."""

    block_hashes: tuple[int, ...]


def finished_sequence(prompt: str, answer: str, *, chat: bool = True) -> str:
    """The text a finished request leaves in the cache: ``prompt`` then ``answer``, with the newline
    a chat prompt joins the resent assistant message with (the validator's join; a completion's
    continuation is the two texts back to back). Empty when there is no prompt text."""
    if not prompt:
        return ""
    return prompt + ("\n" if chat else "") + answer


class PrefixCache:
    """LRU of block hashes holding at most ``capacity_blocks``; counts queries and hits in tokens
    (vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits``)."""

    def __init__(self, capacity_blocks: int, *,
                 sink: Callable[[StoredEvent | RemovedEvent], None] | None = None) -> None:
        if capacity_blocks < 1:
            raise ValueError("a prefix cache holds at least one block")
        self.capacity_blocks = capacity_blocks
        self.sink = sink
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.queries_tokens = 0
        self.hits_tokens = 0

    def __len__(self) -> int:
        return len(self._lru)

    def lookup(self, text: str) -> int:
        """Cached blocks at the start of ``text`` (then all its full blocks are cached)."""
        hashes = block_hashes(text, _MAX_PROMPT_BLOCKS)
        lru = self._lru
        hit = 0
        for h in hashes:
            if h not in lru:
                break
            hit += 1
        self._keep(hashes, text)
        self.queries_tokens += len(hashes) * BLOCK_TOKENS
        self.hits_tokens += hit * BLOCK_TOKENS
        return hit

    def insert(self, text: str) -> int:
        """Cache every full block of ``text`` (a finished sequence, :func:`finished_sequence`) as
        :meth:`lookup` caches a prompt's, without counting a query; returns its full blocks."""
        hashes = block_hashes(text, _MAX_PROMPT_BLOCKS)
        self._keep(hashes, text)
        return len(hashes)

    def _keep(self, hashes: tuple[int, ...], text: str) -> None:
        lru = self._lru
        sink = self.sink
        if sink is None:
            for h in hashes:
                if h in lru:
                    lru.move_to_end(h)
                else:
                    lru[h] = None
            while len(lru) > self.capacity_blocks:
                lru.popitem(last=False)
            return
        run: list[int] = []      # indexes of a run of new blocks, published as one BlockStored
        for i, h in enumerate(hashes):
            if h in lru:
                lru.move_to_end(h)
                if run:
                    self._stored(hashes, run, text)
                    run = []
            else:
                lru[h] = None
                run.append(i)
        if run:
            self._stored(hashes, run, text)
        gone: list[int] = []
        while len(lru) > self.capacity_blocks:
            gone.append(lru.popitem(last=False)[0])
        if gone:
            sink(RemovedEvent(tuple(gone)))

    def _stored(self, hashes: tuple[int, ...], run: list[int], text: str) -> None:
        assert self.sink is not None
        first, last = run[0], run[-1] + 1
        tokens = sim_token_ids(text[first * BLOCK_CHARS:last * BLOCK_CHARS])
        self.sink(StoredEvent(hashes[first:last], hashes[first - 1] if first else None, tuple(tokens)))

    def to_json(self) -> dict[str, int]:
        return {"blocks": len(self._lru), "capacity_blocks": self.capacity_blocks,
                "queries_tokens": self.queries_tokens, "hits_tokens": self.hits_tokens}
