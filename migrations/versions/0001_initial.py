"""initial audit store: requests and request_attempts

Revision ID: 0001
Revises:
Create Date: 2026-01-01 00:00:00

Timestamps are BigInteger epoch microseconds (``*_us``); see inferlb/store/schema.py.
This file is frozen: it spells the schema out instead of importing the models, so later model
changes need a new revision and never rewrite history.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

__all__ = ["branch_labels", "depends_on", "down_revision", "downgrade", "revision", "upgrade"]

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "requests",
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("received_at_us", sa.BigInteger(), nullable=False),
        sa.Column("endpoint", sa.String(), nullable=False),
        sa.Column("model_requested", sa.String(), nullable=False),
        sa.Column("tenant", sa.String(), nullable=True),
        sa.Column("model_served", sa.String(), nullable=True),
        sa.Column("model_version", sa.String(), nullable=True),
        sa.Column("node", sa.String(), nullable=True),
        sa.Column("priority", sa.String(), nullable=True),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error_class", sa.String(), nullable=True),
        sa.Column("admitted_at_us", sa.BigInteger(), nullable=True),
        sa.Column("routed_at_us", sa.BigInteger(), nullable=True),
        sa.Column("first_byte_at_us", sa.BigInteger(), nullable=True),
        sa.Column("last_byte_at_us", sa.BigInteger(), nullable=True),
        sa.Column("prompt_tokens_est", sa.BigInteger(), nullable=True),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=True),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=True),
        sa.Column("cost_est", sa.Double(), nullable=True),
        sa.Column("decision", _json(), nullable=True),
        sa.Column("workflow_path", _json(), nullable=False),
        sa.Column("tags", _json(), nullable=False),
        sa.Column("engine", sa.String(), nullable=True),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        sa.Column("e2e_ms", sa.Double(), nullable=True),
        sa.Column("ttft_ms", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("request_id", name="pk_requests"),
    )
    op.create_index("ix_requests_received", "requests", ["received_at_us", "request_id"])
    op.create_index("ix_requests_model_requested", "requests", ["model_requested", "received_at_us"])
    op.create_index("ix_requests_model_served", "requests", ["model_served", "received_at_us"])
    op.create_index("ix_requests_node", "requests", ["node", "received_at_us"])
    op.create_index("ix_requests_status", "requests", ["status", "received_at_us"])
    op.create_index("ix_requests_tenant", "requests", ["tenant", "received_at_us"])

    op.create_table(
        "request_attempts",
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("started_at_us", sa.BigInteger(), nullable=False),
        sa.Column("ended_at_us", sa.BigInteger(), nullable=True),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error_class", sa.String(), nullable=True),
        sa.Column("first_byte_at_us", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["requests.request_id"],
            name="fk_request_attempts_request_id_requests",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("request_id", "number", name="pk_request_attempts"),
    )
    op.create_index("ix_request_attempts_node", "request_attempts", ["node", "started_at_us"])


def downgrade() -> None:
    op.drop_index("ix_request_attempts_node", table_name="request_attempts")
    op.drop_table("request_attempts")
    for name in (
        "ix_requests_tenant",
        "ix_requests_status",
        "ix_requests_node",
        "ix_requests_model_served",
        "ix_requests_model_requested",
        "ix_requests_received",
    ):
        op.drop_index(name, table_name="requests")
    op.drop_table("requests")
