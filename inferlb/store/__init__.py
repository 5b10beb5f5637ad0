"""The database: engines, the one schema, the audit pipeline, node events, overrides, reports.

Engines and migrations (``db``), every table (``schema``), the batched audit writer and its
journal, node events, node overrides and the fleet revision, report queries (SLA, cost ledger).

:class:`StoreHandle` is what ``create_app`` puts on ``app.state.store`` for the API routers: the
engine (made once, in the lifespan), the running writer, and the SLOs the SLA report uses.
Importing this package creates nothing and connects to nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from inferlb.config.settings import SLOConfig
    from inferlb.store.writer import AuditWriter

__all__ = ["StoreHandle"]


@dataclass(frozen=True)
class StoreHandle:
    """The store as the application holds it (``app.state.store``)."""

    engine: Engine
    writer: AuditWriter | None = None
    slos: list[SLOConfig] = field(default_factory=list)
