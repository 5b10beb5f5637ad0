"""The cluster service: this replica's link to the others through Redis (and the database).

Started by ``create_app``'s lifespan only when the cluster is on (:mod:`.config`); one replica
alone never builds it.

Contract:

* **Sync** (:meth:`ClusterService.sync_once`, one :data:`~.lua.SYNC_LUA` round trip): heartbeat,
  every slot share (pools, keys with ``max_parallel``), the retry-budget deltas, the health
  version. It runs before the gateway turns ready, then every ``renew_s`` (lease / 3), and at
  once (at most every ``min_gap_s``) when a request finds this replica's share short, when
  another replica announces it is short (``want`` on the channel), and every ``min_gap_s × 4``
  while this replica's fair target is above its grant (others still give back). While it is in
  flight this replica takes no more of a resource than it reported in use (the answer may lower
  its grant to that: :mod:`.shares`); after it the admission queue is pumped with the new grants.
* **Health**: local ejections and cool-downs go to Redis through :data:`~.lua.HEALTH_LUA`
  (published on the channel); a listener applies what other replicas publish; a full read runs
  when the version moved (missed messages) and after every reconnection. Propagation is one
  publish (milliseconds); the fallback is the next sync (``renew_s``).
* **Redis away**: a failed sync keeps the grants of the last successful one while their lease
  lasts (measured from when that sync was sent: Redis counts a replica's grants until its lease
  lapses, so no other replica can be given them meanwhile), so one slow round trip on a loaded
  machine does not put this replica's fallback share on top of what the others hold. Once the
  lease has lapsed with no successful sync the replica turns *degraded*: every limit falls back
  to its share (``limit / replicas last seen``: slots, ``max_parallel``, RPM/TPM; the retry
  budget's floor too). The outage is logged once at the first failure, ``inferlb_cluster_redis_up`` is 0 and
  ``inferlb_cluster_redis_errors_total`` counts the failures. Requests are never failed for it.
  The next successful sync rejoins (logged), the shared levels and grants apply again.
* **Config**: the replica's config hash (fleet file + processes) is in its heartbeat; replicas
  whose hashes differ are reported (warning log on every change of the set, the
  ``inferlb_cluster_config_conflict`` gauge, ``/admin/fleet`` → ``cluster.config``), never mixed
  silently: each keeps serving with its own file.
* **Election**: with a database, :class:`~.election.Election` runs here too; :meth:`leader` is the
  predicate background jobs take.
* :meth:`stop` hands this replica's shares back at once (HDEL), so a clean shutdown does not wait
  for the lease; a SIGKILL waits for it, unless a supervisor sees the process die and removes them
  (:func:`~.leave.forget_replica`, ``serve --workers``), publishing ``left``: every replica then
  syncs and tries for the role at once.
* **Idle lease** (``INFERLB_CLUSTER_IDLE_LEASE_S``, off unless set; ``serve --workers`` sets it on
  its local coordinator, where the supervisor removes a dead worker's shares at once): a sync
  that reports nothing in use, no demand, no request since the last one and no retry spent, while
  no share is owed to this replica, sends the idle lease instead and the next renewal comes a
  third of it later. The first request admitted after it puts the loop back on the normal
  renewal (the next sync comes ``renew_s`` after that request; not at once: a sync in flight
  holds back the retry claim, and the first request's fast failure would find none); a shortage
  or a ``want`` from another replica (which gets back what the idle one holds) still syncs at
  once. A replica that hangs while idle keeps its few slots reserved for up to the idle lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from inferlb.background import Background, stop_all
from inferlb.cluster.admission import SharedAdmission
from inferlb.cluster.election import Election, Leadership, LocalLeader
from inferlb.cluster.health import HealthChange, SharedHealth
from inferlb.cluster.lua import HEALTH_LUA, SYNC_LUA
from inferlb.config.cluster import ClusterSettings, default_replica_id
from inferlb.types import Clock

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from inferlb.config.settings import FleetConfig
    from inferlb.fleet.state import Fleet

__all__ = ["ClusterCollector", "ClusterService", "config_hash"]

log = logging.getLogger("inferlb.cluster")

_RB_SLOTS = 10


def config_hash(fleet: FleetConfig, files: Iterable[Path] = ()) -> str:
    """SHA-256 (first 16 hex) of the validated fleet config and the process files' bytes."""
    h = hashlib.sha256(fleet.model_dump_json().encode())
    for p in files:
        with contextlib.suppress(OSError):
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


