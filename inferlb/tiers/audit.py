"""Tier outcomes read back from the audit trail (no new table: ``tags.tier`` of the request rows).

:func:`tier_rows` returns the newest ``limit`` requests for the given model aliases (by
``model_requested``, its index), put back in time order, each as the mapping
:func:`~inferlb.tiers.learned.examples_from_rows` reads: ``request_id``, ``status``, ``stream``,
``received_at``, ``first_byte_at``, ``last_byte_at`` (epoch s) and ``tags``. The gateway warms the
learned tier models from them at start-up (:func:`warm_from_audit`,
:meth:`~inferlb.tiers.router.TierRouter.warm_start`).
Synchronous (call through ``asyncio.to_thread`` from async code); errors become StoreError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine

from inferlb.store.read import run_query
from inferlb.store.schema import REQUESTS, from_us, to_us
from inferlb.tiers.router import TierRouter

__all__ = ["tier_rows", "warm_from_audit"]


def tier_rows(engine: Engine, aliases: Sequence[str], *, since: float | None = None,
              limit: int = 20_000) -> list[dict[str, Any]]:
    """The requests for ``aliases`` received at or after ``since`` (epoch s), the newest ``limit``, oldest first."""
    if not aliases:
        return []
    t = REQUESTS.c

    def fetch(conn: Connection) -> list[dict[str, Any]]:
        q = select(t.request_id, t.status, t.stream, t.received_at_us, t.first_byte_at_us, t.last_byte_at_us,
                   t.tags).where(t.model_requested.in_(list(aliases)))
        if since is not None:
            q = q.where(t.received_at_us >= to_us(since))
        q = q.order_by(t.received_at_us.desc()).limit(limit)
        rows = [{"request_id": r["request_id"], "status": r["status"], "stream": bool(r["stream"]),
                 "received_at": from_us(r["received_at_us"]), "first_byte_at": from_us(r["first_byte_at_us"]),
                 "last_byte_at": from_us(r["last_byte_at_us"]), "tags": r["tags"] or {}}
                for r in conn.execute(q).mappings()]
        rows.reverse()
        return rows

    return run_query(engine, fetch)


def warm_from_audit(router: TierRouter, cfg: Any, engine: Engine, *, limit: int = 20_000) -> int:
    """Warm the learned tier models of ``cfg`` (a fleet config) from the audit trail: the newest
    ``limit`` requests of its aliases with ``learned.enabled`` (none: nothing is read). The number
    of outcomes used; StoreError when the database cannot be read."""
    aliases = [m.name for m in cfg.models if m.tiers is not None and m.tiers.learned.enabled]
    if not aliases:
        return 0
    return router.warm_start(cfg.models, cfg.slos, tier_rows(engine, aliases, limit=limit))
