"""Sticky weighted assignment of a request to a model version. Pure, I/O-free.

The rule is weighted rendezvous hashing (highest random weight): for a sticky key ``k`` and each
version ``v`` with weight ``w_v > 0``, draw ``u_v = hash(k, v)`` uniform in (0, 1) and pick the
version with the smallest ``-ln(u_v) / w_v``. Those are independent exponential variables of
rates ``w_v``, so a version is picked with probability ``w_v / Σw``, and:

* the same key always gets the same version while the weights stay (sticky per user);
* raising one version's weight (or lowering others') only ever moves keys *to* it, and lowering
  it only moves keys *away* from it: a key never moves between two versions whose weights kept
  their ratio. Moving from 1 % to 5 % moves about 4 % of the users, all of them to the canary,
  which is the least any split can move; a plain ``hash mod 100`` bucket would do the same for
  two versions but not for three or more.

The hash is BLAKE2b (stdlib, keyed by nothing: the split is not a secret, only stable across
processes and restarts, which Python's ``hash()`` is not).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

__all__ = ["choose", "sticky_key", "unit_hash"]

_SCALE = 2.0 ** 64


def sticky_key(model: str, tenant: str | None, user: str) -> bytes:
    """The bytes a request is assigned by: model, tenant and user (or session) id."""
    return "\x00".join((model, tenant or "", user)).encode("utf-8", "surrogatepass")


def unit_hash(key: bytes, name: str) -> float:
    """A stable number in (0, 1) for ``key`` and version ``name``."""
    digest = hashlib.blake2b(key + b"\x00" + name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / _SCALE


def choose(weights: Sequence[tuple[str, float]], key: bytes) -> str | None:
    """The version ``key`` is assigned to among ``(name, weight)`` pairs; None when no weight is
    positive. Versions of weight 0 are never picked."""
    best: str | None = None
    best_score = math.inf
    for name, w in weights:
        if w <= 0:
            continue
        score = -math.log(unit_hash(key, name)) / w
        if score < best_score:
            best, best_score = name, score
    return best