class ClusterService:
    """See the module docstring."""

    def __init__(self, settings: ClusterSettings, *, redis_url: str, prefix: str, admission: SharedAdmission,
                 fleet: Fleet, clock: Clock, config_hash: str, address: str = "",
                 engine: Engine | None = None, offset_ms: int = 0) -> None:
        self.settings = settings
        self.id = settings.replica_id or default_replica_id()
        self.redis_url = redis_url
        self.prefix = prefix
        self.ctl = admission
        self.shares = admission.shares
        self.fleet = fleet
        self.clock = clock
        self.config_hash = config_hash
        self.address = address
        self.offset_ms = offset_ms       # added to Redis's clock: tests move time with it, 0 otherwise
        self.lease_ms = int(settings.lease_s * 1000)
        self.health = SharedHealth(fleet, self.id)
        self.election: Leadership = LocalLeader()
        self._engine = engine
        self.redis: Any = None
        self._sub_client: Any = None
        self._sync_script: Any = None
        self._health_script: Any = None
        self._wake = asyncio.Event()
        self._sync_now = False    # set by wake(); the event alone only makes the loop re-read its timeout
        self._changes: asyncio.Queue[HealthChange] = asyncio.Queue(maxsize=10_000)
        self._loops = [Background("inferlb-cluster-sync", self._sync_loop, logger=log),
                       Background("inferlb-cluster-listen", self._listen_loop, logger=log),
                       Background("inferlb-cluster-health", self._send_loop, logger=log)]
        self._stopping = False
        self._last_sync = 0.0
        self._granted_at: float | None = None   # when the last successful sync was sent (its lease's start)
        self._last_want = 0.0
        self._health_version: str | None = None
        self._resources: list[str] = []      # the slot resources this replica registered
        # what operators see
        self.redis_up = False
        self.syncs = 0
        self.errors = 0
        self.outages = 0
        self.down_since: float | None = None
        self.last_error: str | None = None
        self.replicas: dict[str, dict[str, str]] = {}
        self.conflict: dict[str, list[str]] = {}
        self.sync_ms: float | None = None
        self.health_received = 0
        self.wants_sent = 0
        self.wants_received = 0
        self.left_received = 0
        # other features' messages on the channel (learned/share.py): type -> handler, on the loop
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        # other features' parts of :meth:`status` (``learned``, ``length``, ``reward``: learned/share.py)
        self.parts: dict[str, Callable[[], dict[str, Any]]] = {}

    # ------------------------------------------------------------------ keys

    def _k(self, *parts: str) -> str:
        return self.prefix + "cluster:" + ":".join(parts)

    def key(self, *parts: str) -> str:
        """A key of the cluster's (``<prefix>cluster:<parts>``), for other features' shared state."""
        return self._k(*parts)

    @property
    def channel(self) -> str:
        return self._k("events")

    # ------------------------------------------------------------------ lifecycle

    def connect(self) -> None:
        """Make the Redis clients and register the scripts (no I/O yet); :meth:`start` calls it."""
        import redis.asyncio as aioredis

        if self.redis is not None:
            return
        self.redis = aioredis.from_url(self.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5)
        # The listener blocks on its socket: no read timeout there (get_message has its own).
        # TCP keep-alive only over TCP: redis-py refuses the option on a unix:// URL (the local
        # coordinator of `serve --workers`, server/workers.py), where a dead peer is seen at once.
        keepalive = {} if self.redis_url.startswith("unix:") else {"socket_keepalive": True}
        self._sub_client = aioredis.from_url(self.redis_url, socket_connect_timeout=0.5, **keepalive)
        self._sync_script = self.redis.register_script(SYNC_LUA)
        self._health_script = self.redis.register_script(HEALTH_LUA)
        self.health.attach(self._queue_change)

    async def start(self) -> None:
        self.connect()
        self.shares.on_short = self.wake
        self.shares.on_busy = self.rearm
        if not await self.sync_once():
            log.warning("Redis unreachable at start-up (%s): replica %s serves with its share of every limit "
                        "until it can join", self.last_error, self.id)
        if self._engine is not None:
            election = Election(self._engine, self.id, lease_s=self.settings.leader_lease_s, clock=self.clock)
            self.election = election
            await election.start()
        for loop in self._loops:
            loop.start()

    @property
    def started(self) -> bool:
        """True from :meth:`start` (its loops running) to :meth:`stop`."""
        return all(loop.started for loop in self._loops)

    async def stop(self) -> None:
        self._stopping = True
        # The runner cancels again until they are gone (20 tries, 0.1 s apart): a cancellation that
        # lands while a Redis call's own timeout fires can come back as a Redis TimeoutError, which
        # the loops survive.
        await stop_all(self._loops)
        self.health.detach()
        self.shares.on_short = None
        self.shares.on_busy = None
        if isinstance(self.election, Election):
            with contextlib.suppress(Exception):
                await self.election.close()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.hdel(self._k("replicas"), self.id)
                    for r in self._resources:
                        pipe.hdel(self._k("slots", r), self.id)
                    await pipe.execute()
            for c in (self.redis, self._sub_client):
                with contextlib.suppress(Exception):
                    await c.aclose()

    def leader(self) -> bool:
        return self.election.leader()

    def subscribe(self, kind: str, handler: Callable[[dict[str, Any]], None]) -> None:
        """Hand the channel's messages of type ``kind`` that other replicas publish (``{"t": kind,
        "from": <replica id>, ...}``) to ``handler``, on the event loop; it must not block. Messages
        missed while the listener reconnects are not replayed: a subscriber reads its state again
        itself (learned/share.py falls back on a bounded period)."""
        self._handlers[kind] = handler

    def wake(self) -> None:
        self._sync_now = True
        self._wake.set()

    def rearm(self) -> None:
        """Make the sync loop re-read its wait (the replica left idle: back to the normal renewal)."""
        self._wake.set()

    # ------------------------------------------------------------------ sync

    async def sync_once(self) -> bool:
        """One sync (see the module docstring); False when Redis failed (then degraded)."""
        from redis.exceptions import RedisError

        ctl = self.ctl
        demands = ctl.demands()
        pools = list(self.fleet.serving)
        sent = [self.shares.retry_of(pool).take_report() for pool in pools]
        rb = ctl.policy.retry_budget
        width_ms = max(1, int(rb.window_s * 1000 / _RB_SLOTS))
        keys = [self._k("replicas"), self._k("health", "v")]
        keys += [self._k("slots", r) for r, *_ in demands]
        keys += [self._k("retry", p) for p in pools]
        # Idle (nothing in use, wanted or requested here since the last sync, no retry spent, no
        # share owed to us): renew with the idle lease when one is set. The flag is up before the
        # report is sent, so a request admitted from here on wakes the loop (shares.busy).
        idle_lease = self.settings.idle_lease()
        idle = (idle_lease is not None and self.redis_up and not self.shares.wants_more()
                and all(inuse == 0 and demand == 0 for _, _, inuse, demand in demands)
                and all(dq == 0 and want <= 1 for dq, _, want in sent))
        self.shares.idle = idle
        lease_ms = int(idle_lease * 1000) if idle and idle_lease is not None else self.lease_ms
        args: list[Any] = [self.id, lease_ms, self.offset_ms, f"{self.config_hash}|{self.address}",
                           len(demands), len(pools), width_ms, _RB_SLOTS, repr(float(rb.ratio)), rb.min_retries]
        for _, limit, inuse, demand in demands:
            args += [repr(float(limit)), inuse, demand]
        for dq, dr, want in sent:
            args += [dq, dr, want]
        t0 = time.perf_counter()
        sent_at = self.clock.monotonic()
        # Until the answer is applied, admit no more than reported: the script may lower the
        # grants to it (shares.py, "While a sync is in flight").
        self.shares.reported_in_use({r: inuse for r, _, inuse, _ in demands})
        try:
            res = await self._sync_script(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            for pool, report in zip(pools, sent, strict=True):
                self.shares.retry_of(pool).put_back(report)
            self.shares.idle = False
            self._down(exc)
            return False
        finally:
            self.shares.answered()      # also when cancelled (stop) mid-flight
        self.sync_ms = round((time.perf_counter() - t0) * 1000, 3)
        self.syncs += 1
        self._last_sync = self.clock.monotonic()
        self._granted_at = sent_at
        self._apply_sync(res, demands, pools)
        version = res[3].decode() if isinstance(res[3], bytes) else str(res[3])
        if version != self._health_version:
            with contextlib.suppress(RedisError, OSError):
                await self._read_health()
                self._health_version = version
        ctl.tick()    # new grants: hand them to whoever waits
        if self.shares.wants_more():
            await self._announce_want()
        return True

    def _apply_sync(self, res: list[Any], demands: list[tuple[str, float, int, int]], pools: list[str]) -> None:
        sh = self.shares
        live = int(res[1])
        flat = [x.decode() if isinstance(x, bytes) else str(x) for x in res[2]]
        self.replicas = {}
        for rid, info in zip(flat[0::2], flat[1::2], strict=True):
            h, _, addr = info.partition("|")
            self.replicas[rid] = {"config_hash": h, "address": addr}
        self._check_config()
        sh.replicas = max(1, live)
        grants, targets = {}, {}
        i = 4
        for r, _, _, demand in demands:
            grants[r], targets[r] = int(res[i]), int(res[i + 1])
            sh.reported[r] = demand
            i += 2
        sh.grants, sh.targets = grants, targets
        self._resources = list(grants)
        for pool in pools:
            sh.retry_of(pool).claimed(int(res[i]), int(res[i + 1]), int(res[i + 2]))
            i += 3
        if not self.redis_up:
            if self.down_since is not None:
                log.warning("Redis is back: replica %s rejoined the cluster after %.1fs on its share of the limits",
                            self.id, self.clock.monotonic() - self.down_since)
            self.redis_up = True
            self.down_since = None
        if sh.degraded:
            sh.degraded = False
            self.ctl.shared_limiter.set_divisor(1, self.clock.time())
        self.last_error = None

    def _down(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        sh = self.shares
        if self.redis_up:
            self.redis_up = False
            self.outages += 1
            self.down_since = self.clock.monotonic()
            log.warning("Redis unreachable (%s): replica %s falls back to its share of every limit "
                        "(1/%d: slots, max_parallel, RPM/TPM, retry budget) until it returns",
                        self.last_error, self.id, sh.replicas)
        if not sh.degraded and self._grants_lapsed():
            sh.degraded = True
            self.ctl.shared_limiter.set_divisor(sh.replicas, self.clock.time())
        self.ctl.tick()   # the fallback share may differ from the last grant

    def _grants_lapsed(self) -> bool:
        """Whether the last successful sync's grants may have expired in Redis (module docstring):
        none yet, or its lease (counted from when it was sent) has run out."""
        return (self._granted_at is None
                or self.clock.monotonic() - self._granted_at >= self.settings.lease_s)

    def _check_config(self) -> None:
        by_hash: dict[str, list[str]] = {}
        for rid, info in self.replicas.items():
            by_hash.setdefault(info["config_hash"], []).append(rid)
        conflict = {h: sorted(ids) for h, ids in by_hash.items()} if len(by_hash) > 1 else {}
        if conflict != self.conflict:
            if conflict:
                log.warning("replicas run different configurations (fleet file or processes): %s; this replica "
                            "(%s) has %s", json.dumps(conflict), self.id, self.config_hash)
            elif self.conflict:
                log.info("every replica runs configuration %s again", self.config_hash)
        self.conflict = conflict

    async def _sync_loop(self) -> None:
        renew = self.settings.renew_period()
        idle_lease = self.settings.idle_lease()
        idle_renew = renew if idle_lease is None else max(renew, idle_lease / 3.0)
        gap = self.settings.min_gap_s
        loop = asyncio.get_running_loop()
        while not self._stopping:
            since = loop.time()
            while True:
                if self.shares.wants_more() and self.redis_up:
                    timeout = max(gap * 4, 0.01)
                else:
                    timeout = idle_renew if self.shares.idle else renew
                left = since + timeout - loop.time()
                if left <= 0:
                    break
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
                # lands as its timeout fires, and stop() would wait for ever.
                try:
                    async with asyncio.timeout(left):
                        await self._wake.wait()
                except TimeoutError:
                    break     # the renewal is due
                self._wake.clear()
                if self._sync_now:
                    break     # wake(): sync now
                # rearm(): the replica left idle. Wait the normal renewal from now, not from the
                # last sync: a sync sent now would hold back the retry claim (shares.py) just when
                # the first request may need it.
                since = loop.time()
            self._sync_now = False
            try:
                await self.sync_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("cluster sync failed")
            if gap > 0:
                await asyncio.sleep(gap)

    async def _announce_want(self) -> None:
        from redis.exceptions import RedisError

        now = self.clock.monotonic()
        if now - self._last_want < max(self.settings.min_gap_s * 4, 0.01):
            return
        self._last_want = now
        with contextlib.suppress(RedisError, OSError):
            await self.redis.publish(self.channel, json.dumps({"t": "want", "from": self.id}))
            self.wants_sent += 1

    # ------------------------------------------------------------------ health

    def _queue_change(self, change: HealthChange) -> None:
        try:
            self._changes.put_nowait(change)
        except asyncio.QueueFull:
            self.health.sent_back(change.node)

    async def _send_loop(self) -> None:
        from redis.exceptions import RedisError

        o = self.fleet.health.outlier
        while not self._stopping:
            c = await self._changes.get()
            try:
                args = [c.node, c.kind, int(c.length_s * 1000), "1" if c.hardware else "0",
                        int(o.base_ejection_s * 1000), int(o.max_ejection_s * 1000), int(o.interval_s * 1000),
                        self.id, c.reason[:500], self.channel, self.offset_ms,
                        json.dumps(c.evidence, default=str)[:4000]]
                res = await self._health_script(keys=[self._k("health"), self._k("health", "v")], args=args)
                rec = json.loads(res[0])
                self.health.apply(c.node, rec, float(res[1]), own=True)
            except (RedisError, OSError) as exc:
                self._down(exc)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sharing a node state failed")
            finally:
                self.health.sent_back(c.node)

    async def _read_health(self) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.hgetall(self._k("health"))
            t, records = await pipe.execute()
        now_ms = float(t[0]) * 1000 + float(t[1]) / 1000 + self.offset_ms
        for node, raw in records.items():
            name = node.decode() if isinstance(node, bytes) else str(node)
            with contextlib.suppress(ValueError):
                self.health.apply(name, json.loads(raw), now_ms)

    async def _listen_loop(self) -> None:
        from redis.exceptions import RedisError

        backoff = 0.1
        while not self._stopping:
            ps = self._sub_client.pubsub(ignore_subscribe_messages=True)
            try:
                await ps.subscribe(self.channel)
                await self._read_health()    # what changed while nobody listened
                backoff = 0.1
                while not self._stopping:
                    # No timeout: the loop wakes only for a message (a 1 s timeout woke an idle
                    # replica every second for nothing); stop() cancels it, a closed connection raises.
                    msg = await ps.get_message(ignore_subscribe_messages=True, timeout=None)
                    if msg is not None and msg.get("type") == "message":
                        self._on_message(msg.get("data"))
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError):
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
            except Exception:
                log.exception("cluster listener failed")
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await ps.aclose()

    def _on_message(self, data: Any) -> None:
        try:
            msg = json.loads(data)
        except (TypeError, ValueError):
            return
        if not isinstance(msg, dict) or msg.get("from") == self.id:
            return
        if msg.get("t") == "health" and isinstance(msg.get("rec"), dict):
            self.health_received += 1
            self.health.apply(str(msg.get("node")), msg["rec"], float(msg.get("now") or 0))
        elif msg.get("t") == "want":
            self.wants_received += 1
            self.wake()
        elif msg.get("t") == "left":
            # A supervisor removed a dead replica's shares and released its role (cluster/leave.py):
            # re-divide the limits and try for the role now, not at the next renewal.
            self.left_received += 1
            self.wake()
            if isinstance(self.election, Election):
                self.election.poke()
        elif (handler := self._handlers.get(str(msg.get("t")))) is not None:
            try:
                handler(msg)
            except Exception:
                log.exception("cluster message %r failed", msg.get("t"))

    # ------------------------------------------------------------------ what operators see

    def status(self) -> dict[str, Any]:
        sh = self.shares
        return {
            "replica": self.id, "replicas": sh.replicas, "redis_up": self.redis_up, "degraded": sh.degraded,
            "down_for_s": None if self.down_since is None else round(self.clock.monotonic() - self.down_since, 3),
            "lease_s": self.settings.lease_s, "idle_lease_s": self.settings.idle_lease(), "idle": sh.idle,
            "syncs": self.syncs, "sync_ms": self.sync_ms,
            "errors": self.errors, "outages": self.outages, "last_error": self.last_error,
            "grants": dict(sorted(sh.grants.items())), "targets": dict(sorted(sh.targets.items())),
            "config": {"hash": self.config_hash, "replicas": self.replicas, "conflict": self.conflict},
            "health": {"sent": self.health.sent, "received": self.health_received, "applied": self.health.applied},
            "left_received": self.left_received,
            "election": self.election.status(),
            **{name: part() for name, part in self.parts.items()},
        }


class ClusterCollector:
    """Scrape-time gauges and counters of one :class:`ClusterService` (the ``inferlb_cluster_`` family)."""

    def __init__(self, svc: ClusterService) -> None:
        self.svc = svc

    def collect(self) -> Iterable[Metric]:
        s = self.svc
        yield GaugeMetricFamily("inferlb_cluster_redis_up", "1 while this replica syncs with the cluster's Redis",
                                value=1.0 if s.redis_up else 0.0)
        yield GaugeMetricFamily("inferlb_cluster_degraded",
                                "1 while this replica enforces only its share of every limit (Redis away)",
                                value=1.0 if s.shares.degraded else 0.0)
        yield GaugeMetricFamily("inferlb_cluster_replicas", "Live replicas at the last sync",
                                value=float(s.shares.replicas))
        yield GaugeMetricFamily("inferlb_cluster_config_conflict",
                                "1 while live replicas run different configurations", value=1.0 if s.conflict else 0.0)
        yield GaugeMetricFamily("inferlb_cluster_leader", "1 while this replica holds the background-work lease",
                                value=1.0 if s.leader() else 0.0)
        yield CounterMetricFamily("inferlb_cluster_redis_errors", "Failed syncs with the cluster's Redis",
                                  value=float(s.errors))
        yield CounterMetricFamily("inferlb_cluster_syncs", "Successful syncs with the cluster's Redis",
                                  value=float(s.syncs))
        g = GaugeMetricFamily("inferlb_cluster_slot_grant", "Slots this replica may hold, per resource",
                              labels=["resource"])
        for r, v in s.shares.grants.items():
            if r.startswith("pool:"):
                g.add_metric([r], float(v))
        yield g
