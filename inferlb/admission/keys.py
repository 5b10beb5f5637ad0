"""Tenant API keys: generation, hashing, and the in-memory cache requests are checked against.

Contract:

* A key is ``sk-gw-`` followed by 43 URL-safe characters from :func:`secrets.token_urlsafe` (256
  random bits; docs/reliability.md §7 asks ≥ 128). It is shown once, when created; only its SHA-256 hex
  digest is stored (a fast hash is right for high-entropy secrets: nothing to brute-force) along
  with a short *hint* (prefix and last four characters) so an operator can tell keys apart.
* :meth:`KeyCache.lookup` hashes whatever was presented and always finishes with one
  :func:`hmac.compare_digest` of two 64-character digests, whether or not a key matched, so an
  unknown key, a revoked key and a wrong key cost the same and answer the same (the caller sends
  one 401 for all of them).
* The cache is replaced whole (:meth:`KeyCache.replace`) by the controller's refresh loop, so a
  key revoked by another process (``inferlb keys revoke``) stops working within
  ``admission.keys_refresh_s``; in this process, the admin API refreshes at once. While the
  database is away the cache keeps serving for ``admission.keys_max_stale_s`` after its last
  load, then :meth:`KeyCache.expire` empties it (authenticated requests get 503
  ``keys_unavailable`` instead of a 401 until the database answers again). On PostgreSQL a key
  created or revoked anywhere reloads the cache at once (the store's ``NOTIFY``,
  admission/store.py and admission/service.py).
* :class:`MissGuard` bounds the database look-ups of keys the cache does not know (the controller's
  ``find_key``): a digest the database just said is unknown is not asked again for ``ttl_s``,
  and at most ``per_s`` look-ups a second (a bucket of ``per_s`` tokens, at least one; 0: none,
  the cache alone answers) are let through for the whole gateway; past that an unknown key is a
  401 at once. Times come from the caller (an injected clock).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field, replace

__all__ = ["KEY_PREFIX", "ApiKey", "KeyCache", "MissGuard", "generate_key", "hash_key", "key_hint",
           "new_key_id"]

KEY_PREFIX = "sk-gw-"
_DUMMY_HASH = "0" * 64


def generate_key() -> str:
    """A new tenant key: ``sk-gw-`` + 256 random bits, URL-safe base64."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    """The public id of a key (shown in lists and audit tags; not a secret)."""
    return "key_" + secrets.token_hex(8)


def hash_key(key: str) -> str:
    """SHA-256 hex digest of the key as presented (UTF-8; undecodable input hashes too)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def key_hint(key: str) -> str:
    """``sk-gw-AbCd…wxyz``: enough to recognise a key, far too little to use it."""
    return f"{key[:len(KEY_PREFIX) + 4]}…{key[-4:]}"


@dataclass(frozen=True)
class ApiKey:
    """A tenant key as the gateway knows it (never the secret itself). Times are epoch seconds."""

    id: str
    tenant: str
    key_hash: str
    hint: str
    name: str | None = None
    models: tuple[str, ...] | None = None       # None: every model
    priority_ceiling: str | None = None          # None: every class
    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None
    budget: float | None = None                  # spend budget in the fleet's price units
    spent: float = 0.0
    created_at: float = 0.0
    expires_at: float | None = None
    revoked_at: float | None = None
    pin_versions: bool = False                   # may pin a model version (x-inferlb-model-version)

    def active(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def allows_model(self, model: str) -> bool:
        return self.models is None or model in self.models

    def public(self) -> dict[str, object]:
        """The JSON an admin sees: everything but the hash."""
        return {"id": self.id, "tenant": self.tenant, "name": self.name, "hint": self.hint,
                "models": list(self.models) if self.models is not None else None,
                "priority_ceiling": self.priority_ceiling, "rpm": self.rpm, "tpm": self.tpm,
                "max_parallel": self.max_parallel, "budget": self.budget, "spent": round(self.spent, 9),
                "created_at": self.created_at, "expires_at": self.expires_at, "revoked_at": self.revoked_at,
                "pin_versions": self.pin_versions}


@dataclass
class KeyCache:
    """Active and revoked keys by hash and by id; replaced whole on refresh."""

    by_hash: dict[str, ApiKey] = field(default_factory=dict)
    by_id: dict[str, ApiKey] = field(default_factory=dict)
    loaded: bool = False
    expired: str | None = None     # why the cache was emptied (too old to trust); None while valid

    def replace(self, keys: list[ApiKey]) -> None:
        self.by_hash = {k.key_hash: k for k in keys}
        self.by_id = {k.id: k for k in keys}
        self.loaded = True
        self.expired = None

    def expire(self, why: str) -> None:
        """Forget every key (the store has been away longer than the cache may be trusted):
        lookups fail until the next successful :meth:`replace`; ``expired`` says why."""
        self.by_hash, self.by_id = {}, {}
        self.expired = why

    def put(self, key: ApiKey) -> None:
        self.by_hash[key.key_hash] = key
        self.by_id[key.id] = key

    def with_spent(self, key_id: str, spent: float) -> None:
        k = self.by_id.get(key_id)
        if k is not None:
            self.put(replace(k, spent=spent))

    def lookup(self, presented: str, now: float) -> ApiKey | None:
        """The active key whose hash matches ``presented``, in constant time (see module doc)."""
        digest = hash_key(presented)
        found = self.by_hash.get(digest)
        same = hmac.compare_digest(found.key_hash if found is not None else _DUMMY_HASH, digest)
        if found is None or not same or not found.active(now):
            return None
        return found

    def __len__(self) -> int:
        return len(self.by_id)


class MissGuard:
    """Which unknown digests may be looked up in the database now (see the module docstring)."""

    def __init__(self, *, per_s: float, ttl_s: float, max_entries: int = 10_000) -> None:
        self.per_s = per_s
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._tokens = max(1.0, per_s)
        self._at: float | None = None
        self._unknown: dict[str, float] = {}     # digest → until when the database is not asked again
        self.checks = 0                          # look-ups let through
        self.refused = 0                         # look-ups not let through (recently unknown, or no token)

    def allow(self, digest: str, now: float) -> bool:
        """True when ``digest`` may be looked up now (takes one token)."""
        until = self._unknown.get(digest)
        if self.per_s <= 0 or (until is not None and now < until):
            self.refused += 1
            return False
        cap = max(1.0, self.per_s)
        if self._at is not None:
            self._tokens = min(cap, self._tokens + max(0.0, now - self._at) * self.per_s)
        self._at = now
        if self._tokens < 1.0:
            self.refused += 1
            return False
        self._tokens -= 1.0
        self.checks += 1
        return True

    def unknown(self, digest: str, now: float) -> None:
        """The database said it has no key ``digest``: do not ask again for ``ttl_s``."""
        if len(self._unknown) >= self.max_entries:
            self._unknown = {d: u for d, u in self._unknown.items() if u > now}
            while len(self._unknown) >= self.max_entries:   # still full: the oldest entries go
                del self._unknown[next(iter(self._unknown))]
        self._unknown[digest] = now + self.ttl_s
