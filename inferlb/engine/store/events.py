"""Node state changes in the database: table ``node_events``, the writer, the queries.

Contract:

* One row per :class:`~inferlb.engine.health.types.NodeEvent`: ``id`` (autoincrement, the order
  of arrival), ``at_us`` (epoch µs, BigInteger like the audit tables), ``node``, ``from_state``,
  ``to_state``, ``reason``, ``evidence`` (JSON / JSONB). Created by migration ``0003``; the table
  is registered on the audit models' metadata so Alembic compares it.
* :meth:`EventWriter.submit` never blocks and never raises (call it on the event loop). Batches
  are inserted through ``asyncio.to_thread``, one transaction each. A failed write keeps the
  batch at the head of the queue and retries after a capped exponential backoff (timed by the
  injected clock); the queue is bounded (``max_pending``): past it the OLDEST events are dropped
  and counted (``backlog()["dropped"]``) and logged — health events are diagnostics, the request
  audit trail (``writer.py``) is the one that may never lose a row.
* :func:`recent_events` is synchronous (call it through ``asyncio.to_thread`` from async code);
  newest first, optionally for one node and since a time. SQLAlchemy errors become StoreError.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import BigInteger, Column, Index, Integer, String, Table, insert, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from ..errors import StoreError
from ..health.types import NodeEvent
from ..types import Clock, SystemClock
from .db import describe_db_error
from .models import Base, from_us, json_type, to_us
from .writer import _clean_json, _clean_str

__all__ = ["NODE_EVENTS", "EventWriter", "insert_events", "recent_events"]

log = logging.getLogger(__name__)

NODE_EVENTS: Table = Table(
    "node_events",
    Base.metadata,
    # BIGINT on PostgreSQL; SQLite autoincrements only an INTEGER PRIMARY KEY (its rowid).
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True),
    Column("at_us", BigInteger(), nullable=False),
    Column("node", String(), nullable=False),
    Column("from_state", String(), nullable=True),
    Column("to_state", String(), nullable=False),
    Column("reason", String(), nullable=False),
    Column("evidence", json_type(), nullable=False),
    Index("ix_node_events_node", "node", "at_us"),
    Index("ix_node_events_at", "at_us"),
)


def _row(ev: NodeEvent) -> dict[str, Any]:
    return {"at_us": to_us(ev.at) or 0, "node": _clean_str(ev.node)[:200],
            "from_state": None if ev.from_state is None else _clean_str(ev.from_state),
            "to_state": _clean_str(ev.to_state), "reason": _clean_str(ev.reason)[:2000],
            "evidence": _clean_json(ev.evidence)}


def insert_events(conn: Connection, events: Sequence[NodeEvent]) -> None:
    """Insert ``events`` on ``conn``; the caller owns the transaction."""
    if events:
        conn.execute(insert(NODE_EVENTS), [_row(e) for e in events])


def recent_events(engine: Engine, *, node: str | None = None, limit: int = 100,
                  since: float | None = None) -> list[dict[str, Any]]:
    """Newest first: ``{"id", "at", "node", "from", "to", "reason", "evidence"}``."""
    t = NODE_EVENTS
    q = select(t).order_by(t.c.at_us.desc(), t.c.id.desc()).limit(max(1, min(limit, 10_000)))
    if node is not None:
        q = q.where(t.c.node == node)
    if since is not None:
        q = q.where(t.c.at_us >= (to_us(since) or 0))
    try:
        with engine.connect() as conn:
            rows = conn.execute(q).mappings().all()
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot read node events: {describe_db_error(exc)}") from exc
    return [{"id": r["id"], "at": from_us(r["at_us"]), "node": r["node"], "from": r["from_state"],
             "to": r["to_state"], "reason": r["reason"], "evidence": r["evidence"]} for r in rows]


class EventWriter:
    """Batched, retrying writer of node events (see the module docstring)."""

    def __init__(self, engine: Engine, *, clock: Clock | None = None, batch_size: int = 500,
                 flush_interval_s: float = 0.5, max_pending: int = 10_000, retry_base_s: float = 0.5,
                 retry_max_s: float = 30.0) -> None:
        self._engine = engine
        self._clock: Clock = clock or SystemClock()
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._pending: collections.deque[NodeEvent] = collections.deque()
        self._max_pending = max_pending
        self._retry_base_s, self._retry_max_s = retry_base_s, retry_max_s
        self._failures = 0
        self._retry_at = 0.0
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.written = 0
        self.dropped = 0
        self.flush_rounds = 0   # rounds of the background task (none while idle)
        self.last_error: str | None = None

    def submit(self, events: Iterable[NodeEvent]) -> None:
        for ev in events:
            if len(self._pending) >= self._max_pending:
                self._pending.popleft()
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.error("node-event queue full (%d): %d oldest event(s) dropped", self._max_pending,
                              self.dropped)
            self._pending.append(ev)
        self._wake.set()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="inferlb-node-events")

    async def _run(self) -> None:
        while not self._closing:
            if self._pending:   # a batch waits for its interval (or a retry after a failure)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._flush_interval_s)
            else:               # nothing queued: park until a submit, no timer while idle
                await self._wake.wait()
            self._wake.clear()
            self.flush_rounds += 1
            try:
                await self.flush_once()
            except Exception:  # the task must outlive any bug in one flush
                log.exception("node-event flush failed unexpectedly")

    async def flush_once(self, *, force: bool = False) -> int:
        """Write what is queued (batch by batch); the number written. While backing off after a
        failure (and unless ``force``) the database is not tried."""
        async with self._lock:
            if self._failures and not force and self._clock.monotonic() < self._retry_at:
                return 0
            written = 0
            while self._pending:
                batch = list(self._pending)[: self._batch_size]
                try:
                    await asyncio.to_thread(self._write_sync, batch)
                except StoreError as exc:
                    self._failures += 1
                    self.last_error = str(exc)
                    delay = min(self._retry_max_s, self._retry_base_s * 2 ** (self._failures - 1))
                    self._retry_at = self._clock.monotonic() + delay
                    log.warning("node events not written (%d failure(s) in a row), retrying in %.2fs: %s",
                                self._failures, delay, exc)
                    return written
                for _ in batch:
                    self._pending.popleft()
                written += len(batch)
                self.written += len(batch)
            self._failures = 0
            return written

    def _write_sync(self, batch: list[NodeEvent]) -> None:
        try:
            with self._engine.begin() as conn:
                insert_events(conn, batch)
        except SQLAlchemyError as exc:
            raise StoreError(describe_db_error(exc)) from exc

    def backlog(self) -> dict[str, Any]:
        return {"pending": len(self._pending), "written": self.written, "dropped": self.dropped,
                "consecutive_failures": self._failures, "last_error": self.last_error}

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop the task and write what is left (one forced try within ``timeout_s``)."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._task, timeout_s)
            self._task = None
        if self._pending:
            try:
                await asyncio.wait_for(self.flush_once(force=True), timeout_s)
            except TimeoutError:
                log.error("%d node event(s) not written at close", len(self._pending))
