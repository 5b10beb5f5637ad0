"""The SQLite engine's prepared-statement cache stays small however many batch sizes the writer uses.

A batched upsert of n records (and ``DELETE … IN`` of n ids) is a different SQL text for every n,
and sqlite3 keeps up to ``cached_statements`` of them per connection. SQLite's own allocator
counter (``sqlite3_memory_used``, read through ctypes from the library the ``sqlite3`` module
uses) shows what that cache holds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import delete

from inferlb.store import db
from inferlb.store.db import make_engine, upgrade
from inferlb.store.schema import ATTEMPTS


def _memory_used() -> Callable[[], int]:
    import _sqlite3

    for name in (_sqlite3.__file__, ctypes.util.find_library("sqlite3")):
        try:
            fn = ctypes.CDLL(name).sqlite3_memory_used
        except (OSError, AttributeError, TypeError):
            continue
        fn.restype = ctypes.c_int64
        return lambda: int(fn())
    pytest.skip("sqlite3_memory_used is not reachable through ctypes here")


def _grow(tmp_path: Path, sizes: range) -> int:
    """SQLite heap growth (bytes) after one ``DELETE … IN`` of each size (as the writer's upsert
    runs for a batch of that many records) on one pooled connection."""
    used = _memory_used()
    tmp_path.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:                  # connect, pragmas, schema loaded
            conn.execute(delete(ATTEMPTS).where(ATTEMPTS.c.request_id.in_(["r0"])))
        before = used()
        for n in sizes:
            with engine.begin() as conn:
                conn.execute(delete(ATTEMPTS).where(ATTEMPTS.c.request_id.in_([f"r{i}" for i in range(n)])))
        return used() - before
    finally:
        engine.dispose()


def test_distinct_batch_sizes_do_not_pile_up_prepared_statements(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    sizes = range(100, 260)                           # 160 distinct SQL texts (batches up to 256 records)
    grown = _grow(tmp_path / "bounded", sizes)
    # The same run with sqlite3's default of 128 slots keeps 128 of them.
    monkeypatch.setattr(db, "SQLITE_CACHED_STATEMENTS", 128)
    unbounded = _grow(tmp_path / "default", sizes)
    assert grown < 2 * 2**20, f"SQLite heap grew {grown / 2**20:.1f} MiB"
    assert unbounded > 3 * grown, (grown, unbounded)
