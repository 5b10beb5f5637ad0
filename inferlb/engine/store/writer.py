"""The batched audit writer: request records into the database, never silently lost.

Contract:

* :meth:`AuditWriter.submit` never blocks and never raises: it appends to an in-memory queue (call
  it from the event loop thread). A record submitted after :meth:`close` cannot be persisted any
  more; it is counted in ``records_dropped`` and logged: the only way that counter moves, with a
  journal that cannot be written at close.
* Flushing (the background task, or :meth:`flush_once` called directly by tests) writes batches of
  at most ``batch_size`` records through ``asyncio.to_thread``, ONE transaction per batch, as an
  idempotent upsert keyed on ``request_id`` (``INSERT … ON CONFLICT DO UPDATE`` on requests; the
  request's attempts are deleted and re-inserted). A re-submitted request therefore replaces its
  row (the last submission wins), and replays after a crash cannot duplicate rows. Records leave
  memory only after their commit.
* On a database failure the batch and everything queued behind it are appended to the local
  journal (:mod:`~inferlb.engine.store.journal`, fsynced) and the database is retried with capped
  exponential backoff (``retry_base_s · 2^(n-1)`` up to ``retry_max_s``, timed by the injected
  clock). Until the journal is drained, new records are spooled behind it on every flush, so
  order is kept and the newest version of a request is written last. When the database answers
  again the journal is replayed in order, then truncated.
* A record the database rejects on its own would block everything behind it. When a batch fails
  with a *data* error (integrity or data errors, values the driver cannot bind, such as an
  out-of-range integer), its records are written one by one; the ones that fail with a data error
  again are *quarantined* (kept in ``quarantine.jsonl`` with the error, counted in
  ``backlog()["quarantined"]``) and the rest are committed. Any other error (connection, missing
  table, permissions) means the database is unusable: the batch is spooled and retried, never
  quarantined. Strings are cleaned before writing: NUL becomes U+FFFD (PostgreSQL rejects it in
  text and jsonb) and non-finite floats in JSON become null.
* :meth:`start` opens the journal (adopting journals left by crashed processes) and replays it;
  :meth:`close` flushes within ``timeout_s`` and spools whatever could not be written.
* Errors from the database are mapped to :class:`~inferlb.engine.errors.StoreError` in
  :meth:`_write_sync`, the one boundary; they only ever surface through :meth:`backlog` and logs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import delete, insert
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from ..errors import StoreError
from ..types import Clock, SystemClock
from .db import describe_db_error
from .journal import Journal
from .models import ATTEMPTS as _ATTEMPTS
from .models import REQUESTS as _REQUESTS
from .models import to_us
from .records import RequestRecord

__all__ = ["AuditWriter", "record_rows", "upsert_records"]

log = logging.getLogger(__name__)

_IN_CHUNK = 500  # ids per DELETE … IN (…): far below SQLite's and PostgreSQL's parameter limits


# -- record → rows ---------------------------------------------------------------------------------


def _clean_str(s: str) -> str:
    if "\x00" in s:
        s = s.replace("\x00", "\ufffd")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: neither database's UTF-8 encoding accepts them
        s = s.encode("utf-8", "replace").decode("utf-8")
    return s


def _clean_opt(s: str | None) -> str | None:
    return None if s is None else _clean_str(str(s))


def _clean_json(v: Any) -> Any:
    if v is None or isinstance(v, bool | int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return _clean_str(v)
    if isinstance(v, dict):
        return {_clean_str(str(k)): _clean_json(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean_json(x) for x in v]
    return _clean_str(str(v))


def _ms_between(start_us: int | None, end_us: int | None) -> float | None:
    return None if start_us is None or end_us is None else (end_us - start_us) / 1000.0


def record_rows(rec: RequestRecord) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``requests`` row and ``request_attempts`` rows for one record (cleaned, µs timestamps)."""
    received = to_us(rec.received_at) or 0
    first = to_us(rec.first_byte_at)
    last = to_us(rec.last_byte_at)
    attempts: dict[int, dict[str, Any]] = {}
    for a in rec.attempts:
        # A repeated attempt number would violate the primary key; the later entry wins.
        attempts[int(a.number)] = {
            "request_id": _clean_str(rec.request_id),
            "number": int(a.number),
            "node": _clean_str(str(a.node)),
            "model": _clean_str(str(a.model)),
            "started_at_us": to_us(a.started_at) or 0,
            "ended_at_us": to_us(a.ended_at),
            "outcome": _clean_str(str(a.outcome)),
            "http_status": a.http_status,
            "error_class": _clean_opt(a.error_class),
            "first_byte_at_us": to_us(a.first_byte_at),
        }
    row = {
        "request_id": _clean_str(rec.request_id),
        "received_at_us": received,
        "endpoint": _clean_str(str(rec.endpoint)),
        "model_requested": _clean_str(str(rec.model_requested)),
        "tenant": _clean_opt(rec.tenant),
        "model_served": _clean_opt(rec.model_served),
        "model_version": _clean_opt(rec.model_version),
        "node": _clean_opt(rec.node),
        "priority": _clean_opt(rec.priority),
        "stream": bool(rec.stream),
        "status": _clean_str(str(rec.status)),
        "http_status": rec.http_status,
        "error_class": _clean_opt(rec.error_class),
        "admitted_at_us": to_us(rec.admitted_at),
        "routed_at_us": to_us(rec.routed_at),
        "first_byte_at_us": first,
        "last_byte_at_us": last,
        "prompt_tokens_est": rec.prompt_tokens_est,
        "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": rec.completion_tokens,
        "cost_est": rec.cost_est,
        "decision": _clean_json(rec.decision),
        "workflow_path": _clean_json(list(rec.workflow_path)),
        "tags": _clean_json(dict(rec.tags)),
        "engine": _clean_opt(rec.engine),
        "attempt_count": len(attempts),
        "e2e_ms": _ms_between(received, last),
        "ttft_ms": _ms_between(received, first),
        "queue_wait_ms": rec.queue_wait_ms,
    }
    return row, sorted(attempts.values(), key=lambda r: int(r["number"]))


