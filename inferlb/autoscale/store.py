"""Scaling decisions in the database: table ``scaling_events`` (migration ``0008``), insert, list.

Contract:

* One row per pool (model × GPU type) per autoscale round that changed, tried to change, or
  failed to change that pool, plus one row per round that fell back (forecaster) or could not act:
  ``at_us`` (epoch µs, BigInteger like the audit tables), ``round``, ``model``, ``gpu``,
  ``from_replicas``, ``to_replicas`` (what was asked), ``applied_replicas`` (what the actuator
  reports in place afterwards; null when unknown), ``status`` (``applied`` / ``partial`` /
  ``failed`` / ``dry_run`` / ``held`` / ``fallback``), ``actuator``, ``forecaster`` (the method
  that produced the forecast), ``forecast_tokens_s``, ``actual_tokens_s``, ``capacity_tokens_s``,
  ``reason`` and ``detail`` (JSON: the pool's decision, the error).
* The table is registered on the audit models' metadata so Alembic compares it.
* :func:`insert_scaling_events` and :func:`recent_scaling_events` are synchronous (call them
  through ``asyncio.to_thread``); SQLAlchemy errors become :class:`~inferlb.errors.StoreError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection, Engine

from inferlb.store.read import run_query
from inferlb.store.rows import clean_json, clean_str
from inferlb.store.schema import SCALING_EVENTS, from_us, to_us

__all__ = ["SCALING_STATUSES", "insert_scaling_events", "recent_scaling_events"]

SCALING_STATUSES = ("applied", "partial", "failed", "dry_run", "held", "fallback")


_NUM = ("forecast_tokens_s", "actual_tokens_s", "capacity_tokens_s")
_INT = ("round", "from_replicas", "to_replicas", "applied_replicas")


def _row(ev: dict[str, Any]) -> dict[str, Any]:
    status = str(ev.get("status", ""))
    if status not in SCALING_STATUSES:
        raise ValueError(f"unknown scaling status {status!r}")
    out: dict[str, Any] = {"at_us": to_us(float(ev["at"])) or 0, "model": clean_str(str(ev["model"]))[:200],
                           "gpu": None if ev.get("gpu") is None else clean_str(str(ev["gpu"]))[:200],
                           "status": status, "actuator": clean_str(str(ev.get("actuator", "")))[:100],
                           "forecaster": None if ev.get("forecaster") is None else clean_str(str(ev["forecaster"])),
                           "reason": clean_str(str(ev.get("reason", "")))[:2000],
                           "detail": clean_json(ev.get("detail") or {})}
    for k in _INT:
        v = ev.get(k)
        out[k] = None if v is None else int(v)
    if out["round"] is None:
        out["round"] = 0
    for k in _NUM:
        v = ev.get(k)
        out[k] = None if v is None else float(v)
    return out


def insert_scaling_events(engine: Engine, events: Sequence[dict[str, Any]]) -> int:
    """Insert ``events`` (dicts with the column names, ``at`` in epoch seconds) in one transaction."""
    rows = [_row(e) for e in events]
    if not rows:
        return 0

    def write(conn: Connection) -> None:
        with conn.begin():
            conn.execute(insert(SCALING_EVENTS), rows)

    run_query(engine, write)
    return len(rows)


def recent_scaling_events(engine: Engine, *, since: float | None = None, model: str | None = None,
                          limit: int = 100) -> list[dict[str, Any]]:
    """Newest first; ``at`` in epoch seconds."""
    t = SCALING_EVENTS.c
    stmt = select(SCALING_EVENTS).order_by(t.at_us.desc(), t.id.desc()).limit(max(1, min(limit, 10_000)))
    if since is not None:
        stmt = stmt.where(t.at_us >= to_us(since))
    if model is not None:
        stmt = stmt.where(t.model == model)

    def fetch(conn: Connection) -> list[dict[str, Any]]:
        out = []
        for r in conn.execute(stmt).mappings():
            d = {k: v for k, v in r.items() if k not in ("at_us",)}
            d["at"] = from_us(r["at_us"])
            out.append(d)
        return out

    return run_query(engine, fetch)
