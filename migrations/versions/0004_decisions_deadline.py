"""every routing decision of a request, and its deadline

Revision ID: 0004
Revises: 0003
Create Date: 2026-02-01 00:00:00

``requests.decisions`` is a JSON list with one entry per routing decision, each carrying the
number of the attempt it picked a node for (null when it picked none); ``requests.decision`` keeps
the last one. ``requests.deadline_at_us`` is the epoch-µs instant the request's time ran out.
Frozen like 0001: the columns are spelled out here, not imported from the models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("decisions", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                                   nullable=True))
        batch.add_column(sa.Column("deadline_at_us", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("deadline_at_us")
        batch.drop_column("decisions")