def upsert_records(conn: Connection, records: Sequence[RequestRecord]) -> None:
    """Upsert ``records`` (requests + their attempts) on ``conn``; the caller owns the transaction."""
    latest: dict[str, RequestRecord] = {}
    for rec in records:  # ON CONFLICT cannot touch one row twice in a statement: last version wins
        latest.pop(rec.request_id, None)
        latest[rec.request_id] = rec
    rows: list[dict[str, Any]] = []
    attempt_rows: list[dict[str, Any]] = []
    for rec in latest.values():
        row, attempts = record_rows(rec)
        rows.append(row)
        attempt_rows.extend(attempts)
    if not rows:
        return
    name = conn.dialect.name
    if name == "postgresql":
        stmt: Any = postgresql.insert(_REQUESTS)
    elif name == "sqlite":
        stmt = sqlite.insert(_REQUESTS)
    else:
        raise StoreError(f"unsupported database dialect {name!r} (use SQLite or PostgreSQL)")
    stmt = stmt.on_conflict_do_update(
        index_elements=[_REQUESTS.c.request_id],
        set_={c.name: stmt.excluded[c.name] for c in _REQUESTS.c if c.name != "request_id"},
    )
    conn.execute(stmt, rows)
    ids = [r["request_id"] for r in rows]
    for i in range(0, len(ids), _IN_CHUNK):
        conn.execute(delete(_ATTEMPTS).where(_ATTEMPTS.c.request_id.in_(ids[i : i + _IN_CHUNK])))
    if attempt_rows:
        conn.execute(insert(_ATTEMPTS), attempt_rows)


def _is_record_error(exc: BaseException) -> bool:
    """True when the data of a record is at fault, not the database (which stays usable)."""
    if isinstance(exc, sa_exc.IntegrityError | sa_exc.DataError):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        return False  # operational, programming (missing table, permissions), interface errors
    if isinstance(exc, sa_exc.StatementError):  # the driver could not bind a value
        exc = exc.orig if exc.orig is not None else exc
    return isinstance(exc, OverflowError | TypeError | ValueError | UnicodeError)


# -- the writer ------------------------------------------------------------------------------------


@dataclass
class _Outcome:
    written: int = 0
    error: StoreError | None = None
    quarantined: list[tuple[RequestRecord, str]] = field(default_factory=list)


