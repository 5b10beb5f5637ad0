"""The batched audit writer: request records into the database, never silently lost.

Contract:

* **Write-ahead.** :meth:`AuditWriter.begin` journals a request's *start* entry and returns once
  it is fsynced; :meth:`AuditWriter.submit` queues its finished record for the write-ahead log
  (:mod:`~inferlb.store.wal`). A journal task group-commits what arrived (one ``write`` +
  ``fsync`` in the journal thread, never on the event loop: a commit starts when the previous one
  ended, so everything that arrived meanwhile shares its fsync; ``wal_commit_interval_s`` > 0 also
  spaces commits at least that far apart, fewer fsyncs for more latency; ``wal_commit_linger_s``
  > 0 lets a group that no request is waiting on gather entries that long before its commit, and
  a request that awaits its start entry (its answer's first byte is ready) ends the linger at once,
  as does a streamed request's start entry (its first byte follows the node's first token),
  so the linger saves fsyncs while the nodes work and never delays a first byte by more than
  ``wal_commit_interval_s`` and one commit);
  only then does a record count as handed over and join the database queue. After a crash (even
  SIGKILL) :meth:`start` recovers every finished record and marks every started-but-unfinished
  request ``unknown_outcome`` (such a row never replaces a real one).
* :meth:`submit` never blocks and never raises (call it from the event loop thread). A record
  submitted after :meth:`close` is counted in ``records_dropped`` and logged.
* Flushing (the background task, or :meth:`flush_once` called directly by tests) writes batches of
  at most ``batch_size`` records in ONE transaction each, as an idempotent upsert keyed on
  ``request_id`` (:func:`~inferlb.store.rows.upsert_records`): the last submission of a
  request wins and replays cannot duplicate rows. Records leave memory only after their commit.
* **Every database call is bounded** (:class:`~inferlb.store.batches.BatchWriter`: one
  thread, each call awaited for at most ``db_timeout_s``; a hung server counts as a failed flush).
* On a database failure the queued records are appended to the local spool
  (:mod:`~inferlb.store.journal`, fsynced) and the database is retried with capped
  exponential backoff (``retry_base_s · 2^(n-1)`` up to ``retry_max_s``, timed by the injected
  clock). The spool is replayed in order before anything newer, then truncated.
* A batch that fails with a *data* error is written record by record; records rejected again are
  quarantined (``quarantine.jsonl``), the rest committed (``BatchWriter``). Any other error means
  the database is unusable: the batch is spooled and retried, never quarantined.
* **Limits.** :meth:`refusal` says why a new request cannot be audited: the journal cannot be
  written, or the backlog (records queued + spooled) is at ``max_records`` or the spool at
  ``max_bytes``. With ``on_full="closed"`` (the default) :meth:`begin` then raises
  :class:`~inferlb.errors.AuditUnavailable` (503 ``audit_unavailable`` with Retry-After);
  with ``on_full="open"`` requests are served, and records that cannot be kept past the mark are
  counted in ``records_unrecorded``. Journal errors are logged at most once per
  ``error_log_interval_s`` (with the number suppressed) and cleared as soon as a write succeeds.
* Errors from the database are mapped to :class:`~inferlb.errors.StoreError` in
  ``BatchWriter``, the one boundary; they only ever surface through :meth:`backlog` and logs.
"""


from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections.abc import Awaitable, Generator
from typing import Any

from inferlb.background import Background
from inferlb.errors import AuditUnavailable, StoreError
from inferlb.store.records import RequestRecord
from inferlb.store.wal import start_entry
from inferlb.store.writer_state import WriterState, _Item

__all__ = ["AuditWriter"]

log = logging.getLogger(__name__)


