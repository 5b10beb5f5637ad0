"""Per-app :class:`Runtime` and per-request :class:`RequestScope`: what service operations act on.

The workflow data holds small JSON control values; everything else about a request (the audit
record being built, the routing decision, nodes tried) lives in its scope, outside the engine.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .admission import AdmissionController
from .fleet import Fleet
from .routing import Decision, Router
from .settings import FleetConfig, Settings
from .store.records import RequestRecord
from .tokens import TokenEstimator
from .types import Clock

__all__ = ["RequestScope", "Runtime", "build_runtime"]


async def _no_begin(record: RequestRecord) -> None:
    """No audit journal (benchmarks, tests of the core): nothing to do at a request's start."""


@dataclass
class Runtime:
    """Shared by all requests of one app (one event loop)."""

    settings: Settings
    fleet_cfg: FleetConfig
    fleet: Fleet
    router: Router
    estimator: TokenEstimator
    clock: Clock
    rng: random.Random
    submit: Callable[[RequestRecord], None]      # the audit writer's non-blocking submit
    admission: AdmissionController               # slots, queue, tenant limits, retry budget
    # The audit writer's begin: journals a request's start; raises AuditUnavailable (503) when the
    # request could not be audited. Awaited once, at the top of Gateway.handle.
    begin: Callable[[RequestRecord], Awaitable[None]] = field(default=_no_begin)


@dataclass
class RequestScope:
    """One request's context. ``deadline_at`` is on the monotonic clock."""

    rt: Runtime
    record: RequestRecord
    received_mono: float
    prompt_text: str | None = None
    deadline_at: float = 0.0
    model: str = ""                              # the model being routed now (changes on fallback)
    models_tried: list[str] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)
    attempts: int = 0
    max_attempts: int = 3
    decision: Decision | None = None
    last_outcome: dict[str, Any] | None = None
    retry_after_s: float | None = None           # smallest Retry-After seen (for a final 429)


def build_runtime(
    settings: Settings,
    fleet_cfg: FleetConfig,
    *,
    clock: Clock,
    submit: Callable[[RequestRecord], None],
    seed: int | None = None,
    begin: Callable[[RequestRecord], Awaitable[None]] | None = None,
) -> Runtime:
    """Wire fleet, router and estimator for one app (or one test)."""
    from .routing import build_router

    r = fleet_cfg.routing
    router = build_router(r.profile, filters=r.filters, scorers=r.scorers, picker=r.picker,
                          params=r.params, seed=r.seed if seed is None else seed)
    estimator = TokenEstimator()
    for m in fleet_cfg.models:
        if m.tokenizer:
            estimator.use_tokenizer(m.name, m.tokenizer)
    fleet = Fleet(fleet_cfg, clock)
    # Every request ends by submitting its audit record: that is where admission frees its slot.
    admission = AdmissionController(fleet_cfg.admission, fleet, clock, max_inflight=settings.max_inflight,
                                    env=settings.admission)
    return Runtime(settings=settings, fleet_cfg=fleet_cfg, fleet=fleet, router=router, estimator=estimator,
                   clock=clock, rng=random.Random(seed), submit=admission.wrap_submit(submit), admission=admission,
                   begin=begin or _no_begin)
