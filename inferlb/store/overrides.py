"""Node overrides in the database: what operators changed on a live fleet, shared by every replica.

The fleet file stays the base; these rows say what differs (live/fleet_admin.py merges them):

* table ``node_overrides``, one row per node name: ``source`` ``admin`` (a node added through
  ``POST /admin/nodes``; ``spec`` is its whole node config) or ``file`` (a node of the fleet file;
  ``spec`` holds only the fields an operator patched); ``drained`` (an operator's drain);
  ``removed`` (a file node an operator removed: a tombstone, so the file's entry stays hidden);
  ``key_id`` (who changed it last) and ``updated_at_us`` (epoch µs);
* table ``fleet_revision``, one row (``id`` 1) whose ``revision`` goes up by one in the same
  transaction as every change. Each replica reads it (one primary-key read) when its revision
  watch says the database may have moved (store/revision_watch.py: the SQLite file's stat,
  or the PostgreSQL ``NOTIFY`` the same transaction sends) and reloads the rows only when it moved.
  It is the one change counter of the live state every replica follows: the rollouts' state
  changes bump it too (:func:`bump_revision`, rollout/store.py), so the same poll brings a
  replica the weights another replica's rollout set (live/manager.py).

Both are created by migration ``0005`` and registered on the audit models' metadata so Alembic
compares them. Every function here is synchronous (call it through ``asyncio.to_thread``);
SQLAlchemy errors become :class:`~inferlb.errors.StoreError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from inferlb.errors import StoreError
from inferlb.store.db import describe_db_error
from inferlb.store.schema import FLEET_REVISION, NODE_OVERRIDES, to_us

__all__ = ["REVISION_CHANNEL", "NodeOverride", "StaleOverrides", "bump_revision",
           "load_overrides", "read_revision", "save_override"]


# The PostgreSQL NOTIFY channel of every revision bump (bump_revision; store/revision_watch.py).
REVISION_CHANNEL = "inferlb_fleet_revision"


class StaleOverrides(StoreError):
    """Another replica changed the overrides after the revision the caller validated against."""


@dataclass(frozen=True)
class NodeOverride:
    """One row of ``node_overrides`` (see the module docstring)."""

    name: str
    source: str                                   # admin | file
    spec: dict[str, Any] = field(default_factory=dict)
    drained: bool = False
    removed: bool = False
    key_id: str | None = None
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        # A literal key (rows written before admin nodes took api_key_env only) is never shown.
        spec = {k: ("**********" if k == "api_key" and v is not None else v) for k, v in self.spec.items()}
        return {"name": self.name, "source": self.source, "spec": spec, "drained": self.drained,
                "removed": self.removed, "key_id": self.key_id, "updated_at": self.updated_at}


def read_revision(engine: Engine) -> int:
    """The overrides' revision (0 before the first change)."""
    try:
        with engine.connect() as conn:
            rev = conn.execute(select(FLEET_REVISION.c.revision).where(FLEET_REVISION.c.id == 1)).scalar()
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot read the fleet revision: {describe_db_error(exc)}") from exc
    return int(rev or 0)


def load_overrides(engine: Engine) -> tuple[int, list[NodeOverride]]:
    """(revision, every override ordered by name), read in one transaction."""
    t = NODE_OVERRIDES
    try:
        with engine.connect() as conn:
            rev = conn.execute(select(FLEET_REVISION.c.revision).where(FLEET_REVISION.c.id == 1)).scalar()
            rows = conn.execute(select(t).order_by(t.c.name)).mappings().all()
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot read the node overrides: {describe_db_error(exc)}") from exc
    return int(rev or 0), [NodeOverride(name=r["name"], source=r["source"], spec=dict(r["spec"] or {}),
                                        drained=bool(r["drained"]), removed=bool(r["removed"]),
                                        key_id=r["key_id"], updated_at=(r["updated_at_us"] or 0) / 1e6)
                           for r in rows]


def bump_revision(conn: Connection) -> int:
    """Add one to the shared revision inside the caller's transaction; returns the new revision.
    On PostgreSQL it also queues ``NOTIFY`` on :data:`REVISION_CHANNEL` (payload: the schema the
    tables live in), which the server delivers to every listener when, and only if, the
    transaction commits (store/revision_watch.py)."""
    got = conn.execute(select(FLEET_REVISION.c.revision).where(FLEET_REVISION.c.id == 1)).scalar()
    if got is None:
        conn.execute(insert(FLEET_REVISION), [{"id": 1, "revision": 1}])
        new = 1
    else:
        conn.execute(update(FLEET_REVISION).where(FLEET_REVISION.c.id == 1)
                     .values(revision=FLEET_REVISION.c.revision + 1))
        new = int(got) + 1
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_notify(REVISION_CHANNEL, func.current_schema())))
    return new


def save_override(engine: Engine, name: str, override: NodeOverride | None, *,
                  expect_revision: int | None = None) -> int:
    """Write ``name``'s override (None deletes it) and bump the revision, in one transaction;
    returns the new revision. With ``expect_revision``, the write is refused (StoreError) when
    another replica changed the overrides since that revision was read: the caller re-reads and
    re-validates, so nothing is applied on top of a state it did not check (:class:`StaleOverrides`)."""
    t = NODE_OVERRIDES
    try:
        with engine.begin() as conn:
            if expect_revision is not None:
                current = conn.execute(select(FLEET_REVISION.c.revision).where(FLEET_REVISION.c.id == 1)).scalar()
                if int(current or 0) != expect_revision:
                    raise StaleOverrides(f"the node overrides changed meanwhile (revision {int(current or 0)}, "
                                         f"expected {expect_revision})")
            conn.execute(delete(t).where(t.c.name == name))
            if override is not None:
                conn.execute(insert(t), [{"name": name, "source": override.source, "spec": dict(override.spec),
                                          "drained": override.drained, "removed": override.removed,
                                          "key_id": override.key_id,
                                          "updated_at_us": to_us(override.updated_at) or 0}])
            return bump_revision(conn)
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot save the node override of {name!r}: {describe_db_error(exc)}") from exc
