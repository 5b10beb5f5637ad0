"""Fixtures for the cluster tests: real Redis (a fresh key prefix per test) and the store's
PostgreSQL / SQLite fixtures; plus :func:`replica`, one replica's cluster service over a small
fleet without its background loops (a test drives its syncs)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from inferlb.cluster.admission import SharedAdmission
from inferlb.cluster.service import ClusterService
from inferlb.config.cluster import ClusterSettings
from inferlb.config.settings import FleetConfig, fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.types import ManualClock
from tests.admission.conftest import REDIS_URL, redis_client
from tests.store.conftest import db_url, fresh_url, pg_admin, pg_migrated_url, pg_schema_factory

__all__ = ["REDIS_URL", "db_url", "fresh_url", "make_replica", "pg_admin", "pg_migrated_url", "pg_schema_factory",
           "redis_client", "small_fleet"]


def small_fleet(concurrency: int = 3, nodes: int = 2, **health: Any) -> FleetConfig:
    """Pool ``m`` on ``nodes`` nodes of ``concurrency`` slots each (limit = nodes × concurrency)."""
    return fleet_from_mapping({
        "models": [{"name": "m"}],
        "nodes": [{"name": f"n{i}", "url": f"http://127.0.0.1:{9 + i}", "models": ["m"],
                   "max_concurrency": concurrency} for i in range(nodes)],
        "health": health or {},
    })


@pytest.fixture
async def make_replica(redis_client: tuple[Any, str]) -> AsyncIterator[Callable[..., ClusterService]]:
    """``make_replica(name, fleet=..., lease_s=..., url=..., idle_lease_s=...)``: a connected :class:`ClusterService`
    (no loops started) on the test's Redis prefix; all are stopped afterwards."""
    _, prefix = redis_client
    made: list[ClusterService] = []

    def make(name: str, fleet: FleetConfig | None = None, *, lease_s: float = 3.0, url: str = REDIS_URL,
             config_hash: str = "cfg-1", clock: ManualClock | None = None,
             idle_lease_s: float | None = None) -> ClusterService:
        cfg = fleet or small_fleet()
        clk = clock or ManualClock()
        fl = Fleet(cfg, clk)
        ctl = SharedAdmission(cfg.admission, fl, clk, max_inflight=1000)
        svc = ClusterService(ClusterSettings(replica_id=name, lease_s=lease_s, min_gap_s=0,
                                              idle_lease_s=idle_lease_s), redis_url=url,
                             prefix=prefix, admission=ctl, fleet=fl, clock=clk, config_hash=config_hash)
        svc.connect()
        made.append(svc)
        return svc

    yield make
    for svc in made:
        await svc.stop()
