"""``inferlb db``: database maintenance (``upgrade``: Alembic migrations; ``prune``: audit retention).

::

    inferlb db upgrade                          apply the migrations to INFERLB_DATABASE_URL
    inferlb db prune --older-than 30d           remove requests received more than 30 days ago
    inferlb db prune                            the same with INFERLB_AUDIT_RETENTION_DAYS

``prune`` drops whole day partitions on PostgreSQL and deletes in batches on SQLite
(inferlb/store/retention.py). The gateway runs the same pruning on its own timer, on one
replica, when ``INFERLB_AUDIT_RETENTION_DAYS`` is set; the command is for a cron job or by hand.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from inferlb.cli.shared import settings_from
from inferlb.errors import ConfigError

if TYPE_CHECKING:
    from inferlb.config.settings import Settings

__all__ = ["db_command", "register"]


def register(sub: Any) -> None:
    """Register ``inferlb db`` on the top-level subparsers."""
    db = sub.add_parser("db", help="database maintenance: upgrade (migrations), prune (audit retention)")
    db.add_argument("action", choices=["upgrade", "prune"])
    db.add_argument("--database-url", dest="database_url")
    db.add_argument("--older-than", dest="older_than",
                    help="prune: remove requests received longer ago than this (30d, 12h, 90m); "
                         "default INFERLB_AUDIT_RETENTION_DAYS")
    db.add_argument("--batch-size", dest="batch_size", type=int, default=None,
                    help="prune: rows per DELETE transaction where rows are deleted (default 5000)")
    db.set_defaults(handler=_db)


def _db(args: argparse.Namespace) -> int:
    return db_command(args, settings_from(args))


def db_command(args: argparse.Namespace, settings: Settings, *, now: float | None = None) -> int:
    """Run ``inferlb db <action>``; errors are raised as StoreError / InvalidRequest / ConfigError."""
    from inferlb.cli.audit import db_upgrade
    from inferlb.config.netpolicy import redact_url  # here: building the parser imports no pydantic

    if args.action == "upgrade":
        db_upgrade(settings.database_url)
        # The URL may carry the database password (postgresql://user:pw@…): never print it.
        print(f"database at head: {redact_url(settings.database_url)}")
        return 0
    return _prune(args, settings, time.time() if now is None else now)


def _prune(args: argparse.Namespace, settings: Settings, now: float) -> int:
    from inferlb.store.db import make_engine
    from inferlb.store.retention import BATCH_SIZE, parse_age, prune
    from inferlb.store.tabular import iso_utc

    if args.older_than is not None:
        age_s = parse_age(args.older_than)
    elif settings.audit_retention_days is not None:
        age_s = settings.audit_retention_days * 86_400
    else:
        raise ConfigError("say how old: --older-than 30d, or set INFERLB_AUDIT_RETENTION_DAYS",
                          source="command line", path="--older-than")
    batch = BATCH_SIZE if args.batch_size is None else args.batch_size
    if batch < 1:
        raise ConfigError("must be at least 1", source="command line", path="--batch-size")
    engine = make_engine(settings.database_url, connect_timeout_s=settings.database_connect_timeout_s,
                         statement_timeout_ms=settings.database_statement_timeout_ms,
                         busy_timeout_ms=settings.database_busy_timeout_ms)
    try:
        result = prune(engine, now - age_s, batch_size=batch)
    finally:
        engine.dispose()
    print(f"pruned requests received before {iso_utc(result.cutoff_us / 1e6)}: {result.describe()}")
    return 0
