"""Cluster settings: several gateway replicas sharing one Redis (and one database).

Contract: :class:`ClusterSettings` comes from ``INFERLB_CLUSTER_*`` environment variables (values
that differ per deployment, never in the fleet file). ``mode`` ``auto`` (the default) turns the
cluster on exactly when ``INFERLB_REDIS_URL`` is set (and ``INFERLB_LIMITS`` is not ``memory``):
one replica without Redis runs the single-process code path unchanged. Nothing here imports the
rest of the engine.
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ClusterSettings", "default_replica_id"]


def default_replica_id() -> str:
    """``host-pid-random``: unique per process, readable in ``/admin/fleet`` and logs."""
    host = socket.gethostname().split(".")[0][:32] or "replica"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


class ClusterSettings(BaseSettings):
    """``INFERLB_CLUSTER_MODE`` (auto/on/off), ``INFERLB_CLUSTER_LEASE_S`` (how long a replica's
    slot shares and heartbeat live in Redis without renewal: a SIGKILLed replica's slots come back
    after at most this), ``INFERLB_CLUSTER_RENEW_S`` (renewal period; default lease / 3),
    ``INFERLB_CLUSTER_LEADER_LEASE_S`` (the database lease of the elected replica),
    ``INFERLB_CLUSTER_IDLE_LEASE_S`` (unset by default: the lease an *idle* replica renews with,
    every third of it; only for replicas whose supervisor gives a dead one's shares and role back
    at once — ``serve --workers`` sets it for its workers on the local coordinator, see
    inferlb/server/workers.py),
    ``INFERLB_CLUSTER_REPLICA_ID`` (default ``host-pid-random``)."""

    model_config = SettingsConfigDict(env_prefix="INFERLB_CLUSTER_", extra="ignore")

    mode: Literal["auto", "on", "off"] = "auto"
    lease_s: float = Field(5.0, ge=0.2, le=300)
    renew_s: float | None = Field(None, gt=0)
    leader_lease_s: float = Field(10.0, ge=0.5, le=600)
    idle_lease_s: float | None = Field(None, ge=0.2, le=600)
    replica_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,100}$")
    # Seconds between two syncs that a shortage (a queue forming, a key at its share) may trigger.
    min_gap_s: float = Field(0.005, ge=0)

    def renew_period(self) -> float:
        return self.renew_s if self.renew_s is not None else self.lease_s / 3.0

    def idle_lease(self) -> float | None:
        """The lease an idle replica sends (never shorter than the normal one), or None when off."""
        return None if self.idle_lease_s is None else max(self.idle_lease_s, self.lease_s)
