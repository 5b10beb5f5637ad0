"""leader leases: the elected replica of each once-only background role, with a fencing token

Revision ID: 0009
Revises: 0008
Create Date: 2026-02-10 00:00:00

Frozen like 0001: it spells the table out instead of importing inferlb/store/schema.py.
``expires_at`` / ``acquired_at`` are epoch seconds taken from the database's own clock.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leader_leases",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("holder", sa.String(), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("acquired_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_leader_leases"),
    )


def downgrade() -> None:
    op.drop_table("leader_leases")
