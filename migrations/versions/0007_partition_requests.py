"""partition requests and request_attempts by day on PostgreSQL

Revision ID: 0007
Revises: 0005
Create Date: 2026-03-01 00:00:00

PostgreSQL only; SQLite is left exactly as it was (upgrade and downgrade do nothing there).

``requests`` becomes a table partitioned by range of ``received_at_us`` and ``request_attempts``
one partitioned by range of ``started_at_us``: a partition per UTC day (``<table>_pYYYYMMDD``)
plus a default partition, so months of audit are pruned by dropping whole days
(inferlb/store/retention.py) and a report over a window reads only that window's days.

What PostgreSQL requires of a partitioned table, and what changes with it:

* a primary key must contain the partition key: ``pk_requests`` becomes
  ``(request_id, received_at_us)`` and ``pk_request_attempts`` ``(request_id, number, started_at_us)``.
  The audit writer's upsert targets ``(request_id, received_at_us)`` on PostgreSQL; a request's
  ``received_at`` never changes between its submissions (the journal's start entry carries the same
  value), so the upsert stays idempotent.
* a foreign key must reference a unique key holding the partition key, which ``request_attempts``
  does not carry: the foreign key ``fk_request_attempts_request_id_requests`` is dropped on
  PostgreSQL. The writer replaces a request's attempts in the same transaction as the request, and
  retention removes a request's attempts with it (retention.py), so nothing relied on the cascade.

The tables are converted by copy (``LIKE`` the old table, so columns added by earlier migrations
come along; its secondary indexes are recreated from the catalog on the partitioned parent), in
the migration's one transaction: plan a maintenance window for a large existing table. Day
partitions are created for every day holding rows, through today + 7 days; the application
creates the days after that (store/partitions.py). Frozen like 0001: this file does not
import the application's partition code.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta

from alembic import op
from sqlalchemy import text
from sqlalchemy.engine import Connection

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision: str = "0007"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DAY_US = 86_400_000_000
_AHEAD_DAYS = 7
_FK = "fk_request_attempts_request_id_requests"
# table → (partition key, primary key columns before the partition key was added)
_TABLES = {
    "requests": ("received_at_us", ("request_id",)),
    "request_attempts": ("started_at_us", ("request_id", "number")),
}


def _secondary_indexes(conn: Connection, table: str) -> list[tuple[str, str]]:
    """(name, CREATE INDEX statement) of the indexes of ``table`` that back no constraint."""
    rows = conn.execute(text(
        "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "WHERE x.indrelid = to_regclass(:t) AND NOT EXISTS "
        "(SELECT 1 FROM pg_constraint c WHERE c.conindid = i.oid) ORDER BY i.relname"), {"t": table}).all()
    # A partitioned parent's index reads "ON ONLY <table>"; recreated on a plain table it must not.
    return [(name, ddl.replace(" ON ONLY ", " ON ")) for name, ddl in rows]


def _days(conn: Connection, table: str, key: str) -> list[date]:
    lo, hi = conn.execute(text(f'SELECT min("{key}"), max("{key}") FROM "{table}"')).one()
    today = datetime.now(UTC).date()
    first = today if lo is None else min(today, datetime.fromtimestamp(lo // _DAY_US * 86_400, UTC).date())
    last = today if hi is None else max(today, datetime.fromtimestamp(hi // _DAY_US * 86_400, UTC).date())
    last += timedelta(days=_AHEAD_DAYS)
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def _partition(conn: Connection, table: str) -> None:
    key, pk = _TABLES[table]
    old = f"{table}_0007_old"
    indexes = _secondary_indexes(conn, table)
    for name, _ in indexes:
        conn.execute(text(f'DROP INDEX "{name}"'))
    days = _days(conn, table, key)
    conn.execute(text(f'ALTER TABLE "{table}" RENAME TO "{old}"'))
    conn.execute(text(f'ALTER TABLE "{old}" RENAME CONSTRAINT "pk_{table}" TO "pk_{old}"'))
    conn.execute(text(f'CREATE TABLE "{table}" (LIKE "{old}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS) '
                      f'PARTITION BY RANGE ("{key}")'))
    cols = ", ".join(f'"{c}"' for c in (*pk, key))
    conn.execute(text(f'ALTER TABLE "{table}" ADD CONSTRAINT "pk_{table}" PRIMARY KEY ({cols})'))
    for _, ddl in indexes:
        conn.execute(text(ddl))
    conn.execute(text(f'CREATE TABLE "{table}_pdefault" PARTITION OF "{table}" DEFAULT'))
    epoch = date(1970, 1, 1)
    for day in days:
        lo = (day - epoch).days * _DAY_US
        conn.execute(text(f'CREATE TABLE "{table}_p{day:%Y%m%d}" PARTITION OF "{table}" '
                          f"FOR VALUES FROM ({lo}) TO ({lo + _DAY_US})"))
    conn.execute(text(f'INSERT INTO "{table}" SELECT * FROM "{old}"'))
    conn.execute(text(f'DROP TABLE "{old}"'))


def _unpartition(conn: Connection, table: str) -> None:
    key, pk = _TABLES[table]
    part = f"{table}_0007_part"
    indexes = _secondary_indexes(conn, table)
    for name, _ in indexes:
        conn.execute(text(f'DROP INDEX "{name}"'))   # drops each partition's index with it
    conn.execute(text(f'ALTER TABLE "{table}" RENAME TO "{part}"'))
    conn.execute(text(f'ALTER TABLE "{part}" RENAME CONSTRAINT "pk_{table}" TO "pk_{part}"'))
    conn.execute(text(f'CREATE TABLE "{table}" (LIKE "{part}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'))
    cols = ", ".join(f'"{c}"' for c in pk)
    conn.execute(text(f'ALTER TABLE "{table}" ADD CONSTRAINT "pk_{table}" PRIMARY KEY ({cols})'))
    conn.execute(text(f'INSERT INTO "{table}" SELECT * FROM "{part}"'))
    conn.execute(text(f'DROP TABLE "{part}" CASCADE'))
    for _, ddl in indexes:
        conn.execute(text(ddl))


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    conn.execute(text(f'ALTER TABLE "request_attempts" DROP CONSTRAINT IF EXISTS "{_FK}"'))
    for table in _TABLES:
        _partition(conn, table)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    for table in _TABLES:
        _unpartition(conn, table)
    # Attempts whose request is gone (a retention round cut between the two) cannot satisfy the key.
    conn.execute(text('DELETE FROM "request_attempts" a WHERE NOT EXISTS '
                      '(SELECT 1 FROM "requests" r WHERE r.request_id = a.request_id)'))
    conn.execute(text(f'ALTER TABLE "request_attempts" ADD CONSTRAINT "{_FK}" FOREIGN KEY ("request_id") '
                      'REFERENCES "requests" ("request_id") ON DELETE CASCADE'))
