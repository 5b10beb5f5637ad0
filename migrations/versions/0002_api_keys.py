"""tenant API keys; queue wait time on requests

Revision ID: 0002
Revises: 0001
Create Date: 2026-01-15 00:00:00

``api_keys`` stores only the SHA-256 digest of each key (``key_hash``, unique) and a short hint;
see inferlb/admission/keys.py. ``requests.queue_wait_ms`` is the time a request spent in
the gateway's admission queue (null when it never queued). Frozen like 0001: the schema is
spelled out here, not imported from the models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("hint", sa.String(), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=True),
        sa.Column("models", _json(), nullable=True),
        sa.Column("priority_ceiling", sa.String(), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.BigInteger(), nullable=True),
        sa.Column("max_parallel", sa.Integer(), nullable=True),
        sa.Column("budget", sa.Double(), nullable=True),
        sa.Column("spent", sa.Double(), nullable=False, server_default=sa.text("0")),
        sa.Column("created_at_us", sa.BigInteger(), nullable=False),
        sa.Column("expires_at_us", sa.BigInteger(), nullable=True),
        sa.Column("revoked_at_us", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_tenant", "api_keys", ["tenant"])
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("queue_wait_ms", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("queue_wait_ms")
    op.drop_index("ix_api_keys_tenant", table_name="api_keys")
    op.drop_table("api_keys")