class AuditWriter:
    """Batched, journaled audit writer. See the module docstring for the contract."""

    def __init__(
        self,
        engine: Engine,
        *,
        journal_dir: Path | str,
        batch_size: int = 256,
        flush_interval_s: float = 0.2,
        clock: Clock | None = None,
        retry_base_s: float = 0.5,
        retry_max_s: float = 30.0,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if flush_interval_s <= 0:
            raise ValueError("flush_interval_s must be > 0")
        self._engine = engine
        self._journal = Journal(journal_dir)
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._clock: Clock = clock or SystemClock()
        self._retry_base_s = retry_base_s
        self._retry_max_s = retry_max_s
        self._pending: collections.deque[RequestRecord] = collections.deque()
        self._lock = asyncio.Lock()        # one flush at a time (background task, tests, close)
        self._wake = asyncio.Event()       # set by submit() when a full batch is waiting
        self._work = asyncio.Event()       # set by submit(): the flush task parks on it while idle
        self._idle = asyncio.Event()       # set when nothing is pending or spooled
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._closing = False
        self._closed = False
        self._failed_flushes = 0
        self._consecutive_failures = 0
        self._retry_at = 0.0
        self._last_error: str | None = None
        self._journal_error: str | None = None
        self._written = 0
        self._dropped = 0
        self.flush_rounds = 0              # rounds of the background task (none while idle)

    # -- public API ---------------------------------------------------------------------------------

    def submit(self, record: RequestRecord) -> None:
        """Queue ``record`` for writing. Never blocks, never raises."""
        if self._closed:
            self._dropped += 1
            log.error("audit record %s submitted after the writer closed; it cannot be stored",
                      getattr(record, "request_id", "?"))
            return
        self._pending.append(record)
        self._idle.clear()
        self._work.set()
        if len(self._pending) >= self._batch_size:
            self._wake.set()

    async def start(self, *, background: bool = True) -> None:
        """Open the journal, replay what a previous run left, and (by default) start the flush task.

        Raises StoreError when the journal directory cannot be used: the gateway must not serve
        requests it could not spool.
        """
        if self._started:
            return
        try:
            await asyncio.to_thread(self._journal.open)
        except OSError as exc:
            raise StoreError(f"cannot open the audit journal in {self._journal.directory}: {exc}") from exc
        self._started = True
        if self._journal.spooled:
            log.info("replaying %d audit records from the journal", self._journal.spooled)
            await self.flush_once(force=True)
        if background:
            self._task = asyncio.create_task(self._run(), name="inferlb-audit-writer")

    async def flush_once(self, *, force: bool = False) -> int:
        """Write what is spooled, then what is queued; return the number of records committed.

        While backing off after a failure (and unless ``force``), the database is not tried:
        queued records are only moved to the journal.
        """
        async with self._lock:
            try:
                return await self._flush_locked(force)
            finally:
                if not self._pending and not self._journal.spooled:
                    self._idle.set()
                else:
                    self._idle.clear()

    async def wait_caught_up(self, timeout_s: float) -> bool:
        """Wait until nothing is pending or spooled (the background task must run); False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._pending or self._journal.spooled:
            self._wake.set()
            try:
                await asyncio.wait_for(self._idle.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return False
        return True

    def backlog(self) -> dict[str, Any]:
        """What is not yet in the database, and how the writer is doing (for /admin and metrics)."""
        now = self._clock.monotonic()
        backing_off = self._consecutive_failures > 0
        return {
            "pending": len(self._pending),
            "spooled": self._journal.spooled,
            "spool_bytes": self._journal.size,
            "quarantined": self._journal.quarantined,
            "failed_flushes": self._failed_flushes,
            "consecutive_failures": self._consecutive_failures,
            "next_retry_in_s": max(0.0, self._retry_at - now) if backing_off else 0.0,
            "last_error": self._last_error,
            "journal_error": self._journal_error,
            "journal_corrupt_lines": self._journal.corrupt_lines,
            "records_written": self._written,
            "records_dropped": self._dropped,
            "healthy": not backing_off and self._journal_error is None,
        }

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop the task, flush within ``timeout_s`` (one forced try), spool the rest, release the journal."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._closing = True
        self._wake.set()
        self._work.set()
        if self._task is not None:
            done, _ = await asyncio.wait({self._task}, timeout=max(0.0, deadline - loop.time()))
            if not done:
                self._task.cancel()
                await asyncio.wait({self._task})
            self._task = None
        if not self._started and self._pending:
            with contextlib.suppress(StoreError):  # records queued before start(): still store them
                await self.start(background=False)
        if self._started:
            remaining = deadline - loop.time()
            if remaining > 0:
                try:
                    await asyncio.wait_for(self.flush_once(force=True), remaining)
                except TimeoutError:
                    log.warning("audit flush did not finish within %.1fs at close; spooling", timeout_s)
            async with self._lock:
                await self._spool_pending()
                await asyncio.to_thread(self._journal.close)
        if self._pending:
            # Neither the database nor the journal took them, and the process is going away.
            self._dropped += len(self._pending)
            log.error("%d audit records could not be stored or spooled at close", len(self._pending))
            self._pending.clear()
        self._closed = True
        self._idle.set()

    # -- internals ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._closing:
            if not self._pending and not self._journal.spooled:
                # Nothing to write: park until a submit (an idle gateway must not wake 5 times a
                # second); the first record then waits at most one flush interval, as before.
                self._work.clear()
                await self._work.wait()
                if self._closing:
                    break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._flush_interval_s)
            self._wake.clear()
            if self._closing:
                break
            self.flush_rounds += 1
            try:
                await self.flush_once()
            except Exception:  # the task must outlive any bug in one flush
                log.exception("audit flush failed unexpectedly")

    async def _flush_locked(self, force: bool) -> int:
        written = 0
        if self._consecutive_failures and not force and self._clock.monotonic() < self._retry_at:
            await self._spool_pending()
            return 0
        # The journal holds older records than the queue: replay it first so the last
        # submission of a request is also the last one written.
        while self._journal.spooled:
            batch, end = await asyncio.to_thread(self._journal.read_batch, self._batch_size)
            if not batch:
                break
            outcome = await asyncio.to_thread(self._write_sync, batch)
            if outcome.error is not None:
                self._on_failure(outcome.error)
                await self._spool_pending()
                return written
            self._journal.advance(end, len(batch))
            written += outcome.written
            self._written += outcome.written
        if not self._journal.spooled and self._journal.size:
            await asyncio.to_thread(self._journal.truncate_if_drained)
        # Only what was queued when this flush began: under steady load a flush still ends.
        todo = len(self._pending)
        while todo > 0:
            batch = list(itertools.islice(self._pending, min(todo, self._batch_size)))
            outcome = await asyncio.to_thread(self._write_sync, batch)
            if outcome.error is not None:
                self._on_failure(outcome.error)
                await self._spool_pending()
                return written
            for _ in batch:
                self._pending.popleft()
            todo -= len(batch)
            written += outcome.written
            self._written += outcome.written
        if self._consecutive_failures:
            log.warning("audit database reachable again after %d failed flushes", self._consecutive_failures)
        self._consecutive_failures = 0
        return written

    def _write_sync(self, batch: list[RequestRecord]) -> _Outcome:
        """Runs in a worker thread: the batch in one transaction, or isolate records it rejects."""
        try:
            with self._engine.begin() as conn:
                upsert_records(conn, batch)
        except Exception as exc:
            if not _is_record_error(exc):
                return self._fail(exc)
            return self._isolate(batch)
        return _Outcome(written=len(batch))

    def _isolate(self, batch: list[RequestRecord]) -> _Outcome:
        """One transaction per record: commit the good ones, quarantine those with bad data."""
        out = _Outcome()
        for rec in batch:
            try:
                with self._engine.begin() as conn:
                    upsert_records(conn, [rec])
            except Exception as exc:
                if not _is_record_error(exc):
                    return self._fail(exc)  # committed ones are rewritten later: the upsert absorbs it
                out.quarantined.append((rec, describe_db_error(exc)))
            else:
                out.written += 1
        if out.quarantined:
            try:
                self._journal.quarantine(out.quarantined)
            except OSError as exc:
                return self._fail(exc)
        for rec, why in out.quarantined:
            log.error("audit record %s rejected by the database, quarantined: %s", rec.request_id, why)
        return out

    @staticmethod
    def _fail(exc: BaseException) -> _Outcome:
        err = StoreError(describe_db_error(exc))
        err.__cause__ = exc
        return _Outcome(error=err)

    def _on_failure(self, err: StoreError) -> None:
        self._failed_flushes += 1
        self._consecutive_failures += 1
        delay = min(self._retry_max_s, self._retry_base_s * 2 ** (self._consecutive_failures - 1))
        self._retry_at = self._clock.monotonic() + delay
        self._last_error = str(err)
        log.warning("audit flush failed (%d in a row), retrying in %.2fs: %s",
                    self._consecutive_failures, delay, err)

    async def _spool_pending(self) -> None:
        if not self._pending:
            return
        records = list(self._pending)
        try:
            await asyncio.to_thread(self._journal.append, records)
        except OSError as exc:
            self._journal_error = f"{type(exc).__name__}: {exc}"
            log.error("cannot spool %d audit records to the journal (kept in memory): %s",
                      len(records), self._journal_error)
            return
        self._journal_error = None
        for _ in records:
            self._pending.popleft()
