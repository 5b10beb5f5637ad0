"""Prompt-prefix block hashes, session keys and rendezvous (HRW) weights: pure arithmetic, no I/O.

**Blocks.** vLLM's automatic prefix caching hashes the prompt's KV blocks as a chain: block *i*'s
hash covers its parent's hash and its own tokens, so equal hashes mean equal prefixes up to
that block. The gateway has no tokenizer on the request path (the token count is a byte
estimate, engine/tokens.py), so it chains *text* blocks instead: :data:`BLOCK_CHARS` = 64
characters, which is 16 tokens at the estimator's default of 4 bytes a token, vLLM's default
block size. Only full blocks are hashed (vLLM caches only full blocks too). The text is the
prompt the validator joins (api/validation.py: message texts joined with newlines), so
equal system prompts and equal conversation histories give equal leading blocks. The emulator
hashes its own view of the prompt with the same function for its prefix cache
(inferlb/simulator/prefix_cache.py); the two never need to agree bit for bit, only each with itself.

Hashes are BLAKE2b (8-byte digests): stable across processes and gateway replicas (Python's
``hash`` of a string is salted per process), so several gateways send a prefix to the same node
without sharing any state.

**HRW.** Rendezvous hashing ranks nodes for a key by a per-(node, key) weight; the node with the
highest weight holds the key, and removing a node moves only the keys it held. The weight here
is ``((node_hash ^ mixed_key) × φ64) mod 2⁶⁴`` (a multiplicative hash of the pair, one multiply a
node; the key is mixed once with splitmix64's finaliser): at 10 nodes and 10⁵ keys each node is
first for 9.8-10.1 % of keys, and it costs about a third of a full mix per node.
"""

from __future__ import annotations

import hashlib

__all__ = ["BLOCK_CHARS", "block_hashes", "hrw_weights", "mix64", "name_hash", "text_key"]

BLOCK_CHARS = 64
_M64 = (1 << 64) - 1
_PHI64 = 0x9E3779B97F4A7C15


def _h8(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def block_hashes(text: str, max_blocks: int, block_chars: int = BLOCK_CHARS) -> tuple[int, ...]:
    """Chained hashes of the first ``max_blocks`` full ``block_chars``-character blocks of ``text``:
    ``h[i] = H(h[i-1] ‖ block i)`` (``h[-1]`` = 0). A text shorter than one block has none."""
    n = min(len(text) // block_chars, max_blocks)
    out: list[int] = []
    parent = b"\0" * 8
    for i in range(n):
        block = text[i * block_chars:(i + 1) * block_chars].encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(parent + block, digest_size=8).digest()
        out.append(int.from_bytes(digest, "little"))
        parent = digest
    return tuple(out)


def text_key(value: str) -> int:
    """A stable 64-bit key for a string (a session id): never the string itself in the audit."""
    return _h8(b"session\0" + value.encode("utf-8", "surrogatepass"))


def name_hash(name: str) -> int:
    """A node name's stable 64-bit hash, the node's side of its HRW weights."""
    return _h8(b"node\0" + name.encode("utf-8", "surrogatepass"))


def mix64(z: int) -> int:
    """splitmix64's finaliser: spreads a key's bits before the per-node multiply."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def hrw_weights(node_hashes: list[int], key: int) -> list[int]:
    """The HRW weight of each node (by its :func:`name_hash`) for ``key``; highest wins."""
    k = mix64(key)
    return [((h ^ k) * _PHI64) & _M64 for h in node_hashes]
