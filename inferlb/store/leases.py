"""The ``leader_leases`` table (migration 0009): one row per elected role, the lease of its holder.

Contract: ``token`` grows by one every time the role changes hands (or a lapsed lease is taken
again), so it is a *fencing token*: a writer acting for the role checks, inside its own
transaction, that the row still carries its holder and token (:mod:`inferlb.cluster.election`).
``expires_at`` and ``acquired_at`` are epoch seconds on the **database's** clock, never a
replica's, so clock skew between replicas cannot make two holders.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Double, String, Table

from inferlb.store.schema import Base

__all__ = ["LEADER_LEASES"]

LEADER_LEASES: Table = Table(
    "leader_leases",
    Base.metadata,
    Column("name", String(), primary_key=True),
    Column("holder", String(), nullable=False),
    Column("token", BigInteger(), nullable=False),
    Column("expires_at", Double(), nullable=False),
    Column("acquired_at", Double(), nullable=False),
)
