"""What ``create_app`` builds for observability: one :class:`Observability` per app.

Contract:

* The app's own Prometheus registry (never the process-global one: several apps in one process,
  as in the tests, must not share series), with the process / platform / GC collectors, the
  per-request :class:`~.metrics.RequestMetrics`, and the scrape-time
  :class:`~.metrics.GatewayCollector`.
* :attr:`Observability.metrics` and :attr:`Observability.tracer` observe each ended request's
  record: they are steps of the end-of-request hook (``app.request_end``), after the audit hand-off,
  so a failure there (logged once, counted by the hook) never costs a record.
* :meth:`instrument` swaps the process's executor for a :class:`~.timing.TimedExecutor` (engine
  time per request); :meth:`bind` tells the collector where the live fleet, the writer's backlog,
  the admission queue and readiness are; :meth:`start` / :meth:`close` run the node-state sampler
  and flush the tracer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sized
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, GCCollector, Info, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

from inferlb import __version__
from inferlb.background import Periodic
from inferlb.config.observability import ObservabilityConfig
from inferlb.config.settings import FleetConfig
from inferlb.cost import node_prices
from inferlb.fleet.state import Fleet
from inferlb.observability.history import NodeStateHistory
from inferlb.observability.metrics import GatewayCollector, RequestMetrics, ScrapeSources
from inferlb.observability.timing import TimedExecutor
from inferlb.observability.tracing import RecordTracer, build_tracer
from inferlb.types import Clock
from inferlb.workflow.definition import ProcessDefinition

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["Observability", "queue_depth_of"]

log = logging.getLogger("inferlb.observability")


def queue_depth_of(state: Any) -> int | Mapping[str, int] | None:
    """The admission queue's depth from the app state, whichever way the admission work exposes it.

    On ``state.admission`` (or ``state.admission_controller``): ``queue_depth()`` (a number, or a
    mapping pool -> number), else ``snapshot()["pools"][pool]["queued"]``; else
    ``len(state.admission_queue)``; None (reported as 0) while there is no queue.
    """
    for name in ("admission", "admission_controller"):
        adm = getattr(state, name, None)
        if adm is None:
            continue
        fn = getattr(adm, "queue_depth", None)
        if callable(fn):
            value = fn()
            return value if isinstance(value, int | Mapping) else None
        snap = getattr(adm, "snapshot", None)
        if callable(snap):
            pools = (snap() or {}).get("pools")
            if isinstance(pools, Mapping):
                return {str(k): int(v.get("queued") or 0) for k, v in pools.items() if isinstance(v, Mapping)}
    queue = getattr(state, "admission_queue", None)
    return len(queue) if isinstance(queue, Sized) else None


class Observability:
    """Metrics registry, request hook, tracer and node-state history of one app."""

    def __init__(self, fleet_cfg: FleetConfig, *, clock: Clock, cfg: ObservabilityConfig | None = None,
                 tracer_provider: TracerProvider | None = None) -> None:
        self.cfg = cfg = cfg or fleet_cfg.observability
        self.registry = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=self.registry)
        self.metrics: RequestMetrics | None = None
        if cfg.metrics.enabled:
            self.metrics = RequestMetrics(self.registry, models=[m.name for m in fleet_cfg.models],
                                          nodes=[n.name for n in fleet_cfg.nodes], cfg=cfg.metrics)
        self.tracer: RecordTracer | None = build_tracer(cfg.tracing, tracer_provider)
        self.prices = node_prices(fleet_cfg.nodes, cfg.finops)
        self._fleet: Fleet | None = None
        self.sources = ScrapeSources(fleet=lambda: self._fleet, prices=self.prices)
        self.registry.register(GatewayCollector(self.sources))
        self._build = Info("inferlb_build", "Version and workflow executor of this gateway", registry=self.registry)
        self._build.info({"version": __version__, "engine": "unknown"})
        self.history = NodeStateHistory(lambda: self._fleet, clock, cfg.node_state_history)
        self._sampler: Periodic[None] = Periodic("inferlb-node-state-sampler", self._sample,
                                                 interval_s=cfg.node_state_sample_s, first_s=0.0, logger=log)

    # -- wiring ------------------------------------------------------------------------------------

    def instrument(self, process: ProcessDefinition) -> None:
        """Time the process's executor (engine time per request)."""
        self._build.info({"version": __version__, "engine": process.mode})
        if self.metrics is not None and not isinstance(process.executor, TimedExecutor):
            process.executor = TimedExecutor(process.executor, self.metrics.observe_engine)

    @property
    def fleet(self) -> Fleet | None:
        """The live fleet :meth:`bind` pointed at (None before it)."""
        return self._fleet

    def bind(self, fleet: Fleet, *, backlog: Callable[[], Mapping[str, Any] | None] | None = None,
             queue_depth: Callable[[], int | Mapping[str, int] | None] | None = None,
             ready: Callable[[], bool] | None = None) -> None:
        """Point the scrape-time collector (and the node-state history) at the live objects."""
        self._fleet = fleet
        if backlog is not None:
            self.sources.backlog = backlog
        if queue_depth is not None:
            self.sources.queue_depth = queue_depth
        if ready is not None:
            self.sources.ready = ready

    def follow(self, fleet_cfg: FleetConfig) -> None:
        """A reload or node change: new models and nodes become label values, prices follow
        (the rest of the ``observability:`` section is fixed until a restart, live/manager.py)."""
        if self.metrics is not None:
            self.metrics.model.allow(m.name for m in fleet_cfg.models)
            self.metrics.node.allow(n.name for n in fleet_cfg.nodes)
        prices = node_prices(fleet_cfg.nodes, self.cfg.finops)
        self.prices.clear()
        self.prices.update(prices)

    async def _sample(self) -> None:
        self.history.sample()

    async def start(self) -> None:
        """Sample the node states now, then every ``node_state_sample_s`` (the dashboard's timeline)."""
        if not self._sampler.started:
            self._sampler.start()

    async def close(self) -> None:
        await self._sampler.stop()
        if self.tracer is not None:
            # Flushes the batch processor: network I/O, so off the event loop.
            await asyncio.to_thread(self.tracer.shutdown)

    # -- exposition --------------------------------------------------------------------------------

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The registry in the format the scraper asked for (Prometheus text or OpenMetrics)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
