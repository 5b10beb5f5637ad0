"""scaling events: every change (or failed change) the autoscaler made to a pool

Revision ID: 0008
Revises: 0007
Create Date: 2026-03-01 00:00:00

Frozen like 0001: it spells the table out instead of importing inferlb/autoscale/store.py.
``at_us`` is epoch microseconds (BigInteger), as in the audit tables.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scaling_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("at_us", sa.BigInteger(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("gpu", sa.String(), nullable=True),
        sa.Column("from_replicas", sa.Integer(), nullable=True),
        sa.Column("to_replicas", sa.Integer(), nullable=True),
        sa.Column("applied_replicas", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("actuator", sa.String(), nullable=False),
        sa.Column("forecaster", sa.String(), nullable=True),
        sa.Column("forecast_tokens_s", sa.Double(), nullable=True),
        sa.Column("actual_tokens_s", sa.Double(), nullable=True),
        sa.Column("capacity_tokens_s", sa.Double(), nullable=True),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("detail", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_scaling_events"),
    )
    op.create_index("ix_scaling_events_at", "scaling_events", ["at_us"])
    op.create_index("ix_scaling_events_model", "scaling_events", ["model", "at_us"])


def downgrade() -> None:
    op.drop_index("ix_scaling_events_model", table_name="scaling_events")
    op.drop_index("ix_scaling_events_at", table_name="scaling_events")
    op.drop_table("scaling_events")
