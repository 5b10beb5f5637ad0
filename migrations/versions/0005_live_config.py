"""live config: the process / config version of each request, and the node overrides

Revision ID: 0005
Revises: 0004
Create Date: 2026-03-01 00:00:00

``requests.process_version`` is the request process file's content hash and
``requests.config_version`` the effective fleet config's hash (the file merged with the node
overrides) the request started on: a reload swaps both (inferlb/live/manager.py).
``node_overrides`` holds what operators changed on the live fleet (nodes added, patched, drained,
removed; inferlb/store/overrides.py) and ``fleet_revision`` the counter every replica polls.
Frozen like 0001: the tables are spelled out here, not imported from the models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("process_version", sa.String(), nullable=True))
        batch.add_column(sa.Column("config_version", sa.String(), nullable=True))
    op.create_table(
        "node_overrides",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("spec", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.Column("drained", sa.Boolean(), nullable=False),
        sa.Column("removed", sa.Boolean(), nullable=False),
        sa.Column("key_id", sa.String(), nullable=True),
        sa.Column("updated_at_us", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_node_overrides"),
    )
    op.create_table(
        "fleet_revision",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_fleet_revision"),
    )


def downgrade() -> None:
    op.drop_table("fleet_revision")
    op.drop_table("node_overrides")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("config_version")
        batch.drop_column("process_version")
