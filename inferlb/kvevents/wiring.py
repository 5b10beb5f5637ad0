"""How the app starts, follows and stops the KV-event feature (the composition root calls these).

:func:`uses_kv_events` says whether a fleet config asks for it (a model or a node with
``kv_events``); it imports nothing optional, so a gateway without the ``kvevents`` extra that
does not use the feature never needs it. :class:`KVEventsWiring` holds the service and the
subscriptions: :meth:`~KVEventsWiring.start` subscribes to every publishing node;
:meth:`~KVEventsWiring.follow` takes a reloaded config (the service reconfigured at once, the
subscriptions changed by a task the wiring keeps); :meth:`~KVEventsWiring.close` stops them.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from inferlb.config.settings import FleetConfig
from inferlb.types import Clock

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from inferlb.kvevents.service import KVEventsService
    from inferlb.kvevents.subscriber import Subscriptions

__all__ = ["KVEventsWiring", "uses_kv_events"]


def uses_kv_events(cfg: FleetConfig) -> bool:
    return any(m.kv_events is not None for m in cfg.models) or any(n.kv_events is not None for n in cfg.nodes)


class KVEventsWiring:
    def __init__(self, service: KVEventsService, subs: Subscriptions) -> None:
        self.service = service
        self.subs = subs
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def build(cls, cfg: FleetConfig, *, clock: Clock, registry: CollectorRegistry | None = None) -> KVEventsWiring:
        from inferlb.kvevents.metrics import KVEventsCollector
        from inferlb.kvevents.service import KVEventsService
        from inferlb.kvevents.subscriber import Subscriptions

        service = KVEventsService(cfg, clock=clock)
        if registry is not None:
            registry.register(KVEventsCollector(service))
        return cls(service, Subscriptions(service))

    async def start(self) -> None:
        await self.subs.reconcile(sorted(self.service.nodes), [])

    def start_soon(self) -> None:
        """:meth:`start` from synchronous code (a reload that turned the feature on)."""
        self._reconcile(sorted(self.service.nodes), [])

    def follow(self, cfg: FleetConfig) -> None:
        start, stop = self.service.configure(cfg)
        self._reconcile(start, stop)

    def _reconcile(self, start: list[str], stop: list[str]) -> None:
        if start or stop:
            task = asyncio.get_running_loop().create_task(self.subs.reconcile(start, stop), name="kv-events-reload")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def settled(self) -> None:
        """Wait for the subscription changes of past reloads."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    async def close(self) -> None:
        await self.settled()
        await self.subs.close()
