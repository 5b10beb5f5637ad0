"""engine/request_ids.py: uuid4 hex ids from a buffered read of OS randomness."""

from __future__ import annotations

import os
import uuid

import pytest

from inferlb.engine import request_ids
from inferlb.engine.request_ids import new_request_id


def test_ids_are_uuid4_hex_and_distinct_across_refills() -> None:
    ids = [new_request_id() for _ in range(3 * request_ids._IDS_PER_READ + 5)]   # past three refills
    assert len(set(ids)) == len(ids)
    for rid in ids:
        u = uuid.UUID(hex=rid)
        assert rid == u.hex and len(rid) == 32
        assert u.version == 4 and u.variant == uuid.RFC_4122


def test_one_read_per_256_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = os.urandom

    def counting(n: int) -> bytes:
        reads.append(n)
        return real(n)

    monkeypatch.setattr(request_ids, "_buf", request_ids._Buffer())
    monkeypatch.setattr(request_ids.os, "urandom", counting)
    for _ in range(request_ids._IDS_PER_READ + 1):
        new_request_id()
    assert reads == [16 * request_ids._IDS_PER_READ] * 2


def test_a_forked_child_refills(monkeypatch: pytest.MonkeyPatch) -> None:
    """After fork the child forgets the parent's bytes: its next id comes from a fresh read."""
    buf = request_ids._Buffer()
    monkeypatch.setattr(request_ids, "_buf", buf)
    new_request_id()
    parent_bytes = buf.data
    request_ids._forget_after_fork()            # what os.register_at_fork runs in a child
    rid = new_request_id()
    assert buf.data != parent_bytes and buf.pos == 16
    assert uuid.UUID(hex=rid).bytes == uuid.UUID(bytes=buf.data[:16], version=4).bytes


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_real_child_never_repeats_the_parents_ids() -> None:
    new_request_id()                              # the parent's buffer holds unread bytes
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # the child: write its next id, exit at once
        os.close(r)
        os.write(w, new_request_id().encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 64).decode()
    os.close(r)
    os.waitpid(pid, 0)
    parent = new_request_id()                     # the parent's next id from the same buffer position
    assert len(child) == 32 and child != parent
