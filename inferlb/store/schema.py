"""The one schema home: every table of inferlb, on one ``Base.metadata``.

``migrations/env.py`` and the tests import this module and nothing else for the schema, so
``alembic revision --autogenerate`` and ``alembic check`` see every table. The queries over a table
live with its feature (``admission/store.py``, ``rollout/store.py``, ``autoscale/store.py``,
``learned/store.py``) or in ``store/`` (audit rows, node events, overrides, leases); the tables live
here. ORM models: ``requests``, ``request_attempts``, ``api_keys``, ``rollouts``, ``rollout_events``;
Core tables (at the end): ``leader_leases``, ``routing_predictors``, ``scaling_events``,
``node_overrides``, ``fleet_revision``, ``node_events``.

Contract:

* One ``requests`` row per client request, keyed by the gateway-generated ``request_id`` (the
  idempotency key of the writer's upsert). Every :class:`~inferlb.store.records.RequestRecord`
  field has a column; ``decision``, ``tags`` and ``workflow_path`` are JSON (JSONB on PostgreSQL).
* **Timestamps are BigInteger epoch microseconds** (columns end in ``_us``). An integer keeps the µs
  exactly on SQLite and PostgreSQL alike, compares exactly in keyset pagination, and converts back
  to the record's float seconds without drift (``us / 1e6`` is the nearest double, the same value
  ``round(t, 6)`` produced). Use :func:`to_us` / :func:`from_us` for the conversion.
* ``e2e_ms`` and ``ttft_ms`` are stored (not computed) values the writer derives from the µs
  columns, so reports read them without dialect-specific generated-column support.
* ``request_attempts`` rows belong to one request (``ON DELETE CASCADE``); ``(request_id, number)``
  is the primary key.
* Schema changes only through Alembic migrations (``migrations/versions``); ``0001_initial`` creates
  exactly these tables and indexes, and a test compares the two.
* ``api_keys`` (migration ``0002_api_keys``, with ``requests.queue_wait_ms``) holds tenant keys
  as SHA-256 digests; see :mod:`inferlb.admission.keys`.
* Migration ``0005_live_config`` adds ``requests.process_version`` / ``config_version`` and the
  node-override tables of :mod:`inferlb.store.overrides`.
* Migration ``0004_decisions_deadline`` adds ``requests.decisions`` (every routing decision of the
  request, each with the attempt it picked a node for) and ``requests.deadline_at_us``.
* Migration ``0006_rollouts`` adds ``rollouts`` (one canary rollout each; at most one ``running``
  per model, kept by a partial unique index), ``rollout_events`` (every decision of a rollout) and
  ``api_keys.pin_versions`` (the key may pin a model version with ``x-inferlb-model-version``).
* Migration ``0010_routing_predictors`` adds ``routing_predictors``: the learned routing
  predictor's saved state (:mod:`inferlb.learned.store`).
"""

from __future__ import annotations

import math
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeEngine

__all__ = [
    "ATTEMPTS",
    "FLEET_REVISION",
    "LEADER_LEASES",
    "NAMING_CONVENTION",
    "NODE_EVENTS",
    "NODE_OVERRIDES",
    "REQUESTS",
    "ROUTING_PREDICTORS",
    "SCALING_EVENTS",
    "ApiKeyRow",
    "AttemptRow",
    "Base",
    "RequestRow",
    "RolloutEventRow",
    "RolloutRow",
    "from_us",
    "json_type",
    "to_us",
]

# Deterministic constraint names, so later migrations can address them on every dialect.
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def json_type() -> TypeEngine[Any]:
    """JSON on SQLite, JSONB on PostgreSQL (indexable, compact)."""
    return JSON().with_variant(JSONB(), "postgresql")


def to_us(t: float | None) -> int | None:
    """Epoch seconds (float, µs precision) → integer epoch µs; non-finite values become None."""
    if t is None or not math.isfinite(t):
        return None
    return round(t * 1_000_000)


