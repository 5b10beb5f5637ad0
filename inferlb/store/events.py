"""Node state changes in the database: table ``node_events``, the writer, the queries.

Contract:

* One row per :class:`~inferlb.node_types.NodeEvent`: ``id`` (autoincrement, the order
  of arrival), ``at_us`` (epoch µs, BigInteger like the audit tables), ``node``, ``from_state``,
  ``to_state``, ``reason``, ``evidence`` (JSON / JSONB). Created by migration ``0003``; the table
  is registered on the audit models' metadata so Alembic compares it.
* :meth:`EventWriter.submit` never blocks and never raises (call it on the event loop). Batches
  are inserted through ``asyncio.to_thread``, one transaction each. A failed write retries after a
  capped exponential backoff (timed by the injected clock). With a ``journal_dir`` (the gateway
  passes the audit journal's) the events queued when a write fails are appended to a local spool
  (``events-<pid>-<random>.jsonl``, fsynced, adopted after a crash like the audit spool) instead of
  being held in memory, and replayed in order before anything newer once the database answers.
  Only when neither the database nor the spool takes them do they wait in memory, bounded by
  ``max_pending``: past it the OLDEST events are dropped, counted (``backlog()["dropped"]``) and
  logged (at most once a minute for the spool's errors).
* :func:`recent_events` is synchronous (call it through ``asyncio.to_thread`` from async code);
  newest first, optionally for one node and since a time. SQLAlchemy errors become StoreError.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from inferlb.background import Background
from inferlb.errors import StoreError
from inferlb.node_types import NodeEvent
from inferlb.store.db import describe_db_error
from inferlb.store.journal import Spool
from inferlb.store.rows import clean_json as _clean_json
from inferlb.store.rows import clean_str as _clean_str
from inferlb.store.schema import NODE_EVENTS, from_us, to_us
from inferlb.types import Clock, SystemClock

__all__ = ["EventWriter", "dump_event", "insert_events", "load_event", "recent_events"]

log = logging.getLogger(__name__)

_SPOOL_PREFIX = "events-"
_SPOOL_ERROR_LOG_INTERVAL_S = 60.0


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


def dump_event(ev: NodeEvent) -> bytes:
    """One spool line for ``ev``."""
    doc = {"node": ev.node, "from_state": ev.from_state, "to_state": ev.to_state, "reason": ev.reason,
           "at": ev.at, "evidence": ev.evidence}
    return json.dumps(doc, separators=(",", ":"), default=str).encode("ascii") + b"\n"


def load_event(line: bytes) -> NodeEvent | None:
    """Parse one spool line; None when it is not a complete, valid event."""
    if not line.endswith(b"\n"):
        return None
    try:
        d = json.loads(line)
        return NodeEvent(node=str(d["node"]), from_state=d.get("from_state"), to_state=str(d["to_state"]),
                         reason=str(d["reason"]), at=float(d["at"]), evidence=dict(d.get("evidence") or {}))
    except (ValueError, TypeError, KeyError):
        return None


class EventWriter:
    """Batched, retrying, spooling writer of node events (see the module docstring)."""

    def __init__(self, engine: Engine, *, clock: Clock | None = None, batch_size: int = 500,
                 flush_interval_s: float = 0.5, max_pending: int = 10_000, retry_base_s: float = 0.5,
                 retry_max_s: float = 30.0, journal_dir: Path | str | None = None) -> None:
        self._engine = engine
        self._clock: Clock = clock or SystemClock()
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._pending: collections.deque[NodeEvent] = collections.deque()
        self._max_pending = max_pending
        self._retry_base_s, self._retry_max_s = retry_base_s, retry_max_s
        self._spool: Spool[NodeEvent] | None = None
        if journal_dir is not None:
            self._spool = Spool(journal_dir, prefix=_SPOOL_PREFIX, dump=dump_event, load=load_event)
        self._spool_open = False
        self._spool_log_at: float | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._flusher = Background("inferlb-node-events", self._run, logger=log)
        self._closing = False
        self.written = 0
        self.dropped = 0
        self.flush_rounds = 0   # rounds of the background task (none while idle)
        self.last_error: str | None = None
        self.spool_error: str | None = None

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
        """Open the spool (adopting what a crashed process left) and start the flush task."""
        await self._open_spool()
        if not self._flusher.started:
            self._flusher.start()

    async def _open_spool(self) -> None:
        if self._spool is not None and not self._spool_open:
            try:
                await asyncio.to_thread(self._spool.open)
            except OSError as exc:
                raise StoreError(f"cannot open the node-event journal in {self._spool.directory}: {exc}") from exc
            self._spool_open = True

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
        """Write what is spooled, then what is queued (batch by batch); the number written. While
        backing off after a failure (and unless ``force``) the database is not tried."""
        async with self._lock:
            if self._failures and not force and self._clock.monotonic() < self._retry_at:
                await self._spool_pending()
                return 0
            written = 0
            spool = self._spool if self._spool_open else None
            while spool is not None and spool.spooled:
                batch, end = await asyncio.to_thread(spool.read_batch, self._batch_size)
                if not batch:
                    break
                if not await self._write_batch(batch):
                    return written
                spool.advance(end, len(batch))
                written += len(batch)
            if spool is not None and not spool.spooled and spool.size:
                await asyncio.to_thread(spool.truncate_if_drained)
            while self._pending:
                batch = list(itertools.islice(self._pending, self._batch_size))
                if not await self._write_batch(batch):
                    return written
                for _ in batch:
                    self._pending.popleft()
                written += len(batch)
            self._failures = 0
            return written

    async def _write_batch(self, batch: list[NodeEvent]) -> bool:
        """Write one batch; on failure back off and spool what is queued (False)."""
        try:
            await asyncio.to_thread(self._write_sync, batch)
        except StoreError as exc:
            self._on_failure(exc)
            await self._spool_pending()
            return False
        self.written += len(batch)
        return True

    def _on_failure(self, exc: StoreError) -> None:
        self._failures += 1
        self.last_error = str(exc)
        delay = min(self._retry_max_s, self._retry_base_s * 2 ** (self._failures - 1))
        self._retry_at = self._clock.monotonic() + delay
        log.warning("node events not written (%d failure(s) in a row), retrying in %.2fs: %s",
                    self._failures, delay, exc)

    async def _spool_pending(self) -> None:
        """Move the queue to the spool (fsynced); on a spool error it stays in memory (bounded)."""
        if self._spool is None or not self._spool_open or not self._pending:
            return
        events = list(self._pending)
        try:
            await asyncio.to_thread(self._spool.append, events)
        except OSError as exc:
            self.spool_error = f"{type(exc).__name__}: {exc}"
            now = self._clock.monotonic()
            if self._spool_log_at is None or now >= self._spool_log_at:
                self._spool_log_at = now + _SPOOL_ERROR_LOG_INTERVAL_S
                log.error("cannot spool %d node events (kept in memory): %s", len(events), self.spool_error)
            return
        self.spool_error = None
        self._spool_log_at = None
        for _ in events:
            self._pending.popleft()

    def _write_sync(self, batch: list[NodeEvent]) -> None:
        try:
            with self._engine.begin() as conn:
                insert_events(conn, batch)
        except SQLAlchemyError as exc:
            raise StoreError(describe_db_error(exc)) from exc

    def backlog(self) -> dict[str, Any]:
        return {"pending": len(self._pending), "spooled": self._spool.spooled if self._spool else 0,
                "written": self.written, "dropped": self.dropped, "consecutive_failures": self._failures,
                "last_error": self.last_error}

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop the task, write what is left (one forced try within ``timeout_s``), spool the rest."""
        self._closing = True
        self._wake.set()
        await self._flusher.stop(grace_s=timeout_s)   # signalled: it ends after its flush, else cancelled
        if self._pending or (self._spool is not None and self._spool.spooled):
            with contextlib.suppress(StoreError):
                await self._open_spool()
            try:
                await asyncio.wait_for(self.flush_once(force=True), timeout_s)
            except TimeoutError:
                log.error("node events not written within %.1fs at close", timeout_s)
        async with self._lock:
            await self._spool_pending()
            if self._pending:
                log.error("%d node event(s) not written at close", len(self._pending))
            if self._spool is not None and self._spool_open:
                await asyncio.to_thread(self._spool.close)
                self._spool_open = False
