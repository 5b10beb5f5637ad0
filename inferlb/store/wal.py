"""The audit write-ahead log: every request's start and finished record, fsynced before use.

Contract (methods are synchronous; :meth:`Wal.write`, :meth:`Wal.open` and :meth:`Wal.close` do
file I/O and run in the writer's journal thread; :meth:`Wal.release` is cheap and thread-safe):

* The log is a series of *segments* ``wal-<pid>-<random>-<seq>.log`` in the journal directory, each
  held with an exclusive ``flock`` while its writer lives (several gateway workers may share one
  directory). Lines are JSON: ``{"k":"s", ...}`` a request started (id, received time, endpoint,
  model, tenant, stream, engine, process and config versions; never prompt content),
  ``{"k":"f","r":{record}}`` a request finished with its complete
  :class:`~inferlb.store.records.RequestRecord`, ``{"k":"p"}`` a no-op (:meth:`Wal.probe`).
* :meth:`Wal.write` appends one group of entries and returns only after ``fsync`` (group commit:
  the caller batches everything that arrived since the previous write); on failure it cuts the
  segment back to its previous size and raises :class:`OSError`. It returns the sequence number of
  the segment holding the finished records; each counts as *outstanding* there until the caller
  :meth:`release`\\ s it (its record is committed to the database or spooled to the journal).
* When the current segment passes ``segment_bytes`` a new one is started, beginning with a copy of
  the start entries of requests still in flight, so an older segment is deleted as soon as none of
  its finished records is outstanding. Nothing a crash could need is ever deleted first.
* :meth:`Wal.open` starts the own first segment and *recovers* every orphan segment (one whose lock
  nobody holds: a crashed or killed process). :func:`recover` turns their lines into the records to
  store: every finished record (the last one of a request wins) and, for a start with no finished
  record, a record with status ``unknown_outcome`` (the request was in flight when the process
  died; a torn last line is skipped and counted). The caller spools them durably, then calls
  :meth:`Wal.remove` on the orphans.
* :meth:`Wal.close` deletes the own segments when nothing is outstanding and no request is in
  flight; otherwise they stay, to be recovered by the next start. POSIX only (``fcntl``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferlb.jsoncodec import dumps
from inferlb.store.journal import _fsync_dir, _write_all
from inferlb.store.records import RequestRecord
from inferlb.store.rows import UNKNOWN_OUTCOME

__all__ = ["Recovered", "Wal", "recover", "start_entry"]

_PREFIX = "wal-"
_SUFFIX = ".log"


def start_entry(record: RequestRecord) -> bytes:
    """The start line of ``record`` (what is known when a request begins)."""
    doc = {"k": "s", "id": record.request_id, "t": record.received_at, "e": record.endpoint,
           "m": record.model_requested, "tn": record.tenant, "st": record.stream, "en": record.engine,
           "pv": record.process_version, "cv": record.config_version}
    return dumps(doc, default=str) + b"\n"


def _finished_entry(record: RequestRecord) -> bytes:
    doc = {"k": "f", "r": record.to_json()}
    return dumps(doc, default=str) + b"\n"


@dataclass
class _Segment:
    seq: int
    path: Path
    fd: int
    size: int = 0
    outstanding: int = 0


@dataclass
class Recovered:
    """What orphan segments held: the records to store, the files to remove once they are safe."""

    records: list[RequestRecord]
    paths: list[Path]
    finished: int = 0
    unknown: int = 0
    corrupt_lines: int = 0


def _unknown_record(entry: dict[str, Any]) -> RequestRecord:
    return RequestRecord(request_id=str(entry["id"]), received_at=float(entry["t"]), endpoint=str(entry["e"]),
                         model_requested=str(entry["m"]), tenant=entry.get("tn"), stream=bool(entry.get("st")),
                         engine=entry.get("en"), process_version=entry.get("pv"), config_version=entry.get("cv"),
                         status=UNKNOWN_OUTCOME, error_class="gateway_stopped",
                         tags={"recovered": "the gateway stopped while the request was in flight"})


def recover(paths: Sequence[Path]) -> Recovered:
    """Parse orphan segments (in the order given) into records; see the module docstring."""
    finished: dict[str, RequestRecord] = {}
    starts: dict[str, dict[str, Any]] = {}
    corrupt = 0
    for path in paths:
        with open(path, "rb") as fh:
            for line in fh:
                try:
                    if not line.endswith(b"\n"):
                        raise ValueError("torn line")
                    doc = json.loads(line)
                    if doc["k"] == "s":
                        starts[str(doc["id"])] = doc
                    elif doc["k"] == "f":
                        rec = RequestRecord.from_json(doc["r"])
                        finished.pop(rec.request_id, None)
                        finished[rec.request_id] = rec
                except (ValueError, TypeError, KeyError):
                    corrupt += 1
    unknown = [_unknown_record(e) for rid, e in starts.items() if rid not in finished]
    records = list(finished.values()) + unknown
    return Recovered(records=records, paths=list(paths), finished=len(finished), unknown=len(unknown),
                     corrupt_lines=corrupt)


class Wal:
    """One writer's write-ahead log. See the module docstring for the contract."""

    def __init__(self, directory: Path | str, *, segment_bytes: int = 4 * 1024 * 1024) -> None:
        if segment_bytes < 1:
            raise ValueError("segment_bytes must be >= 1")
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self._name = ""
        self._lock = threading.Lock()
        self._segments: dict[int, _Segment] = {}
        self._current: _Segment | None = None
        self._open_starts: dict[str, bytes] = {}   # requests started and not yet finished
        self.fsyncs = 0
        self.entries = 0

    # -- lifecycle --------------------------------------------------------------------------------

    def open(self) -> Recovered:
        """Start the own first segment; return the orphans' records (not yet removed). Raises OSError."""
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._name = f"{_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-"
            self._new_segment_locked(0)
            orphans: list[Path] = []
            held: list[int] = []
            try:
                for path in sorted(self.directory.glob(f"{_PREFIX}*{_SUFFIX}")):
                    if path.name.startswith(self._name):
                        continue
                    fd = self._lock_orphan(path)
                    if fd is not None:
                        held.append(fd)
                        orphans.append(path)
                rec = recover(orphans)
            finally:
                for fd in held:  # released: a concurrent adopter may now recover them too (upserts absorb it)
                    os.close(fd)
            return rec

    @staticmethod
    def _lock_orphan(path: Path) -> int | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None  # a live writer owns it
        return fd

    def remove(self, paths: Sequence[Path]) -> None:
        """Delete recovered orphan segments (after their records were stored durably)."""
        for p in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        if paths:
            _fsync_dir(self.directory)

    def close(self) -> None:
        """Release the segments; delete them when nothing in them can still be needed."""
        with self._lock:
            idle = not self._open_starts and all(s.outstanding <= 0 for s in self._segments.values())
            for seg in list(self._segments.values()):
                if idle:
                    with contextlib.suppress(OSError):
                        os.unlink(seg.path)
                os.close(seg.fd)
            if idle and self._segments:
                with contextlib.suppress(OSError):
                    _fsync_dir(self.directory)
            self._segments.clear()
            self._current = None

    # -- writing ------------------------------------------------------------------------------------

    def write(self, starts: Sequence[tuple[str, bytes]], finished: Sequence[RequestRecord]) -> int:
        """Append start lines and finished records, fsync; the segment seq of ``finished``."""
        body = [line for _, line in starts]
        body.extend(_finished_entry(r) for r in finished)
        data = b"".join(body)
        with self._lock:
            seg = self._current
            if seg is None:
                raise OSError("the audit write-ahead log is not open")
            if seg.size >= self.segment_bytes:
                seg = self._rotate_locked()
            try:
                _write_all(seg.fd, data)
                os.fsync(seg.fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(seg.fd, seg.size)
                raise
            self.fsyncs += 1
            self.entries += len(starts) + len(finished)
            seg.size += len(data)
            seg.outstanding += len(finished)
            for rid, line in starts:
                if rid:
                    self._open_starts[rid] = line
            for r in finished:
                self._open_starts.pop(r.request_id, None)
            self._collect_locked()
            return seg.seq

    def probe(self) -> None:
        """Write and fsync one no-op line: does the log take writes again? Raises OSError."""
        self.write([("", b'{"k":"p"}\n')], [])

    def release(self, seq: int, count: int = 1) -> None:
        """``count`` finished records of segment ``seq`` are now safe elsewhere (database or spool)."""
        with self._lock:
            seg = self._segments.get(seq)
            if seg is not None:
                seg.outstanding -= count

    def collect(self) -> int:
        """Delete old segments with nothing outstanding; how many were deleted."""
        with self._lock:
            return self._collect_locked()

    def stats(self) -> dict[str, int]:
        """Segments, bytes, outstanding finished records and requests in flight (no syscall)."""
        with self._lock:
            segs = list(self._segments.values())
            return {"segments": len(segs), "bytes": sum(s.size for s in segs),
                    "outstanding": sum(max(0, s.outstanding) for s in segs), "in_flight": len(self._open_starts),
                    "fsyncs": self.fsyncs}

    # -- internals ----------------------------------------------------------------------------------

    def _new_segment_locked(self, seq: int) -> _Segment:
        name = f"{self._name}{seq:08d}{_SUFFIX}"
        tmp = self.directory / (name + ".new")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        try:
            # Locked before the name becomes visible to recoverers (they only look at *.log).
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path = self.directory / name
            os.replace(tmp, path)
            _fsync_dir(self.directory)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        seg = _Segment(seq=seq, path=path, fd=fd)
        self._segments[seq] = seg
        self._current = seg
        return seg

    def _rotate_locked(self) -> _Segment:
        old = self._current
        assert old is not None
        seg = self._new_segment_locked(old.seq + 1)
        carried = b"".join(self._open_starts.values())
        try:
            if carried:
                _write_all(seg.fd, carried)
                os.fsync(seg.fd)
                self.fsyncs += 1
        except OSError:
            # Keep writing to the old segment; the empty new one is dropped.
            self._segments.pop(seg.seq, None)
            os.close(seg.fd)
            with contextlib.suppress(OSError):
                os.unlink(seg.path)
            self._current = old
            raise
        seg.size = len(carried)
        return seg

    def _collect_locked(self) -> int:
        gone = [s for s in self._segments.values() if s is not self._current and s.outstanding <= 0]
        for seg in gone:
            with contextlib.suppress(OSError):
                os.unlink(seg.path)
            os.close(seg.fd)
            del self._segments[seg.seq]
        if gone:
            with contextlib.suppress(OSError):
                _fsync_dir(self.directory)
        return len(gone)