def from_us(us: int | None) -> float | None:
    """Integer epoch µs → epoch seconds float (the exact inverse of :func:`to_us` at µs precision)."""
    return None if us is None else us / 1_000_000


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RequestRow(Base):
    """One client request (see RequestRecord for the meaning of each field)."""

    __tablename__ = "requests"

    request_id: Mapped[str] = mapped_column(String, primary_key=True)
    received_at_us: Mapped[int] = mapped_column(BigInteger)
    endpoint: Mapped[str] = mapped_column(String)
    model_requested: Mapped[str] = mapped_column(String)
    tenant: Mapped[str | None] = mapped_column(String)
    model_served: Mapped[str | None] = mapped_column(String)
    model_version: Mapped[str | None] = mapped_column(String)
    node: Mapped[str | None] = mapped_column(String)
    priority: Mapped[str | None] = mapped_column(String)
    stream: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[str] = mapped_column(String)
    http_status: Mapped[int | None] = mapped_column(Integer)
    error_class: Mapped[str | None] = mapped_column(String)
    admitted_at_us: Mapped[int | None] = mapped_column(BigInteger)
    routed_at_us: Mapped[int | None] = mapped_column(BigInteger)
    first_byte_at_us: Mapped[int | None] = mapped_column(BigInteger)
    last_byte_at_us: Mapped[int | None] = mapped_column(BigInteger)
    prompt_tokens_est: Mapped[int | None] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)
    completion_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cost_est: Mapped[float | None] = mapped_column(Double)
    decision: Mapped[dict[str, Any] | None] = mapped_column(json_type())
    workflow_path: Mapped[list[str]] = mapped_column(json_type())
    tags: Mapped[dict[str, Any]] = mapped_column(json_type())
    engine: Mapped[str | None] = mapped_column(String)
    attempt_count: Mapped[int] = mapped_column(Integer)
    # Derived at write time from the µs columns; what the SLA report and audit list read.
    e2e_ms: Mapped[float | None] = mapped_column(Double)
    ttft_ms: Mapped[float | None] = mapped_column(Double)
    # Time spent in the gateway's admission queue (migration 0002); null when never queued.
    queue_wait_ms: Mapped[float | None] = mapped_column(Double)
    # Migration 0004: every routing decision with its attempt number, and the request's deadline.
    decisions: Mapped[list[dict[str, Any]] | None] = mapped_column(json_type())
    deadline_at_us: Mapped[int | None] = mapped_column(BigInteger)
    # Migration 0005: the request process's content hash and the effective fleet config's hash.
    process_version: Mapped[str | None] = mapped_column(String)
    config_version: Mapped[str | None] = mapped_column(String)

    attempts: Mapped[list[AttemptRow]] = relationship(
        back_populates="request",
        order_by="AttemptRow.number",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )

    __table_args__ = (
        # Keyset pagination: ORDER BY received_at_us DESC, request_id DESC.
        Index("ix_requests_received", "received_at_us", "request_id"),
        # Audit filters, each combined with the time window.
        Index("ix_requests_model_requested", "model_requested", "received_at_us"),
        Index("ix_requests_model_served", "model_served", "received_at_us"),
        Index("ix_requests_node", "node", "received_at_us"),
        Index("ix_requests_status", "status", "received_at_us"),
        Index("ix_requests_tenant", "tenant", "received_at_us"),
    )


class AttemptRow(Base):
    """One try of one request against one node."""

    __tablename__ = "request_attempts"

    request_id: Mapped[str] = mapped_column(
        String, ForeignKey("requests.request_id", ondelete="CASCADE"), primary_key=True
    )
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String)
    model: Mapped[str] = mapped_column(String)
    started_at_us: Mapped[int] = mapped_column(BigInteger)
    ended_at_us: Mapped[int | None] = mapped_column(BigInteger)
    outcome: Mapped[str] = mapped_column(String)
    http_status: Mapped[int | None] = mapped_column(Integer)
    error_class: Mapped[str | None] = mapped_column(String)
    first_byte_at_us: Mapped[int | None] = mapped_column(BigInteger)

    request: Mapped[RequestRow] = relationship(back_populates="attempts")

    __table_args__ = (
        # Per-node attempt analysis (retries landing on a node, error classes per node).
        Index("ix_request_attempts_node", "node", "started_at_us"),
    )