class AuditWriter(WriterState):
    """Write-ahead, batched audit writer. See the module docstring for the contract."""

    # -- public API ---------------------------------------------------------------------------------

    def submit(self, record: RequestRecord) -> None:
        """Queue ``record`` for the write-ahead log and the database. Never blocks, never raises."""
        if self._closed:
            self._dropped += 1
            log.error("audit record %s submitted after the writer closed; it cannot be stored",
                      getattr(record, "request_id", "?"))
            return
        if self._on_full == "open" and self._backlog_full() is not None:
            self._unrecorded += 1
            if (n := self._full_log.due()) is not None:
                log.error("audit backlog full (%s): request %s served without an audit record "
                          "(%d more not logged)", self._backlog_full(), record.request_id, n)
            return
        self._wal_finished.append(record)
        self._idle.clear()
        self._wal_wake.set()

    def journal_start(self, record: RequestRecord) -> Awaitable[bool] | None:
        """Queue ``record``'s start entry for the write-ahead log; returns an awaitable that
        resolves once the entry is durable (True) or could not be written (False), or None when
        there is nothing to wait for. Never blocks: the caller awaits it only before its response's
        first byte, so the group commit overlaps the work at the node; awaiting it before the entry
        is durable ends the group's linger (``wal_commit_linger_s``).

        Raises AuditUnavailable when the request cannot be audited and ``on_full`` is ``closed``.
        """
        why = self.refusal()
        if why is not None:
            if self._on_full == "closed":
                raise AuditUnavailable(f"The gateway cannot record this request: {why}",
                                       retry_after_s=max(1.0, self._flush_interval_s * 5))
            return None
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._wal_starts.append((record.request_id, start_entry(record)))
        self._wal_waiters.append(fut)
        if record.stream:
            # A stream's first byte comes after the node's first token, not its whole answer: a
            # group holding one commits as soon as the interval allows (no linger), so streams
            # keep the first-byte latency they had without it (docs/benchmarks.md).
            self._wal_urgent.set()
        if self._wal_loop is None:   # not started (tests of the writer alone): commit inline
            task = asyncio.ensure_future(self._commit_wal())
            self._inline.add(task)
            task.add_done_callback(self._inline.discard)
        else:
            self._wal_wake.set()
        return _Durable(fut, self._wal_urgent)

    async def begin(self, record: RequestRecord) -> None:
        """:meth:`journal_start`, then wait until the start entry is durable.

        Raises AuditUnavailable when the request cannot be audited and ``on_full`` is ``closed``.
        """
        fut = self.journal_start(record)
        if fut is not None and not await fut and self._on_full == "closed":
            raise AuditUnavailable(f"The gateway cannot record this request: {self._wal_error}",
                                   retry_after_s=max(1.0, self._flush_interval_s * 5))

    async def start(self, *, background: bool = True) -> None:
        """Open the spool and the write-ahead log, store what a stopped process left, and (by
        default) start the background tasks.

        Raises StoreError when the journal directory cannot be used: the gateway must not serve
        requests it could not journal.
        """
        if self._started:
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._io, self._journal.open)
            recovered = await loop.run_in_executor(self._io, self._wal.open)
            if recovered.records:
                await loop.run_in_executor(self._io, self._journal.append, recovered.records)
            await loop.run_in_executor(self._io, self._wal.remove, recovered.paths)
        except OSError as exc:
            raise StoreError(f"cannot open the audit journal in {self._journal.directory}: {exc}") from exc
        self._started = True
        self._recovered = len(recovered.records)
        if recovered.paths:
            log.warning("recovered the audit write-ahead log of a stopped process: %d finished records, "
                        "%d requests in flight marked %s, %d torn lines skipped", recovered.finished,
                        recovered.unknown, "unknown_outcome", recovered.corrupt_lines)
        if self._journal.spooled:
            log.info("replaying %d audit records from the journal", self._journal.spooled)
            await self.flush_once(force=True)
        if background:
            self._wal_loop = Background("inferlb-audit-wal", self._run_wal, logger=log)
            self._flush_loop = Background("inferlb-audit-writer", self._run, logger=log)
            self._wal_loop.start()
            self._flush_loop.start()

    async def flush_once(self, *, force: bool = False) -> int:
        """Commit the write-ahead log, then write what is spooled and queued; the number committed.

        While backing off after a failure (and unless ``force``), the database is not tried:
        queued records are only moved to the spool.
        """
        await self._commit_wal()
        async with self._lock:
            try:
                return await self._flush_locked(force)
            finally:
                self._set_idle()

    async def wait_caught_up(self, timeout_s: float) -> bool:
        """Wait until nothing is pending or spooled (the background task must run); False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._pending or self._wal_finished or self._journal.spooled:
            self._wake.set()
            try:
                await asyncio.wait_for(self._idle.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return False
        return True

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop the tasks, flush within ``timeout_s`` (one forced try), spool the rest, release the
        journal. Records neither written nor spooled stay in the write-ahead log for the next start."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._closing = True
        self._wake.set()
        self._work.set()
        self._wal_wake.set()
        self._wal_urgent.set()
        for bg in (self._wal_loop, self._flush_loop):
            if bg is not None:   # signalled above: each may finish its turn until the deadline
                await bg.stop(grace_s=max(0.0, deadline - loop.time()))
        self._wal_loop = self._flush_loop = None
        if not self._started and (self._wal_finished or self._pending):
            with contextlib.suppress(StoreError):  # records queued before start(): still store them
                await self.start(background=False)
        if self._started:
            remaining = deadline - loop.time()
            if remaining > 0:
                try:
                    await asyncio.wait_for(self.flush_once(force=True), remaining)
                except TimeoutError:
                    log.warning("audit flush did not finish within %.1fs at close; spooling", timeout_s)
            await self._commit_wal()
            async with self._lock:
                await self._spool_pending()
                await loop.run_in_executor(self._io, self._journal.close)
                await loop.run_in_executor(self._io, self._wal.close)
        lost = sum(1 for _, seq in self._pending if seq < 0) + len(self._wal_finished)
        if lost:
            # Neither the database nor a journal took them, and the process is going away.
            self._dropped += lost
            log.error("%d audit records could not be stored or journaled at close", lost)
        elif self._pending:
            log.warning("%d audit records stay in the write-ahead log for the next start", len(self._pending))
        self._pending.clear()
        self._wal_finished.clear()
        self._closed = True
        self._idle.set()
        self._io.shutdown(wait=True)
        self._batches.close()

    # -- write-ahead log ------------------------------------------------------------------------------

    async def _run_wal(self) -> None:
        loop = asyncio.get_running_loop()
        last = -math.inf
        while not self._closing:
            await self._wal_wake.wait()
            if self._wal_linger_s > 0 and not self._wal_urgent.is_set() and not self._closing:
                # Nobody waits on this group yet (the nodes are still working on its requests): let
                # it gather what arrives for up to the linger; a request whose first byte is ready
                # ends it (_Durable). One fsync then covers several requests' entries.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wal_urgent.wait(), self._wal_linger_s)
            # At most one commit per interval: an idle log commits at once (latency = one fsync),
            # a busy one gathers a group for each fsync.
            wait = last + self._wal_commit_interval_s - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._wal_wake.clear()
            self._wal_urgent.clear()
            last = loop.time()
            try:
                await self._commit_wal()
            except Exception:  # the task must outlive any bug in one commit
                log.exception("audit journal commit failed unexpectedly")

    async def _commit_wal(self) -> None:
        """One group commit: what ``begin``/``submit`` queued goes to the log, then to the database queue."""
        async with self._wal_lock:
            starts, finished, waiters = self._wal_starts, self._wal_finished, self._wal_waiters
            self._wal_starts, self._wal_finished, self._wal_waiters = [], [], []
            seq, ok = -1, False
            try:
                if not starts and not finished:
                    ok = True
                elif self._started:
                    seq = await asyncio.get_running_loop().run_in_executor(self._io, self._wal.write, starts,
                                                                           finished)
                    ok = True
            except OSError as exc:
                self._journal_failed("wal", exc, len(finished))
            finally:
                # Even when not journaled the records stay queued for the database (never lost silently).
                self._pending.extend((r, seq) for r in finished)
                if finished:
                    self._work.set()   # the flush task parks while nothing is pending
                for w in waiters:
                    if not w.done():
                        w.set_result(ok)
            if ok and (starts or finished):
                self._journal_recovered("wal")
            if len(self._pending) >= self._batch_size:
                self._wake.set()
    # -- internals ----------------------------------------------------------------------------------

    async def _probe_wal(self) -> None:
        """While the log cannot be written nothing new arrives (requests are refused): try it again."""
        try:
            await asyncio.get_running_loop().run_in_executor(self._io, self._wal.probe)
        except OSError as exc:
            self._journal_failed("wal", exc, 0)
        else:
            self._journal_recovered("wal")

    async def _run(self) -> None:
        while not self._closing:
            if not self._pending and not self._journal.spooled and self._wal_error is None:
                # Nothing to write and no broken log to probe: park until a submit (an idle gateway
                # must not wake 5 times a second); the first record then waits at most one flush
                # interval, as before.
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
                if self._wal_error is not None:
                    await self._probe_wal()
                await self.flush_once()
            except Exception:  # the task must outlive any bug in one flush
                log.exception("audit flush failed unexpectedly")

    def _release(self, items: list[_Item]) -> None:
        """Their records are in the database or the spool: the write-ahead log may let them go."""
        for seq, group in itertools.groupby(seq for _, seq in items):
            if seq >= 0:
                self._wal.release(seq, sum(1 for _ in group))

    async def _flush_locked(self, force: bool) -> int:
        written = 0
        if self._consecutive_failures and not force and self._clock.monotonic() < self._retry_at:
            await self._spool_pending()
            return 0
        loop = asyncio.get_running_loop()
        # The journal holds older records than the queue: replay it first so the last
        # submission of a request is also the last one written.
        while self._journal.spooled:
            batch, end = await loop.run_in_executor(self._io, self._journal.read_batch, self._batch_size)
            if not batch:
                break
            outcome = await self._batches.write(batch)
            if outcome.error is not None:
                self._on_failure(outcome.error)
                await self._spool_pending()
                return written
            self._journal.advance(end, len(batch))
            written += outcome.written
            self._written += outcome.written
        if not self._journal.spooled and self._journal.size:
            await loop.run_in_executor(self._io, self._journal.truncate_if_drained)
        # Only what was queued when this flush began: under steady load a flush still ends.
        todo = len(self._pending)
        while todo > 0:
            items = list(itertools.islice(self._pending, min(todo, self._batch_size)))
            outcome = await self._batches.write([rec for rec, _ in items])
            if outcome.error is not None:
                self._on_failure(outcome.error)
                await self._spool_pending()
                return written
            for _ in items:
                self._pending.popleft()
            self._release(items)
            todo -= len(items)
            written += outcome.written
            self._written += outcome.written
        if self._consecutive_failures:
            log.warning("audit database reachable again after %d failed flushes", self._consecutive_failures)
        self._consecutive_failures = 0
        if self._journal_error is not None and not self._pending:
            self._journal_recovered("spool")   # nothing needs the spool any more
        return written

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
        items = list(self._pending)
        try:
            await asyncio.get_running_loop().run_in_executor(self._io, self._journal.append,
                                                             [rec for rec, _ in items])
        except OSError as exc:
            self._journal_failed("spool", exc, len(items))
            return
        self._journal_recovered("spool")
        for _ in items:
            self._pending.popleft()
        self._release(items)


class _Durable:
    """The start entry's commit as :meth:`AuditWriter.journal_start` returns it: awaiting it while
    the entry is not yet durable tells the journal task that a request waits (ends the linger)."""

    __slots__ = ("_fut", "_urgent")

    def __init__(self, fut: asyncio.Future[bool], urgent: asyncio.Event) -> None:
        self._fut = fut
        self._urgent = urgent

    def __await__(self) -> Generator[Any, None, bool]:
        if not self._fut.done():
            self._urgent.set()
        return self._fut.__await__()
