"""canary rollouts and their decisions; a key permission to pin a model version

Revision ID: 0006
Revises: 0009 (written against 0004; relinked as main gained 0007, 0008 and 0009, so the chain has one head)
Create Date: 2026-03-01 00:00:00

``rollouts``: one row per canary rollout (model, from / to version, steps, criteria, the weights
before it, state, current step and percentage); a partial unique index keeps at most one
``running`` rollout per model across every gateway replica. ``rollout_events``: every decision
(start, promote, hold, rollback, complete, abort) with its reason and evidence (the counts and
bounds the guard saw). ``api_keys.pin_versions``: the key may pin a version with the
``x-inferlb-model-version`` header. Frozen like 0001: the tables are spelled out here.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision: str = "0006"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("from_version", sa.String(), nullable=False),
        sa.Column("to_version", sa.String(), nullable=False),
        sa.Column("steps", _json(), nullable=False),
        sa.Column("criteria", _json(), nullable=False),
        sa.Column("base_weights", _json(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("percent", sa.Double(), nullable=False),
        sa.Column("reason", sa.String(), nullable=True),
        sa.Column("started_at_us", sa.BigInteger(), nullable=False),
        sa.Column("step_started_at_us", sa.BigInteger(), nullable=False),
        sa.Column("ended_at_us", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_rollouts"),
    )
    op.create_index("ix_rollouts_started", "rollouts", ["started_at_us"])
    op.create_index("uq_rollouts_running_model", "rollouts", ["model"], unique=True,
                    sqlite_where=sa.text("state = 'running'"), postgresql_where=sa.text("state = 'running'"))
    op.create_table(
        "rollout_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("rollout_id", sa.String(), nullable=False),
        sa.Column("at_us", sa.BigInteger(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("from_percent", sa.Double(), nullable=False),
        sa.Column("to_percent", sa.Double(), nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("evidence", _json(), nullable=False),
        sa.ForeignKeyConstraint(["rollout_id"], ["rollouts.id"], name="fk_rollout_events_rollout_id_rollouts",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_rollout_events"),
    )
    op.create_index("ix_rollout_events_rollout", "rollout_events", ["rollout_id", "at_us"])
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("pin_versions", sa.Boolean(), nullable=False, server_default=sa.text("false")))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("pin_versions")
    op.drop_index("ix_rollout_events_rollout", table_name="rollout_events")
    op.drop_table("rollout_events")
    op.drop_index("uq_rollouts_running_model", table_name="rollouts")
    op.drop_index("ix_rollouts_started", table_name="rollouts")
    op.drop_table("rollouts")