class ApiKeyRow(Base):
    """A tenant API key (migration 0002): only the SHA-256 of the key is stored, never the key.
    Queries live in :mod:`inferlb.admission.store`; times are epoch µs like everywhere here."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String, primary_key=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String)
    tenant: Mapped[str] = mapped_column(String)
    name: Mapped[str | None] = mapped_column(String)
    models: Mapped[list[str] | None] = mapped_column(json_type())
    priority_ceiling: Mapped[str | None] = mapped_column(String)
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(BigInteger)
    max_parallel: Mapped[int | None] = mapped_column(Integer)
    budget: Mapped[float | None] = mapped_column(Double)
    spent: Mapped[float] = mapped_column(Double)
    created_at_us: Mapped[int] = mapped_column(BigInteger)
    expires_at_us: Mapped[int | None] = mapped_column(BigInteger)
    revoked_at_us: Mapped[int | None] = mapped_column(BigInteger)
    # Migration 0006: may pin a model version (x-inferlb-model-version).
    pin_versions: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))

    __table_args__ = (Index("ix_api_keys_tenant", "tenant"),)


class RolloutRow(Base):
    """One canary rollout (migration 0006); see :mod:`inferlb.rollout`."""

    __tablename__ = "rollouts"

    id: Mapped[str] = mapped_column(String, primary_key=True)
    model: Mapped[str] = mapped_column(String)
    from_version: Mapped[str] = mapped_column(String)
    to_version: Mapped[str] = mapped_column(String)
    steps: Mapped[list[float]] = mapped_column(json_type())
    criteria: Mapped[dict[str, Any]] = mapped_column(json_type())
    base_weights: Mapped[dict[str, float]] = mapped_column(json_type())
    state: Mapped[str] = mapped_column(String)          # running | completed | rolled_back | aborted
    step: Mapped[int] = mapped_column(Integer)
    percent: Mapped[float] = mapped_column(Double)
    reason: Mapped[str | None] = mapped_column(String)
    started_at_us: Mapped[int] = mapped_column(BigInteger)
    step_started_at_us: Mapped[int] = mapped_column(BigInteger)
    ended_at_us: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (
        Index("ix_rollouts_started", "started_at_us"),
        # One running rollout per model, whichever gateway replica starts it.
        Index("uq_rollouts_running_model", "model", unique=True,
              sqlite_where=text("state = 'running'"), postgresql_where=text("state = 'running'")),
    )


class RolloutEventRow(Base):
    """One decision or action of a rollout (migration 0006)."""

    __tablename__ = "rollout_events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    rollout_id: Mapped[str] = mapped_column(String, ForeignKey("rollouts.id", ondelete="CASCADE"))
    at_us: Mapped[int] = mapped_column(BigInteger)
    action: Mapped[str] = mapped_column(String)         # start | promote | hold | rollback | complete | abort
    from_percent: Mapped[float] = mapped_column(Double)
    to_percent: Mapped[float] = mapped_column(Double)
    reason: Mapped[str] = mapped_column(String)
    evidence: Mapped[dict[str, Any]] = mapped_column(json_type())

    __table_args__ = (Index("ix_rollout_events_rollout", "rollout_id", "at_us"),)


# Core views of the two tables, for the writer's bulk upserts and the report queries.
REQUESTS: Table = cast(Table, RequestRow.__table__)
ATTEMPTS: Table = cast(Table, AttemptRow.__table__)

# ``leader_leases`` (migration 0009): one row per elected role, the lease of its holder. ``token``
# grows by one every time the role changes hands (or a lapsed lease is taken again), so it is a
# fencing token: a writer acting for the role checks, inside its own transaction, that the row still
# carries its holder and token (inferlb/cluster/election.py). ``expires_at`` and ``acquired_at`` are
# epoch seconds on the database's clock, never a replica's, so clock skew cannot make two holders.
LEADER_LEASES: Table = Table(
    "leader_leases",
    Base.metadata,
    Column("name", String(), primary_key=True),
    Column("holder", String(), nullable=False),
    Column("token", BigInteger(), nullable=False),
    Column("expires_at", Double(), nullable=False),
    Column("acquired_at", Double(), nullable=False),
)


ROUTING_PREDICTORS: Table = Table(
    "routing_predictors",
    Base.metadata,
    Column("name", String(), primary_key=True),
    Column("type", String(), nullable=False),
    Column("version", BigInteger(), nullable=False),
    Column("saved_at_us", BigInteger(), nullable=False),
    Column("state", json_type(), nullable=False),
)


SCALING_EVENTS: Table = Table(
    "scaling_events",
    Base.metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True),
    Column("at_us", BigInteger(), nullable=False),
    Column("round", Integer(), nullable=False),
    Column("model", String(), nullable=False),
    Column("gpu", String(), nullable=True),
    Column("from_replicas", Integer(), nullable=True),
    Column("to_replicas", Integer(), nullable=True),
    Column("applied_replicas", Integer(), nullable=True),
    Column("status", String(), nullable=False),
    Column("actuator", String(), nullable=False),
    Column("forecaster", String(), nullable=True),
    Column("forecast_tokens_s", Double(), nullable=True),
    Column("actual_tokens_s", Double(), nullable=True),
    Column("capacity_tokens_s", Double(), nullable=True),
    Column("reason", String(), nullable=False),
    Column("detail", json_type(), nullable=False),
    Index("ix_scaling_events_at", "at_us"),
    Index("ix_scaling_events_model", "model", "at_us"),
)


NODE_OVERRIDES: Table = Table(
    "node_overrides",
    Base.metadata,
    Column("name", String(), primary_key=True),
    Column("source", String(), nullable=False),
    Column("spec", json_type(), nullable=False),
    Column("drained", Boolean(), nullable=False),
    Column("removed", Boolean(), nullable=False),
    Column("key_id", String(), nullable=True),
    Column("updated_at_us", BigInteger(), nullable=False),
)


FLEET_REVISION: Table = Table(
    "fleet_revision",
    Base.metadata,
    Column("id", Integer(), primary_key=True, autoincrement=False),
    Column("revision", BigInteger(), nullable=False),
)


NODE_EVENTS: Table = Table(
    "node_events",
    Base.metadata,
    # BIGINT on PostgreSQL; SQLite autoincrements only an INTEGER PRIMARY KEY (its rowid).
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True),
    Column("at_us", BigInteger(), nullable=False),
    Column("node", String(), nullable=False),
    Column("from_state", String(), nullable=True),
    Column("to_state", String(), nullable=False),
    Column("reason", String(), nullable=False),
    Column("evidence", json_type(), nullable=False),
    Index("ix_node_events_node", "node", "at_us"),
    Index("ix_node_events_at", "at_us"),
)
