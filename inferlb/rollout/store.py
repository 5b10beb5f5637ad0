"""Rollouts in the database (``rollouts``, ``rollout_events``): insert, update, list, load.

Contract:

* Every function takes a synchronous SQLAlchemy engine and runs one short transaction (call them
  through ``asyncio.to_thread`` from the event loop). Bound parameters only.
* :func:`insert_rollout` raises :class:`RolloutConflict` when the model already has a running
  rollout (the partial unique index ``uq_rollouts_running_model``: true across replicas), and
  :class:`~inferlb.errors.StoreError` for any other database failure.
* :func:`save_progress` writes rollouts' new states and their events in one transaction. A state
  is written only over a row still ``running``: a rollout that another replica ended meanwhile
  (an abort, the leader's rollback) is never moved back; its id is returned as *stale*, and its
  events are not written, so the caller re-reads it (:func:`following`) instead.
* Every insert and every state change bumps the shared revision (``fleet_revision``,
  :func:`~inferlb.store.overrides.bump_revision`) in the same transaction: each replica's
  live-config poll sees it move and re-reads the rollouts (live/manager.py). Events alone (a "hold")
  do not bump it.
* Rows come back as plain dicts with epoch-second floats (``*_at``), like the audit queries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from sqlalchemy import Table, func, or_, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from inferlb.errors import StoreError
from inferlb.store.db import describe_db_error
from inferlb.store.overrides import bump_revision
from inferlb.store.schema import RolloutEventRow, RolloutRow, from_us, to_us

__all__ = ["ROLLOUTS", "ROLLOUT_EVENTS", "RolloutConflict", "ended_rollouts", "following", "get_rollout",
           "insert_rollout", "last_rollout_events", "list_rollouts", "rollout_events", "running_rollouts",
           "save_progress"]

_T = TypeVar("_T")
ROLLOUTS: Table = cast(Table, RolloutRow.__table__)
ROLLOUT_EVENTS: Table = cast(Table, RolloutEventRow.__table__)
_TIMES = ("started_at", "step_started_at", "ended_at")


class RolloutConflict(StoreError):
    """The model already has a running rollout (in this database)."""


def _run(engine: Engine, fn: Callable[[Connection], _T]) -> _T:
    try:
        with engine.begin() as conn:
            return fn(conn)
    except IntegrityError as exc:
        if "uq_rollouts_running_model" in str(exc) or "rollouts.model" in str(exc):
            raise RolloutConflict("the model already has a running rollout") from exc
        raise StoreError(f"rollouts: {describe_db_error(exc)}") from exc
    except SQLAlchemyError as exc:
        raise StoreError(f"rollouts: {describe_db_error(exc)}") from exc


def _row_values(r: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in r.items() if k not in _TIMES}
    for t in _TIMES:
        if t in r:
            out[t + "_us"] = to_us(r[t])
    return out


def _rollout(row: Any) -> dict[str, Any]:
    m = row._mapping
    out = {k: m[k] for k in ("id", "model", "from_version", "to_version", "steps", "criteria", "base_weights",
                             "state", "step", "percent", "reason")}
    for t in _TIMES:
        out[t] = from_us(m[t + "_us"])
    return out


def _event_values(rollout_id: str, e: Mapping[str, Any]) -> dict[str, Any]:
    return {"rollout_id": rollout_id, "at_us": to_us(e["at"]), "action": e["action"],
            "from_percent": float(e["from_percent"]), "to_percent": float(e["to_percent"]),
            "reason": str(e["reason"])[:2000], "evidence": dict(e.get("evidence") or {})}


def insert_rollout(engine: Engine, rollout: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = ()) -> None:
    """A new rollout row (``rollout`` holds every column, times as epoch seconds) and its first events."""
    def insert(conn: Connection) -> None:
        conn.execute(ROLLOUTS.insert().values(**_row_values(rollout)))
        if events:
            conn.execute(ROLLOUT_EVENTS.insert(), [_event_values(rollout["id"], e) for e in events])
        bump_revision(conn)

    _run(engine, insert)


def save_progress(engine: Engine, changes: Mapping[str, Mapping[str, Any]],
                  events: Mapping[str, Sequence[Mapping[str, Any]]],
                  fence: Callable[[Connection], None] | None = None) -> set[str]:
    """``changes``: rollout id → the columns that changed (times as epoch seconds); ``events``:
    rollout id → new events. One transaction; returns the stale ids (see the module docstring).
    ``fence`` (the election's token check, cluster/election.py) runs first in the
    transaction: a replica that lost the lead writes nothing (it raises)."""
    def save(conn: Connection) -> set[str]:
        if fence is not None:
            fence(conn)
        stale: set[str] = set()
        for rid, values in changes.items():
            done = conn.execute(update(ROLLOUTS).where(ROLLOUTS.c.id == rid, ROLLOUTS.c.state == "running")
                                .values(**_row_values(values)))
            if done.rowcount == 0:
                stale.add(rid)
        rows = [_event_values(rid, e) for rid, evs in events.items() if rid not in stale for e in evs]
        if rows:
            conn.execute(ROLLOUT_EVENTS.insert(), rows)
        if len(stale) < len(changes):
            bump_revision(conn)
        return stale

    return _run(engine, save)


def following(engine: Engine, known: Sequence[str] = ()) -> list[dict[str, Any]]:
    """What a replica follows: every running rollout, and the rollouts ``known`` (the ones it has
    running) whatever their state now, oldest first."""
    def fetch(conn: Connection) -> list[dict[str, Any]]:
        cond = ROLLOUTS.c.state == "running"
        if known:
            cond = or_(cond, ROLLOUTS.c.id.in_(list(known)))
        q = select(ROLLOUTS).where(cond).order_by(ROLLOUTS.c.started_at_us, ROLLOUTS.c.id)
        return [_rollout(r) for r in conn.execute(q)]

    return _run(engine, fetch)


def list_rollouts(engine: Engine, *, model: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Rollouts, newest first."""
    def fetch(conn: Connection) -> list[dict[str, Any]]:
        q = select(ROLLOUTS).order_by(ROLLOUTS.c.started_at_us.desc(), ROLLOUTS.c.id.desc()).limit(limit)
        if model is not None:
            q = q.where(ROLLOUTS.c.model == model)
        return [_rollout(r) for r in conn.execute(q)]

    return _run(engine, fetch)


def running_rollouts(engine: Engine) -> list[dict[str, Any]]:
    """Every rollout still running (to resume after a restart)."""
    def fetch(conn: Connection) -> list[dict[str, Any]]:
        q = select(ROLLOUTS).where(ROLLOUTS.c.state == "running").order_by(ROLLOUTS.c.started_at_us)
        return [_rollout(r) for r in conn.execute(q)]

    return _run(engine, fetch)


def get_rollout(engine: Engine, rollout_id: str) -> dict[str, Any] | None:
    def fetch(conn: Connection) -> dict[str, Any] | None:
        row = conn.execute(select(ROLLOUTS).where(ROLLOUTS.c.id == rollout_id)).one_or_none()
        return _rollout(row) if row is not None else None

    return _run(engine, fetch)


def rollout_events(engine: Engine, rollout_id: str, *, limit: int = 200) -> list[dict[str, Any]]:
    """A rollout's events, oldest first (the last ``limit``)."""
    def fetch(conn: Connection) -> list[dict[str, Any]]:
        t = ROLLOUT_EVENTS.c
        q = select(ROLLOUT_EVENTS).where(t.rollout_id == rollout_id).order_by(t.at_us.desc(), t.id.desc()).limit(limit)
        rows = [dict(r._mapping) for r in conn.execute(q)]
        rows.reverse()
        return [{"at": from_us(r["at_us"]), "action": r["action"], "from_percent": r["from_percent"],
                 "to_percent": r["to_percent"], "reason": r["reason"], "evidence": r["evidence"]} for r in rows]

    return _run(engine, fetch)


def ended_rollouts(engine: Engine, *, limit: int = 10) -> list[dict[str, Any]]:
    """The last ``limit`` rollouts that ended (any state but running), the latest ended first."""
    def fetch(conn: Connection) -> list[dict[str, Any]]:
        q = (select(ROLLOUTS).where(ROLLOUTS.c.state != "running")
             .order_by(ROLLOUTS.c.ended_at_us.desc(), ROLLOUTS.c.id.desc()).limit(limit))
        return [_rollout(r) for r in conn.execute(q)]

    return _run(engine, fetch)


def last_rollout_events(engine: Engine, rollout_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each rollout's latest event (the one written last), by rollout id; rollouts without events
    are absent. One query, whatever the number of events."""
    if not rollout_ids:
        return {}

    def fetch(conn: Connection) -> dict[str, dict[str, Any]]:
        t = ROLLOUT_EVENTS.c
        last = select(func.max(t.id)).where(t.rollout_id.in_(list(rollout_ids))).group_by(t.rollout_id)
        rows = conn.execute(select(ROLLOUT_EVENTS).where(t.id.in_(last.scalar_subquery())))
        return {r.rollout_id: {"at": from_us(r.at_us), "action": r.action, "from_percent": r.from_percent,
                               "to_percent": r.to_percent, "reason": r.reason} for r in rows}

    return _run(engine, fetch)
