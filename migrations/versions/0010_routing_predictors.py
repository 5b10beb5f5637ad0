"""the learned routing predictor's saved state, so it survives a restart

Revision ID: 0010
Revises: 0006
Create Date: 2026-03-10 00:00:00

``routing_predictors``: one row per predictor name (the learned profile's: ``routing:learned``)
with its type, version, when it was saved and its state as JSON (inferlb/learned/store.py,
inferlb/routing/predictor_state.py). Frozen like 0001: the table is spelled out here.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision: str = "0010"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "routing_predictors",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("type", sa.String(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("saved_at_us", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_routing_predictors"),
    )


def downgrade() -> None:
    op.drop_table("routing_predictors")
