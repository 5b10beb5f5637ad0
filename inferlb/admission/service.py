"""The admission controller's background work, started and stopped by ``create_app``'s lifespan.

Contract:

* :meth:`AdmissionService.start` loads the key cache from the database before the gateway turns
  ready (with auth on, a database without the ``api_keys`` table is a start-up error naming
  ``inferlb db upgrade``), connects to Redis when ``INFERLB_REDIS_URL`` is set, and starts three
  loops: the queue *tick* (expiry and re-check every ``queue.tick_s``, only while something
  waits), the key *refresh* (adds pending spend to the database, then reloads every key, every
  ``keys_refresh_s``), and the Redis *sync* of the limit buckets (every ``redis_sync_s``, only
  while some RPM/TPM bucket exists: an idle gateway, or one whose keys have no RPM/TPM, does not
  wake 20 times a second for nothing; a new bucket wakes it at once).
* On PostgreSQL the key refresh also wakes at once when a key is created or revoked anywhere:
  a connection of its own ``LISTEN``-s on the store's ``NOTIFY``
  (:data:`~inferlb.admission.store.KEYS_CHANNEL`, :class:`~inferlb.store.revision_watch.PgNotifyWatch`;
  reconnecting 1 s doubling to 30 s while it is down, the periodic reload still running), so a
  revocation on one replica holds on every replica within a round trip. A key the cache does
  not know is looked up in the database before the 401 (:meth:`AdmissionController.find_key`,
  through :attr:`AdmissionController.key_source`, set here), so a key created on another
  replica (or by ``inferlb keys create`` on any database) works at once.
* While the database is away the key cache keeps serving; once its last load is older than
  ``admission.keys_max_stale_s`` it is emptied (:meth:`KeyCache.expire`) until a load succeeds.
* The loops run on the background runner (:class:`~inferlb.background.Periodic`). A loop that
  fails logs and goes on; it never takes the gateway down. :meth:`stop` cancels the loops,
  writes the spend still pending and closes Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from inferlb.admission.buckets import RedisSync
from inferlb.admission.controller import AdmissionController
from inferlb.background import Periodic, stop_all
from inferlb.errors import ConfigError, StoreError
from inferlb.store.revision_watch import PgNotifyWatch, pg_listener_connect

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from inferlb.admission.keys import ApiKey

__all__ = ["AdmissionService"]

log = logging.getLogger("inferlb.admission")


class AdmissionService:
    """Owns the loops around one :class:`AdmissionController`."""

    def __init__(self, controller: AdmissionController, engine: Engine | None) -> None:
        self.ctl = controller
        self.engine = engine
        self.redis: Any = None
        self.sync: RedisSync | None = None
        self._loops: list[Periodic[Any]] = []
        self._queued = asyncio.Event()       # set by the controller when a request is queued
        controller.on_enqueue = self._queued.set
        self._bucketed = asyncio.Event()     # set by the limiter when it makes an RPM/TPM bucket
        self.ticks = 0                       # queue ticks run (the tick loop parks while nothing waits)
        self.keys_loaded_at: float | None = None   # monotonic time of the last successful key load
        self.key_loads = 0                   # successful reloads of the whole key cache
        self.keys_watch: PgNotifyWatch | None = None   # the key-change listener (PostgreSQL only)

    async def start(self) -> None:
        ctl = self.ctl
        if self.engine is not None:
            try:
                await self.refresh_keys()
            except StoreError as exc:
                if ctl.auth_on:
                    raise ConfigError(f"cannot load API keys ({exc}); run `inferlb db upgrade`") from exc
                log.warning("API keys not loaded (%s); authentication is off", exc)
        env = ctl.env
        if env.redis_url and env.limits != "memory" and ctl.policy.enabled:
            self.redis = _redis_client(env.redis_url)
            self.sync = RedisSync(ctl.limiter, self.redis, env.redis_prefix)
            ctl.limiter.on_new = self._bucketed.set
            self._loop("redis-sync", ctl.policy.redis_sync_s, self._sync_once, park=self._park_until_buckets)
        elif env.limits == "redis":
            raise ConfigError("INFERLB_LIMITS=redis needs INFERLB_REDIS_URL")
        self._loop("queue-tick", ctl.policy.queue.tick_s, self._tick_once, park=self._park_until_queued)
        if self.engine is not None:
            ctl.key_source = self._find_key
            wait = None
            if self.engine.url.get_backend_name() == "postgresql":
                from inferlb.admission.store import KEYS_CHANNEL

                self.keys_watch = PgNotifyWatch(pg_listener_connect(self.engine), clock=ctl.clock,
                                                channel=KEYS_CHANNEL, what="api keys")
                await self.keys_watch.start()
                wait = self.keys_watch.wait
            self._loop("keys-refresh", ctl.policy.keys_refresh_s, self.refresh_keys, wait=wait)

    async def stop(self) -> None:
        await stop_all(list(self._loops))
        self._loops.clear()
        self.ctl.key_source = None
        if self.keys_watch is not None:
            await self.keys_watch.close()
            self.keys_watch = None
        if self.engine is not None:
            with contextlib.suppress(StoreError):
                await self._flush_spend()
        if self.sync is not None:
            await self.sync.sync(self.ctl.clock.time())
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.aclose()

    def _loop(self, name: str, every_s: float, fn: Callable[[], Awaitable[Any]],
              park: Callable[[], Awaitable[None]] | None = None,
              wait: Callable[[float], Awaitable[object]] | None = None) -> None:
        """``fn`` every ``every_s`` on the background runner (after ``park``, when given; ``wait``
        instead of a plain sleep between turns, when given: a notification ends it early)."""
        loop: Periodic[Any] = Periodic(
            f"inferlb-admission-{name}", fn, interval_s=every_s, park=park, wait=wait, logger=log)
        self._loops.append(loop)
        loop.start()

    async def _park_until_queued(self) -> None:
        # An idle gateway must not wake every tick_s (50 times a second by default) for nothing.
        if not self.ctl.has_queued():
            self._queued.clear()
            await self._queued.wait()

    async def _park_until_buckets(self) -> None:
        # No bucket: nothing to exchange (measured: the empty 50 ms turns were 4 ms of CPU a second
        # of an idle worker of `serve --workers 2`, docs/benchmarks.md).
        if not self.ctl.limiter.buckets:
            self._bucketed.clear()
            await self._bucketed.wait()

    async def _tick_once(self) -> None:
        self.ticks += 1
        self.ctl.tick()

    async def _sync_once(self) -> None:
        assert self.sync is not None
        await self.sync.sync(self.ctl.clock.time())
        self.ctl.limiter.forget_idle(self.ctl.clock.time())

    async def _flush_spend(self) -> None:
        from inferlb.admission.store import add_spend

        pending = {k: v for k, v in self.ctl.spend_pending.items() if v}
        if not pending or self.engine is None:
            return
        for k in pending:
            self.ctl.spend_pending[k] -= pending[k]
        try:
            await asyncio.to_thread(add_spend, self.engine, pending)
        except StoreError:
            for k, v in pending.items():   # keep it for the next refresh
                self.ctl.spend_pending[k] += v
            raise
        for k, v in pending.items():
            key = self.ctl.keys.by_id.get(k)
            if key is not None:
                self.ctl.keys.with_spent(k, key.spent + v)

    async def _find_key(self, digest: str) -> ApiKey | None:
        """The controller's :attr:`~AdmissionController.key_source`: one key by digest, in a thread."""
        from inferlb.admission.store import find_key

        assert self.engine is not None
        return await asyncio.to_thread(find_key, self.engine, digest)

    async def refresh_keys(self) -> None:
        """Write pending spend, then reload the key cache (revocations and new keys included)."""
        from inferlb.admission.store import load_keys

        if self.engine is None:
            return
        try:
            await self._flush_spend()
            keys = await asyncio.to_thread(load_keys, self.engine)
        except StoreError as exc:
            self._maybe_expire(exc)
            raise
        self.ctl.keys.replace(keys)
        self.key_loads += 1
        self.keys_loaded_at = self.ctl.clock.monotonic()
        self.ctl.sweep()

    def _maybe_expire(self, exc: StoreError) -> None:
        """The database is away: keep serving from the cache until it is ``keys_max_stale_s`` old."""
        ctl = self.ctl
        if self.keys_loaded_at is None or ctl.keys.expired is not None:
            return
        age = ctl.clock.monotonic() - self.keys_loaded_at
        if age > ctl.policy.keys_max_stale_s:
            log.error("API keys not reloaded for %.0fs (%s): the key cache is dropped until the database answers",
                      age, exc)
            ctl.keys.expire(f"key store unreachable for {age:.0f}s")


def _redis_client(url: str) -> Any:
    import redis.asyncio as aioredis

    # Short timeouts: a slow Redis must never stall the sync loop for long (decisions stay local).
    return aioredis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
