"""The audit writer's state, limits and health (:class:`WriterState`, the base of
:class:`~inferlb.store.writer.AuditWriter`; its contract is in :mod:`.writer`).

Here: the queues, journals and counters the writer keeps, why a new request could not be audited
(:meth:`WriterState.refusal`: a journal that cannot be written, a backlog at its limit), the
backlog report for /admin and metrics, and the bookkeeping of journal errors (logged at most once
per interval, cleared when a write succeeds). The work itself (write-ahead group commits, database
flushes, spooling) is in :mod:`.writer`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from sqlalchemy.engine import Engine

from inferlb.background import Background
from inferlb.store.batches import BatchWriter
from inferlb.store.journal import Journal
from inferlb.store.records import RequestRecord
from inferlb.store.wal import Wal
from inferlb.types import Clock, SystemClock

__all__ = ["WriterState"]

# The writer's logger (writer.py and batches.py log under this name too; operators and tests filter on it).
log = logging.getLogger("inferlb.store.writer")

_Item = tuple[RequestRecord, int]   # a record and its write-ahead segment (-1: not journaled)


class _Throttle:
    """At most one log line per ``interval_s`` (injected clock); counts what it held back."""

    def __init__(self, clock: Clock, interval_s: float) -> None:
        self._clock, self._interval_s = clock, interval_s
        self._next_at: float | None = None
        self.suppressed = 0

    def due(self) -> int | None:
        """The number suppressed since the last line when a line is due now; None otherwise."""
        now = self._clock.monotonic()
        if self._next_at is not None and now < self._next_at:
            self.suppressed += 1
            return None
        self._next_at = now + self._interval_s
        n, self.suppressed = self.suppressed, 0
        return n

    def reset(self) -> None:
        self._next_at, self.suppressed = None, 0


class WriterState:
    """The state and health half of :class:`~inferlb.store.writer.AuditWriter`."""

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
        db_timeout_s: float = 10.0,
        wal_commit_interval_s: float = 0.0,
        wal_commit_linger_s: float = 0.0,
        wal_segment_bytes: int = 4 * 1024 * 1024,
        max_records: int = 100_000,
        max_bytes: int = 256 * 1024 * 1024,
        on_full: Literal["closed", "open"] = "closed",
        error_log_interval_s: float = 60.0,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if flush_interval_s <= 0:
            raise ValueError("flush_interval_s must be > 0")
        if db_timeout_s <= 0:
            raise ValueError("db_timeout_s must be > 0")
        self._journal = Journal(journal_dir)
        self._batches = BatchWriter(engine, self._journal, timeout_s=db_timeout_s)
        self._wal = Wal(journal_dir, segment_bytes=wal_segment_bytes)
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._clock: Clock = clock or SystemClock()
        self._retry_base_s = retry_base_s
        self._retry_max_s = retry_max_s
        self._wal_commit_interval_s = max(0.0, wal_commit_interval_s)
        self._wal_linger_s = max(0.0, wal_commit_linger_s)
        self._max_records, self._max_bytes, self._on_full = max_records, max_bytes, on_full
        self._pending: collections.deque[_Item] = collections.deque()
        # Waiting for the next group commit of the write-ahead log.
        self._wal_starts: list[tuple[str, bytes]] = []
        self._wal_finished: list[RequestRecord] = []
        self._wal_waiters: list[asyncio.Future[bool]] = []
        self._wal_wake = asyncio.Event()
        self._wal_urgent = asyncio.Event()   # a request waits on the next group (its first byte is ready)
        self._wal_lock = asyncio.Lock()
        self._wal_loop: Background | None = None   # the journal's group commits (started by start())
        self._inline: set[asyncio.Future[None]] = set()   # commits run inline before the background task runs
        self._wal_error: str | None = None
        # Its own thread: journal I/O never waits behind a hung database call (BatchWriter's thread).
        self._io = ThreadPoolExecutor(1, thread_name_prefix="inferlb-audit-journal")
        self._lock = asyncio.Lock()        # one flush at a time (background task, tests, close)
        self._wake = asyncio.Event()       # set by submit() when a full batch is waiting
        self._work = asyncio.Event()       # set by submit(): the flush task parks on it while idle
        self._idle = asyncio.Event()       # set when nothing is pending or spooled
        self._idle.set()
        self._flush_loop: Background | None = None  # the database flushes (started by start())
        self._started = False
        self._closing = False
        self._closed = False
        self._failed_flushes = 0
        self._consecutive_failures = 0
        self._retry_at = 0.0
        self._last_error: str | None = None
        self._journal_error: str | None = None
        self._journal_log = _Throttle(self._clock, error_log_interval_s)
        self._full_log = _Throttle(self._clock, error_log_interval_s)
        self._written = 0
        self._dropped = 0
        self._unrecorded = 0
        self._recovered = 0
        self.flush_rounds = 0              # rounds of the background task (none while idle)
    # -- health and limits ------------------------------------------------------------------------------

    def refusal(self) -> str | None:
        """Why a new request could not be audited now (None: it can). Cheap: no I/O."""
        if self._closed:
            return "the audit writer is closed"
        if self._wal_error is not None:
            return f"the audit journal cannot be written ({self._wal_error})"
        if self._journal_error is not None:
            return f"the audit spool cannot be written ({self._journal_error})"
        return self._backlog_full()

    def accepting(self) -> bool:
        """True when a new request is served (it can be audited, or ``on_full`` is ``open``)."""
        return self._on_full == "open" or self.refusal() is None

    def backlog(self) -> dict[str, Any]:
        """What is not yet in the database, and how the writer is doing (for /admin and metrics)."""
        now = self._clock.monotonic()
        backing_off = self._consecutive_failures > 0
        refusal = self.refusal()
        healthy = not backing_off and refusal is None
        return {
            "pending": len(self._pending) + len(self._wal_finished),
            "spooled": self._journal.spooled,
            "spool_bytes": self._journal.size,
            "quarantined": self._journal.quarantined,
            "failed_flushes": self._failed_flushes,
            "consecutive_failures": self._consecutive_failures,
            "next_retry_in_s": max(0.0, self._retry_at - now) if backing_off else 0.0,
            "last_error": self._last_error,
            "journal_error": self._wal_error or self._journal_error,
            "journal_corrupt_lines": self._journal.corrupt_lines,
            "records_written": self._written,
            "records_dropped": self._dropped,
            "records_unrecorded": self._unrecorded,
            "records_recovered": self._recovered,
            "healthy": healthy,
            "accepting": self.accepting(),
            # ok; degraded: serving, records wait in the journal; unavailable: requests refused.
            "state": "ok" if healthy else ("degraded" if self.accepting() else "unavailable"),
            "reason": refusal or (self._last_error if backing_off else None),
        }
    # -- internals ----------------------------------------------------------------------------------

    def _backlog_full(self) -> str | None:
        records = len(self._pending) + len(self._wal_finished) + self._journal.spooled
        if records >= self._max_records:
            return f"audit backlog at {records} records (limit {self._max_records})"
        if self._journal.size >= self._max_bytes:
            return f"audit spool at {self._journal.size} bytes (limit {self._max_bytes})"
        return None

    def _set_idle(self) -> None:
        if not self._pending and not self._wal_finished and not self._journal.spooled:
            self._idle.set()
        else:
            self._idle.clear()

    def _journal_failed(self, which: str, exc: OSError, records: int) -> None:
        err = f"{type(exc).__name__}: {exc}"
        if which == "wal":
            self._wal_error = err
            self._work.set()   # the flush task probes the log until it is writable again
        else:
            self._journal_error = err
        if (n := self._journal_log.due()) is not None:
            log.error("cannot write the audit %s (%d records kept in memory; %d similar errors not logged): %s",
                      "write-ahead log" if which == "wal" else "spool", records, n, err)

    def _journal_recovered(self, which: str) -> None:
        if which == "wal" and self._wal_error is not None:
            log.warning("the audit write-ahead log is writable again")
            self._wal_error = None
        elif which == "spool" and self._journal_error is not None:
            log.warning("the audit spool is writable again")
            self._journal_error = None
        if self._wal_error is None and self._journal_error is None:
            self._journal_log.reset()
