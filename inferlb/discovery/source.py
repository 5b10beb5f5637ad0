"""One Kubernetes discovery source on the event loop: list, then watch, in its own worker thread;
discovered nodes handed to the live config (live/manager.py) like an operator's change.

The loop (:meth:`KubernetesDiscovery.step`, one turn; :meth:`run` repeats it):

* no list yet, or the last watch answered ``410 Gone``: **list** (the whole set; slices it lacks
  are gone), then reconcile;
* else **watch** from the last ``resourceVersion``; each event updates the cache and wakes the
  reconciler; a watch the server ends (``timeoutSeconds``) resumes from the last version;
* an API error (refused connection, timeout, 403, 5xx…) changes **nothing**: the last known set
  stays, the error is logged once per distinct message and counted
  (``inferlb_discovery_errors_total``), and the next try waits ``backoff_s`` doubled per failure
  up to ``max_backoff_s``; after an error the watch resumes from the last version (a 410 then
  relists).

Reconcile (:meth:`reconcile`, serialised, on the loop): the pure :func:`~.slices.plan` over what
the cache shows and which nodes the fleet reports ``drained``; the new rows go to ``apply``
(LiveConfig.set_discovered: merged with the file and the operators' overrides, applied through
live/fleet_admin.py's ``apply_fleet``: a new node is ``loading`` until probed, then slow start;
a drained one finishes its requests, then ``drained``; a removed one is gone). Nothing is
reconciled before the first successful list, so a gateway that starts while the API server is
away routes to the file's nodes only. While a discovered node is draining, reconcile also runs
every ``settle_s`` to remove it once drained.

Every gateway replica runs its own source (each must route to the pods); node events are written
by each, like its health events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from inferlb.background import Background, stop_all
from inferlb.config.discovery import KubernetesDiscoveryConfig
from inferlb.discovery.kubernetes import EndpointSliceClient, WatchGone, api_error
from inferlb.discovery.slices import Change, SliceCache, observed, plan
from inferlb.store.overrides import NodeOverride
from inferlb.types import Clock

__all__ = ["Apply", "KubernetesDiscovery"]

log = logging.getLogger("inferlb.discovery")

T = TypeVar("T")

# (source label, rows, evidence for the node events) -> one line per fleet change; raises to refuse.
Apply = Callable[[str, list[NodeOverride], Mapping[str, Any]], Awaitable[list[str]]]


class KubernetesDiscovery:
    def __init__(self, cfg: KubernetesDiscoveryConfig, *, apply: Apply, node_states: Callable[[], Mapping[str, str]],
                 clock: Clock, client: EndpointSliceClient | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.cfg = cfg
        self.label = cfg.label()
        self.apply = apply
        self.node_states = node_states
        self.clock = clock
        self.client = client if client is not None else EndpointSliceClient(cfg)
        self.sleep = sleep
        self.cache = SliceCache()
        self.rows: dict[str, NodeOverride] = {}
        self.synced = False          # a list succeeded (and nothing since said 410)
        self.lists = 0
        self.relists = 0             # lists after a 410 Gone
        self.events = 0
        self.errors = 0
        self.last_error: str | None = None
        self.backoff_s = cfg.backoff_s
        self._need_list = True
        self._gone = False           # the last watch answered 410: the next list is a relist
        self._lock = asyncio.Lock()
        self._dirty = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inferlb-discovery")
        self._loops = [Background(f"inferlb-discovery {self.label}", self.run, logger=log),
                       Background(f"inferlb-discovery-reconcile {self.label}", self._reconciler, logger=log)]
        self._closed = False

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        """The list/watch loop and the reconciler, on the background runner."""
        for loop in self._loops:
            loop.start()

    async def close(self) -> None:
        self._closed = True
        self.client.stop()           # a watch in the thread ends now (its socket is shut down)
        await stop_all(self._loops)
        await asyncio.get_running_loop().run_in_executor(None, self.client.close)
        self._executor.shutdown(wait=False)

    async def _thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ------------------------------------------------------------------ list / watch

    async def run(self) -> None:
        while not self._closed:
            wait = await self.step()
            if wait > 0:
                await self.sleep(wait)

    async def step(self) -> float:
        """One list or one watch (module docstring); returns how long to wait before the next."""
        try:
            if self._need_list:
                items, rv = await self._thread(self.client.list)
                self.cache.replace(items, rv)
                self.lists += 1
                self.relists += 1 if self._gone else 0
                self.synced, self._need_list, self._gone = True, False, False
                self._ok()
                await self.reconcile()
                return 0.0
            loop = asyncio.get_running_loop()

            def post(kind: str, obj: dict[str, Any]) -> None:   # in the worker thread
                loop.call_soon_threadsafe(self._event, kind, obj)

            rv = await self._thread(self.client.watch, self.cache.resource_version, post)
            if rv:
                self.cache.resource_version = rv
            self._ok()
            await self.reconcile()
            return 0.0
        except WatchGone as exc:
            log.info("discovery %s: watch expired (%s): listing again", self.label, exc)
            self._need_list = self._gone = True
            return 0.0
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # the API is away or refuses: keep the last known set
            self.errors += 1
            error = api_error(exc)
            if error != self.last_error:
                log.warning("discovery %s: %s (keeping %d discovered node(s); retrying)", self.label, error,
                            len(self.rows))
            self.last_error = error
            wait = self.backoff_s
            self.backoff_s = min(self.backoff_s * 2, self.cfg.max_backoff_s)
            return wait

    def _ok(self) -> None:
        if self.last_error is not None:
            log.info("discovery %s: the API answers again", self.label)
        self.last_error = None
        self.backoff_s = self.cfg.backoff_s

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        self.events += 1
        if self.cache.apply(kind, obj):
            self._dirty.set()

    # ------------------------------------------------------------------ reconcile

    async def _reconciler(self) -> None:
        while not self._closed:
            draining = any(r.drained for r in self.rows.values())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.cfg.settle_s if draining else None)
            self._dirty.clear()
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # the loop must outlive one bad turn
                log.error("discovery %s: reconcile failed: %s", self.label, exc)

    def drained_now(self) -> set[str]:
        """Discovered nodes that may go: ``drained`` in the fleet, or not in it at all."""
        states = self.node_states()
        return {n for n in self.rows if states.get(n, "drained") == "drained"}

    async def reconcile(self) -> list[Change]:
        """Plan against the cache and apply the new rows; nothing before the first list. An
        ``apply`` that refuses (a ConfigError) leaves the rows in force as they were."""
        async with self._lock:
            if not self.synced:
                return []
            rows, changes = plan(self.rows, observed(self.cfg, self.cache), self.drained_now(),
                                 at=round(self.clock.time(), 6))
            if not changes and rows == self.rows:
                return []
            evidence = {"trigger": "discovery", "source": self.label,
                        "discovery": [f"{c.action} {c.node}" for c in changes]}
            try:
                await self.apply(self.label, list(rows.values()), evidence)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:500]
                if error != self.last_error:
                    log.error("discovery %s: nodes not applied: %s", self.label, error)
                self.last_error = error
                self.errors += 1
                return []
            self.rows = rows
            if changes:
                log.info("discovery %s: %s", self.label, ", ".join(f"{c.action} {c.node}" for c in changes))
            return changes

    def status(self) -> dict[str, Any]:
        return {"source": self.label, "synced": self.synced, "resource_version": self.cache.resource_version,
                "nodes": {n: ("draining" if r.drained else "serving") for n, r in self.rows.items()},
                "lists": self.lists, "relists": self.relists, "events": self.events, "errors": self.errors,
                "last_error": self.last_error}
