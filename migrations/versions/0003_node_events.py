"""node events: every node state change the health monitor or the request path made

Revision ID: 0003
Revises: 0002
Create Date: 2026-01-02 00:00:00

Frozen like 0001: it spells the table out instead of importing inferlb/store/events.py.
``at_us`` is epoch microseconds (BigInteger), as in the audit tables.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("at_us", sa.BigInteger(), nullable=False),
        sa.Column("node", sa.String(), nullable=False),
        sa.Column("from_state", sa.String(), nullable=True),
        sa.Column("to_state", sa.String(), nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("evidence", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_node_events"),
    )
    op.create_index("ix_node_events_node", "node_events", ["node", "at_us"])
    op.create_index("ix_node_events_at", "node_events", ["at_us"])


def downgrade() -> None:
    op.drop_index("ix_node_events_at", table_name="node_events")
    op.drop_index("ix_node_events_node", table_name="node_events")
    op.drop_table("node_events")
