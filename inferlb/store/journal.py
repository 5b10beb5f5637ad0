"""The audit writer's local spool: an append-only, fsynced JSON-lines file of RequestRecords
(:class:`Journal`; the generic :class:`Spool` also keeps node events, ``store/events.py``).

Contract (all methods are synchronous and thread-safe; the writer calls them via ``to_thread``):

* Each live writer owns one file ``audit-<pid>-<random>.jsonl`` in ``directory``, held with an
  exclusive ``flock`` for its lifetime, so several gateway workers can share one journal directory.
* :meth:`Journal.open` creates the file and *adopts* every orphan journal (one whose lock nobody
  holds: left by a crashed or recycled process): its valid lines are appended to the own file,
  fsynced, and only then is the orphan deleted. A crash in between only duplicates records, which
  the writer's upsert on ``request_id`` absorbs. A torn last line (a write cut by the crash, so
  never acknowledged as spooled) is skipped and counted in :attr:`Journal.corrupt_lines`.
* :meth:`Journal.append` returns only after ``fsync``; on failure (ENOSPC, EIO) it cuts the file
  back to its previous size so no half line is left for the next append to corrupt, and raises
  :class:`OSError`.
* Records are consumed in order with :meth:`read_batch` + :meth:`advance` (after the DB commit);
  :meth:`truncate_if_drained` empties the file once every line was consumed and nothing was appended
  meanwhile. POSIX only (``fcntl``).
* :meth:`quarantine` keeps records the database rejects on their own (never dropped) in
  ``quarantine.jsonl`` for an operator, with the error.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from inferlb.jsoncodec import dumps
from inferlb.store.records import RequestRecord

__all__ = ["QUARANTINE_FILE", "Journal", "Spool", "dump_record", "load_record"]

QUARANTINE_FILE = "quarantine.jsonl"
_PREFIX = "audit-"
_SUFFIX = ".jsonl"
_ADOPT_CHUNK = 1000
T = TypeVar("T")


def dump_record(record: RequestRecord) -> bytes:
    """One journal line. ``default=str`` so an odd value in ``decision``/``tags`` cannot stop spooling."""
    return dumps(record.to_json(), default=str) + b"\n"


def load_record(line: bytes) -> RequestRecord | None:
    """Parse one journal line; None when it is not a complete, valid record."""
    if not line.endswith(b"\n"):
        return None
    try:
        data = json.loads(line)
        if not isinstance(data, dict):
            return None
        return RequestRecord.from_json(data)
    except (ValueError, TypeError):
        return None


def _fsync_dir(directory: Path) -> None:
    # A new or removed file name is durable only once its directory is fsynced.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class Spool(Generic[T]):
    """One writer's spool file of ``T`` items (one JSON line each, ``dump``/``load``). See the
    module docstring for the contract; ``prefix`` names the files (``<prefix><pid>-<random>.jsonl``)."""

    def __init__(self, directory: Path | str, *, prefix: str, dump: Callable[[T], bytes],
                 load: Callable[[bytes], T | None]) -> None:
        self._prefix, self._dump, self._load = prefix, dump, load
        self.directory = Path(directory)
        self.path: Path | None = None
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._read_offset = 0
        self._scanned = 0          # furthest offset read_batch has looked at
        self.spooled = 0           # records in the file not yet consumed
        self.size = 0              # bytes in the own file (kept here so backlog() makes no syscall)
        self.corrupt_lines = 0     # torn or invalid lines skipped (adoption or reading)
        self.adopted = 0           # records taken over from orphan journals at open()
        self.quarantined = 0

    # -- lifecycle --------------------------------------------------------------------------------

    def open(self) -> None:
        """Create and lock the own file, then adopt orphan journals. Raises OSError."""
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            name = f"{self._prefix}{os.getpid()}-{secrets.token_hex(4)}{_SUFFIX}"
            tmp = self.directory / (name + ".new")
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
            # Lock before the name becomes visible to adopters (they only look at *.jsonl).
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.path = self.directory / name
            os.replace(tmp, self.path)
            _fsync_dir(self.directory)
            self._fd = fd
            # ``*.new`` files are never adopted: they hold nothing, and one may be a starting
            # writer's file in the instant before it is locked and renamed.
            for orphan in sorted(self.directory.glob(f"{self._prefix}*{_SUFFIX}")):
                if orphan != self.path:
                    self._adopt(orphan)

    def _adopt(self, orphan: Path) -> None:
        try:
            fd = os.open(orphan, os.O_RDONLY)
        except FileNotFoundError:
            return  # another writer adopted it first
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # a live writer owns it
            try:
                if os.stat(orphan).st_ino != os.fstat(fd).st_ino:
                    return  # adopted and replaced while we waited
            except FileNotFoundError:
                return
            records: list[T] = []
            with os.fdopen(os.dup(fd), "rb") as fh:
                for line in fh:
                    rec = self._load(line)
                    if rec is None:
                        self.corrupt_lines += 1
                        continue
                    records.append(rec)
                    if len(records) >= _ADOPT_CHUNK:  # a long outage's journal need not fit in memory
                        self._append_locked(records)
                        self.adopted += len(records)
                        records.clear()
            if records:
                self._append_locked(records)
                self.adopted += len(records)
            os.unlink(orphan)
            _fsync_dir(self.directory)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Release the file; remove it when nothing is left to replay."""
        with self._lock:
            if self._fd is None:
                return
            if self.spooled == 0 and self.path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
                    _fsync_dir(self.directory)
            os.close(self._fd)  # also releases the flock
            self._fd = None

    # -- spool ------------------------------------------------------------------------------------

    def append(self, records: Sequence[T]) -> None:
        """Append ``records`` and fsync; on error leave the file as it was and raise OSError."""
        with self._lock:
            self._append_locked(records)

    def _append_locked(self, records: Sequence[T]) -> None:
        if self._fd is None:
            raise OSError("journal is not open")
        data = b"".join(self._dump(r) for r in records)
        before = os.fstat(self._fd).st_size
        try:
            _write_all(self._fd, data)
            os.fsync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, before)
            raise
        self.spooled += len(records)
        self.size = before + len(data)

    def _lines_from(self, offset: int) -> Iterator[tuple[bytes, int]]:
        assert self.path is not None
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            for line in iter(fh.readline, b""):
                offset += len(line)
                yield line, offset

    def read_batch(self, limit: int) -> tuple[list[T], int]:
        """Up to ``limit`` records from the consume position, and the offset just after them."""
        with self._lock:
            out: list[T] = []
            end = self._read_offset
            if self.spooled == 0:
                return out, end
            for line, end in self._lines_from(self._read_offset):
                rec = self._load(line)
                if rec is None:
                    if end > self._scanned:  # a retried batch must not count the same line twice
                        self.corrupt_lines += 1
                    continue
                out.append(rec)
                if len(out) >= limit:
                    break
            self._scanned = max(self._scanned, end)
            if not out:
                self.spooled = 0  # only unreadable lines were left: nothing more to replay
            return out, end

    def advance(self, end_offset: int, count: int) -> None:
        """Mark the records read up to ``end_offset`` as committed to the database."""
        with self._lock:
            self._read_offset = max(self._read_offset, end_offset)
            self.spooled = max(0, self.spooled - count)

    def truncate_if_drained(self) -> bool:
        """Empty the file when every line was consumed and nothing was appended since."""
        with self._lock:
            if self._fd is None or self.spooled:
                return False
            if os.fstat(self._fd).st_size != self._read_offset:
                return False
            os.ftruncate(self._fd, 0)
            os.fsync(self._fd)
            self.size = 0
            self._read_offset = self._scanned = 0
            return True



class Journal(Spool[RequestRecord]):
    """The audit writer's spool of request records, with the quarantine of rejected ones."""

    def __init__(self, directory: Path | str) -> None:
        super().__init__(directory, prefix=_PREFIX, dump=dump_record, load=load_record)

    # -- quarantine -------------------------------------------------------------------------------

    def quarantine(self, items: Sequence[tuple[RequestRecord, str]]) -> None:
        """Durably keep records the database rejects on their own, with the reason. Raises OSError."""
        lines = []
        for rec, error in items:
            entry: dict[str, Any] = {"error": error, "record": rec.to_json()}
            lines.append(dumps(entry, default=str) + b"\n")
        with self._lock:
            fd = os.open(self.directory / QUARANTINE_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                _write_all(fd, b"".join(lines))
                os.fsync(fd)
            finally:
                os.close(fd)
            self.quarantined += len(items)
