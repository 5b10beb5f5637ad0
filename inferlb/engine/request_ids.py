"""Request ids: ``uuid.uuid4().hex`` strings, from a buffer of OS randomness read 4 KiB at a time.

``uuid.uuid4()`` reads its 16 bytes with ``os.urandom``, which releases the GIL around the system
call: under load the audit journal or database thread then takes the interpreter and the event loop
waits until that thread gives it back (180 µs of wall time per id under a profiler at c=16;
docs/benchmarks.md, "The request path profiled again"). :func:`new_request_id` gives the same ids
(version 4, 122 random bits from the same source, ``os.urandom``) with one system call per 256
ids (and no other: the buffer is emptied in a forked child by an ``os.register_at_fork`` hook
instead of comparing ``os.getpid()``, itself a system call, on every id). Thread-safe; a process
forked after a read refills its own buffer, so parent and child never hand out the same bytes.
"""

from __future__ import annotations

import os
import threading
import uuid

__all__ = ["new_request_id"]

_IDS_PER_READ = 256


class _Buffer:
    __slots__ = ("data", "lock", "pos")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data = b""
        self.pos = 0


_buf = _Buffer()


def _forget_after_fork() -> None:
    """In a forked child: drop the parent's bytes (and a lock another thread may have held at the fork)."""
    _buf.lock = threading.Lock()
    _buf.data, _buf.pos = b"", 0


os.register_at_fork(after_in_child=_forget_after_fork)


def new_request_id() -> str:
    """A new request id: 32 lowercase hex digits of a random (version 4) UUID."""
    b = _buf
    with b.lock:
        if b.pos >= len(b.data):
            b.data, b.pos = os.urandom(16 * _IDS_PER_READ), 0
        raw = b.data[b.pos:b.pos + 16]
        b.pos += 16
    return uuid.UUID(bytes=raw, version=4).hex
