"""Tenant keys in the database (``api_keys``): create, list, revoke, load, add spend.

Contract:

* Every function takes a synchronous SQLAlchemy engine and runs one short transaction (call
  them through ``asyncio.to_thread`` from the event loop). Queries use bound parameters only;
  a presented key never reaches SQL (the gateway looks keys up in memory by SHA-256 digest).
* :func:`create_key` returns the :class:`~inferlb.admission.keys.ApiKey` and the key
  itself; the key is never stored or returned again.
* :func:`revoke_key` is idempotent: revoking twice keeps the first revocation time.
* :func:`add_spend` adds per-key deltas (``spent = spent + :delta``), so several gateway
  replicas can each add their own share without losing each other's.
* :func:`create_key` and :func:`revoke_key` announce the change to every replica: on PostgreSQL
  the same transaction sends ``NOTIFY`` on :data:`KEYS_CHANNEL` (payload: the schema), which the
  server delivers when, and only if, it commits; each gateway ``LISTEN``-s and reloads its key
  cache at once (admission/service.py). Whoever writes (a replica's admin API, ``inferlb keys``)
  announces, with nothing else to reach. SQLite has no such signal: one process, or the
  re-check of an unknown key (:func:`find_key`) and the periodic reload.
* :func:`find_key` reads one key by its SHA-256 digest (a gateway re-checking a key its cache
  does not know: one created a moment ago on another replica).
* SQLAlchemy errors become :class:`~inferlb.errors.StoreError` here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from sqlalchemy import Table, func, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from inferlb.admission.keys import ApiKey, generate_key, hash_key, key_hint, new_key_id
from inferlb.errors import StoreError
from inferlb.store.db import describe_db_error
from inferlb.store.schema import ApiKeyRow, from_us, to_us

__all__ = ["KEYS_CHANNEL", "add_spend", "create_key", "find_key", "get_key", "list_keys", "load_keys",
           "revoke_key"]

# The PostgreSQL NOTIFY channel of every key change (create, revoke); admission/service.py listens.
KEYS_CHANNEL = "inferlb_api_keys"

_T = TypeVar("_T")
_KEYS: Table = cast(Table, ApiKeyRow.__table__)


def _run(engine: Engine, fn: Callable[[Connection], _T]) -> _T:
    try:
        with engine.begin() as conn:
            return fn(conn)
    except SQLAlchemyError as exc:
        raise StoreError(f"api keys: {describe_db_error(exc)}") from exc


def _announce(conn: Connection) -> None:
    """Queue the change notice in the caller's transaction (sent on commit; PostgreSQL only)."""
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_notify(KEYS_CHANNEL, func.current_schema())))


def _key(row: Any) -> ApiKey:
    models = row.models
    return ApiKey(
        id=row.id, tenant=row.tenant, key_hash=row.key_hash, hint=row.hint, name=row.name,
        models=tuple(models) if models is not None else None, priority_ceiling=row.priority_ceiling,
        rpm=row.rpm, tpm=row.tpm, max_parallel=row.max_parallel, budget=row.budget,
        spent=float(row.spent or 0.0), created_at=from_us(row.created_at_us) or 0.0,
        expires_at=from_us(row.expires_at_us), revoked_at=from_us(row.revoked_at_us),
        pin_versions=bool(getattr(row, "pin_versions", False)),
    )


def create_key(engine: Engine, *, tenant: str, now: float, name: str | None = None,
               models: Sequence[str] | None = None, priority_ceiling: str | None = None,
               rpm: int | None = None, tpm: int | None = None, max_parallel: int | None = None,
               budget: float | None = None, expires_at: float | None = None,
               pin_versions: bool = False) -> tuple[ApiKey, str]:
    """A new key for ``tenant``; returns (its record, the key to hand over once)."""
    secret = generate_key()
    row = {"id": new_key_id(), "key_hash": hash_key(secret), "hint": key_hint(secret), "tenant": tenant,
           "name": name, "models": list(models) if models is not None else None,
           "priority_ceiling": priority_ceiling, "rpm": rpm, "tpm": tpm, "max_parallel": max_parallel,
           "budget": budget, "spent": 0.0, "created_at_us": to_us(now), "expires_at_us": to_us(expires_at),
           "revoked_at_us": None, "pin_versions": pin_versions}

    def insert(conn: Connection) -> ApiKey:
        conn.execute(_KEYS.insert().values(**row))
        _announce(conn)
        return _key(conn.execute(select(_KEYS).where(_KEYS.c.id == row["id"])).one())

    return _run(engine, insert), secret


def list_keys(engine: Engine, *, tenant: str | None = None, include_revoked: bool = True) -> list[ApiKey]:
    """Keys, oldest first."""
    def fetch(conn: Connection) -> list[ApiKey]:
        q = select(_KEYS).order_by(_KEYS.c.created_at_us, _KEYS.c.id)
        if tenant is not None:
            q = q.where(_KEYS.c.tenant == tenant)
        if not include_revoked:
            q = q.where(_KEYS.c.revoked_at_us.is_(None))
        return [_key(r) for r in conn.execute(q)]

    return _run(engine, fetch)


def load_keys(engine: Engine) -> list[ApiKey]:
    """Every key (revoked ones too: the cache answers 401 for them like for unknown keys)."""
    return list_keys(engine)


def find_key(engine: Engine, key_hash: str) -> ApiKey | None:
    """The key whose digest is ``key_hash`` (revoked or not); None when there is none."""
    def fetch(conn: Connection) -> ApiKey | None:
        row = conn.execute(select(_KEYS).where(_KEYS.c.key_hash == key_hash)).one_or_none()
        return _key(row) if row is not None else None

    return _run(engine, fetch)


def get_key(engine: Engine, key_id: str) -> ApiKey | None:
    def fetch(conn: Connection) -> ApiKey | None:
        row = conn.execute(select(_KEYS).where(_KEYS.c.id == key_id)).one_or_none()
        return _key(row) if row is not None else None

    return _run(engine, fetch)


def revoke_key(engine: Engine, key_id: str, *, now: float) -> ApiKey | None:
    """Revoke ``key_id``; None when there is no such key."""
    def revoke(conn: Connection) -> ApiKey | None:
        conn.execute(update(_KEYS).where(_KEYS.c.id == key_id, _KEYS.c.revoked_at_us.is_(None))
                     .values(revoked_at_us=to_us(now)))
        _announce(conn)
        row = conn.execute(select(_KEYS).where(_KEYS.c.id == key_id)).one_or_none()
        return _key(row) if row is not None else None

    return _run(engine, revoke)


def add_spend(engine: Engine, deltas: Mapping[str, float]) -> None:
    """``spent += delta`` for each key id (unknown ids are ignored)."""
    items = [(k, float(d)) for k, d in deltas.items() if d]
    if not items:
        return

    def add(conn: Connection) -> None:
        for key_id, delta in items:
            conn.execute(update(_KEYS).where(_KEYS.c.id == key_id).values(spent=_KEYS.c.spent + delta))

    _run(engine, add)
