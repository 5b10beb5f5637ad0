"""Daily range partitions of the audit tables on PostgreSQL (migration ``0007_partition_requests``).

Contract:

* On PostgreSQL, ``requests`` is partitioned by range of ``received_at_us`` and ``request_attempts``
  by range of ``started_at_us``: one partition per UTC day, named ``<table>_pYYYYMMDD`` and holding
  ``[day 00:00, next day 00:00)`` in epoch µs, plus a ``<table>_pdefault`` partition that catches
  rows outside every day partition, so an insert never fails for want of a partition.
* :func:`ensure_days` creates the missing day partitions of both tables for a span of days (the app
  creates :data:`AHEAD_DAYS` ahead at start-up and on every maintenance round). Rows of that day
  already in the default partition are moved into the new one in the same transaction. It holds a
  transaction-scoped advisory lock, so replicas running it at once serialise instead of failing on
  "relation already exists".
* :func:`day_partitions` lists the day partitions of a table with their bounds, read from the
  catalog (``pg_inherits``), not guessed from names.
* Every function takes an open :class:`~sqlalchemy.engine.Connection` whose transaction the caller
  owns, and works in the connection's ``current_schema()``. SQLite has no partitions:
  :func:`is_partitioned` answers False there and nothing else here may be called on it.
* :data:`PARTITION_NAME` matches partition names, so Alembic's autogenerate (migrations/env.py) and
  the schema test leave them out of the model comparison.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.engine import Connection

__all__ = [
    "AHEAD_DAYS",
    "DAY_US",
    "PARTITIONED",
    "PARTITION_NAME",
    "Partition",
    "day_bounds",
    "day_of",
    "day_partitions",
    "ensure_days",
    "is_partitioned",
    "partition_name",
]

DAY_US = 86_400_000_000
AHEAD_DAYS = 7
# The partitioned tables and the column each is partitioned by.
PARTITIONED: dict[str, str] = {"requests": "received_at_us", "request_attempts": "started_at_us"}
PARTITION_NAME = re.compile(r"^(requests|request_attempts)_p(\d{8}|default)$")
# Any constant: the advisory-lock key of partition maintenance (pg_advisory_xact_lock takes a bigint).
_LOCK_KEY = 0x1F_E7_B0_07
_EPOCH = date(1970, 1, 1)
_BOUND = re.compile(r"FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)")


@dataclass(frozen=True)
class Partition:
    """One day partition: rows with ``lo_us <= key < hi_us``."""

    table: str
    name: str
    lo_us: int
    hi_us: int


def day_bounds(day: date) -> tuple[int, int]:
    """``[start, end)`` of the UTC ``day`` in epoch µs."""
    lo = (day - _EPOCH).days * DAY_US
    return lo, lo + DAY_US


def day_of(epoch_s: float) -> date:
    """The UTC day holding ``epoch_s``."""
    return datetime.fromtimestamp(epoch_s, UTC).date()


def partition_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def is_partitioned(conn: Connection) -> bool:
    """True when ``requests`` in the current schema is a partitioned table (PostgreSQL after 0007)."""
    if conn.dialect.name != "postgresql":
        return False
    return bool(conn.execute(text(
        "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = 'requests' AND n.nspname = current_schema())")).scalar_one())


def day_partitions(conn: Connection, table: str) -> list[Partition]:
    """The day partitions of ``table`` (not the default one), oldest first."""
    rows = conn.execute(text(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
        "JOIN pg_namespace n ON n.oid = p.relnamespace "
        "WHERE p.relname = :t AND n.nspname = current_schema()"), {"t": table}).all()
    out = []
    for name, bound in rows:
        m = _BOUND.search(bound or "")
        if m:  # the default partition's bound is "DEFAULT"
            out.append(Partition(table, name, int(m.group(1)), int(m.group(2))))
    return sorted(out, key=lambda p: p.lo_us)


def _create_day(conn: Connection, table: str, key: str, day: date) -> None:
    """Create one day partition, moving that day's rows out of the default partition first
    (attaching a range the default partition still holds rows of is an error)."""
    name, default = partition_name(table, day), f"{table}_pdefault"
    lo, hi = day_bounds(day)
    conn.execute(text(f'CREATE TABLE "{name}" (LIKE "{table}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'))
    window = f'"{key}" >= {lo} AND "{key}" < {hi}'
    conn.execute(text(f'WITH moved AS (DELETE FROM "{default}" WHERE {window} RETURNING *) '
                      f'INSERT INTO "{name}" SELECT * FROM moved'))
    # The partition's indexes are created (or matched) from the parent's partitioned indexes.
    conn.execute(text(f'ALTER TABLE "{table}" ATTACH PARTITION "{name}" FOR VALUES FROM ({lo}) TO ({hi})'))


def ensure_days(conn: Connection, first: date, last: date) -> list[str]:
    """Create the missing day partitions of both tables for ``first..last`` (inclusive); the names
    created. Serialised across replicas by an advisory lock held until the caller commits."""
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
    created: list[str] = []
    for table, key in PARTITIONED.items():
        have = {p.lo_us for p in day_partitions(conn, table)}
        day = first
        while day <= last:
            if day_bounds(day)[0] not in have:
                _create_day(conn, table, key, day)
                created.append(partition_name(table, day))
            day += timedelta(days=1)
    return created
