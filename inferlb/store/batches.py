"""Audit batches into the database, each call bounded in time.

Contract:

* :meth:`BatchWriter.write` runs one batch as ONE transaction
  (:func:`~inferlb.store.rows.upsert_records`) on the writer's own database thread and awaits
  it for at most ``timeout_s``. A call past it (a hung server: connection open, no replies) is an
  error outcome; while it has not returned no other call is started (one thread keeps the writes in
  order and a hung call cannot take more threads) and every write fails at once. The engine bounds
  the same calls on the server side (:func:`~inferlb.store.db.make_engine`).
* A batch that fails with a *data* error is written record by record; records rejected again are
  quarantined (the journal's ``quarantine.jsonl``, with the error) and the rest committed. Any other
  error means the database is unusable: the outcome carries it, nothing is quarantined.
* Foreign errors are mapped to :class:`~inferlb.errors.StoreError` here; :meth:`write`
  never raises.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine

from inferlb.errors import StoreError
from inferlb.store.db import describe_db_error
from inferlb.store.journal import Journal
from inferlb.store.records import RequestRecord
from inferlb.store.rows import is_record_error, upsert_records

__all__ = ["BatchWriter", "Outcome"]

log = logging.getLogger("inferlb.store.writer")


@dataclass
class Outcome:
    """What one write did: records committed, the error that stopped it, records quarantined."""

    written: int = 0
    error: StoreError | None = None
    quarantined: list[tuple[RequestRecord, str]] = field(default_factory=list)


class BatchWriter:
    """Bounded batch writes on one database thread (see the module docstring)."""

    def __init__(self, engine: Engine, journal: Journal, *, timeout_s: float) -> None:
        self._engine, self._journal, self._timeout_s = engine, journal, timeout_s
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="inferlb-audit-db")
        self._busy: asyncio.Future[Outcome] | None = None
        self._busy_since = 0.0

    def close(self) -> None:
        """Release the thread without waiting: a hung call must not hold the shutdown."""
        self._thread.shutdown(wait=False)

    async def write(self, batch: list[RequestRecord]) -> Outcome:
        """``batch`` in one transaction on the database thread, awaited for at most ``timeout_s``."""
        loop = asyncio.get_running_loop()
        busy = self._busy
        if busy is not None and not busy.done():
            return Outcome(error=StoreError(
                f"a database call has not returned for {loop.time() - self._busy_since:.1f}s "
                "(the database does not answer)"))
        fut = loop.run_in_executor(self._thread, self._write_sync, batch)
        self._busy, self._busy_since = fut, loop.time()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self._timeout_s)
        except TimeoutError:
            return Outcome(error=StoreError(
                f"the database did not answer within {self._timeout_s:g}s (db_timeout_s)"))

    def _write_sync(self, batch: list[RequestRecord]) -> Outcome:
        """Runs in the database thread: the batch in one transaction, or isolate records it rejects."""
        try:
            with self._engine.begin() as conn:
                upsert_records(conn, batch)
        except Exception as exc:
            if not is_record_error(exc):
                return self._fail(exc)
            return self._isolate(batch)
        return Outcome(written=len(batch))

    def _isolate(self, batch: list[RequestRecord]) -> Outcome:
        """One transaction per record: commit the good ones, quarantine those with bad data."""
        out = Outcome()
        for rec in batch:
            try:
                with self._engine.begin() as conn:
                    upsert_records(conn, [rec])
            except Exception as exc:
                if not is_record_error(exc):
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
    def _fail(exc: BaseException) -> Outcome:
        err = StoreError(describe_db_error(exc))
        err.__cause__ = exc
        return Outcome(error=err)
