"""Audit retention: remove requests (and their attempts) received before a cut-off.

Contract:

* :func:`prune` removes every ``requests`` row with ``received_at_us < cutoff`` and every attempt
  of those requests, and nothing else; afterwards reports read the same for any window starting at
  or after the cut-off. The result says what was removed.
* **PostgreSQL, partitioned** (migration 0007): the day partitions wholly before the cut-off are
  dropped (``requests`` first, so a cut round never leaves a request without its attempts, only
  attempts without a request, which no report reads and the next round drops). Rows before the
  cut-off in the day that holds it, or in the default partition, are deleted in batches. An
  attempt lives in the partition of its own ``started_at``; attempts that started after the cut-off
  of requests received before it (a request in flight across the cut) are deleted first, looked up
  among the requests received in the :data:`STRADDLE_US` before the cut-off (longer than any
  request lives: the gateway's ``timeouts.total_s`` defaults to 600 s).
* **SQLite, or PostgreSQL not partitioned**: ``DELETE`` in batches of ``batch_size`` requests,
  oldest first, one short transaction each (the audit writer keeps writing in between); the
  attempts go with them through the foreign key's ``ON DELETE CASCADE``.
* Database errors become :class:`~inferlb.errors.StoreError` (this module's one boundary).
* :func:`parse_age` turns ``30d`` / ``12h`` / ``90m`` / seconds into seconds (``inferlb db prune
  --older-than``), or raises :class:`~inferlb.errors.InvalidRequest`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from inferlb.errors import InvalidRequest, StoreError
from inferlb.store.db import describe_db_error
from inferlb.store.partitions import DAY_US, PARTITIONED, day_partitions, is_partitioned

__all__ = ["BATCH_SIZE", "STRADDLE_US", "PruneResult", "parse_age", "prune"]

BATCH_SIZE = 5_000
STRADDLE_US = DAY_US
_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


@dataclass
class PruneResult:
    """What one :func:`prune` removed."""

    cutoff_us: int
    partitions_dropped: list[str] = field(default_factory=list)
    rows_deleted: int = 0            # requests deleted row by row (batched), not counting dropped partitions
    attempts_deleted: int = 0        # attempts deleted row by row (PostgreSQL: boundary and in-flight ones)

    def describe(self) -> str:
        parts = [f"{len(self.partitions_dropped)} partition(s) dropped", f"{self.rows_deleted} request row(s) deleted"]
        if self.attempts_deleted:
            parts.append(f"{self.attempts_deleted} attempt row(s) deleted")
        return ", ".join(parts)


def parse_age(value: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` or plain seconds → seconds (> 0)."""
    m = _AGE.match(value.strip())
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)] if m else 0.0
    if seconds <= 0:
        raise InvalidRequest(f"'older-than' must be a duration like 30d, 12h or 90m, not {value!r}",
                             param="older_than")
    return seconds


def _delete_batches(engine: Engine, sql: str, params: dict[str, int]) -> int:
    """Run a ``DELETE … LIMIT :n``-shaped statement until it deletes fewer than ``n`` rows."""
    total = 0
    while True:
        with engine.begin() as conn:
            n = conn.execute(text(sql), params).rowcount
        total += max(n, 0)
        if n < params["n"]:
            return total


def _prune_rows(engine: Engine, cutoff_us: int, batch_size: int) -> int:
    # Oldest first through ix_requests_received; on PostgreSQL the key includes received_at_us.
    sql = ("DELETE FROM requests WHERE (request_id, received_at_us) IN (SELECT request_id, received_at_us "
           "FROM requests WHERE received_at_us < :cut ORDER BY received_at_us LIMIT :n)")
    if engine.dialect.name == "sqlite":
        sql = ("DELETE FROM requests WHERE request_id IN (SELECT request_id FROM requests "
               "WHERE received_at_us < :cut ORDER BY received_at_us LIMIT :n)")
    return _delete_batches(engine, sql, {"cut": cutoff_us, "n": batch_size})


def _prune_partitioned(engine: Engine, cutoff_us: int, batch_size: int, result: PruneResult) -> None:
    with engine.begin() as conn:
        # Attempts after the cut of requests received before it: found while their requests exist.
        result.attempts_deleted += conn.execute(text(
            "DELETE FROM request_attempts WHERE started_at_us >= :cut AND started_at_us < :cut + :w "
            "AND request_id IN (SELECT request_id FROM requests "
            "WHERE received_at_us >= :cut - :w AND received_at_us < :cut)"),
            {"cut": cutoff_us, "w": STRADDLE_US}).rowcount
    for table in PARTITIONED:    # requests first (see the module docstring)
        with engine.connect() as conn:
            old = [p for p in day_partitions(conn, table) if p.hi_us <= cutoff_us]
        for p in old:
            with engine.begin() as conn:
                conn.execute(text(f'DROP TABLE "{p.name}"'))
            result.partitions_dropped.append(p.name)
    # What is left before the cut lives in the day holding it or in the default partition.
    result.rows_deleted += _prune_rows(engine, cutoff_us, batch_size)
    result.attempts_deleted += _delete_batches(engine, (
        "DELETE FROM request_attempts WHERE (request_id, number, started_at_us) IN (SELECT request_id, number, "
        "started_at_us FROM request_attempts WHERE started_at_us < :cut LIMIT :n)"),
        {"cut": cutoff_us, "n": batch_size})


def prune(engine: Engine, cutoff_s: float, *, batch_size: int = BATCH_SIZE) -> PruneResult:
    """Remove the requests received before ``cutoff_s`` (epoch seconds) and their attempts."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    result = PruneResult(cutoff_us=round(cutoff_s * 1_000_000))
    try:
        with engine.connect() as conn:
            partitioned = is_partitioned(conn)
        if partitioned:
            _prune_partitioned(engine, result.cutoff_us, batch_size, result)
        else:
            result.rows_deleted = _prune_rows(engine, result.cutoff_us, batch_size)
    except SQLAlchemyError as exc:
        raise StoreError(f"audit pruning failed: {describe_db_error(exc)}") from exc
    return result

