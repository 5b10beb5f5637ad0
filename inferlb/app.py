"""``create_app(settings)``: the ONLY composition root.

Nothing is created at import time. The lifespan builds, in order: fleet config and both processes
(:func:`check_startup_files`: parsed and validated once, executors chosen; a bad file fails before
anything is opened) → audit database (SQLite is upgraded automatically; PostgreSQL expects
``inferlb db upgrade``) → audit writer → upstream client → observability
hub → runtime (fleet, router, admission controller) → gateway (with the ``admission/wait``
performer) → admission service (keys, queue tick, Redis sync) → cluster service (only with
several replicas on one Redis: first sync, shared health, election; cluster) → audit
maintenance (on the leader) → node-event writer → health monitor (its first round runs before
readiness, so a node still loading gets no traffic) → rollout manager (built, not started) → live
config (reloads, swapping the version table and the rollout config too; node overrides and the
rollouts from the database followed before readiness; live/manager.py) → discovery sources
(discovery) → rollout manager started (``rollout.bpmn`` every ``rollouts.interval_s``, only
while :func:`leader`: one replica decides, every replica follows the ``rollouts`` table).
Shutdown: readiness false at the stop signal → in-flight requests drain with the listener open
(``server``; new inference requests get 503) → discovery sources → rollout manager → live
config → monitor → upstream → cluster service (shares handed back, lease released) → admission service →
audit writer flushed → observability → event writer → database disposed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from inferlb.admission.controller import AdmissionController
from inferlb.admission.service import AdmissionService
from inferlb.api import admin, audit, edge, health, nodes, openai
from inferlb.api import capacity as capacity_api
from inferlb.api import dashboard as dashboard_api
from inferlb.api import keys as keys_api
from inferlb.api import metrics as metrics_api
from inferlb.api import rollouts as rollouts_api
from inferlb.api import schema as openapi_schema
from inferlb.api import tiers as tiers_api
from inferlb.api.auth import require_admin
from inferlb.cluster.admission import SharedAdmission
from inferlb.cluster.election import Leadership, LocalLeader
from inferlb.cluster.service import ClusterCollector, ClusterService, config_hash
from inferlb.config.netpolicy import Listener, NetworkPolicy
from inferlb.config.settings import Settings
from inferlb.engine.gateway import Gateway
from inferlb.engine.request_end import EndStep, RequestEnd
from inferlb.engine.scope import Snapshot, build_runtime
from inferlb.engine.upstream import Upstream
from inferlb.errors import ClientError, ConfigError, StoreError, error_body
from inferlb.fleet.netguard import check_fleet_names
from inferlb.health.monitor import HealthMonitor
from inferlb.health.probe import Prober
from inferlb.kvevents.wiring import KVEventsWiring, uses_kv_events
from inferlb.learned.loop import LearnedLoop
from inferlb.learned.metrics import LearnedCollector, LengthCollector
from inferlb.learned.share import PredictorShare, SharesLoop, StateShare
from inferlb.learned.share_length import LengthState
from inferlb.learned.share_reward import RewardState
from inferlb.live.fleet_admin import config_version
from inferlb.live.manager import LiveConfig
from inferlb.live.startup import Checked, check_files
from inferlb.observability.hub import Observability, queue_depth_of
from inferlb.rollout.manager import RolloutManager
from inferlb.rollout.metrics import RolloutCollector
from inferlb.rollout.window import VersionWindow
from inferlb.store import StoreHandle
from inferlb.store.db import is_sqlite, make_engine, upgrade
from inferlb.store.events import EventWriter
from inferlb.store.maintenance import AuditMaintenance
from inferlb.store.records import RequestRecord
from inferlb.store.revision_watch import revision_watch
from inferlb.store.writer import AuditWriter
from inferlb.tasks import AUTOSCALE_CONTRACT, HEALTH_CONTRACT, REQUEST_CONTRACT, ROLLOUT_CONTRACT, SERVICES
from inferlb.tiers.audit import warm_from_audit
from inferlb.tiers.metrics import TierCollector
from inferlb.tiers.router import TierRouter
from inferlb.types import Clock, SystemClock
from inferlb.versions.table import VersionTable

__all__ = ["check_startup_files", "create_app", "default_processes_dir", "leader", "leadership", "request_end"]

log = logging.getLogger("inferlb")


def default_processes_dir() -> Path:
    """The repo's ``processes/`` (editable install), else the copy packaged in the wheel."""
    here = Path(__file__).resolve()
    repo = here.parents[1] / "processes"
    if repo.is_dir():
        return repo
    return here.parents[0] / "_processes"


def _envelope(status: int, message: str, etype: str, code: str | None, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, etype, code, param), status_code=status)


def request_end(admission: AdmissionController, *, audit: Callable[[RequestRecord], None],
                obs: Observability | None = None,
                versions: Callable[[RequestRecord], None] | None = None,
                tiers: Callable[[RequestRecord], None] | None = None) -> RequestEnd:
    """What runs when a request ends, in this order, exactly once per request (rejections,
    clients gone and engine failures included; see engine/request_end.py for failures of a step):

    1. ``tenant spend``: the request's cost (``cost_est``, cost.py) added to its key's spend;
    2. ``admission release``: its pool slot freed and handed on, its key's parallel/TPM settled;
    3. ``audit``: the record handed to the batched audit writer (never blocks);
    4. ``versions`` (when given): the per-version window canary rollouts decide on (rollout/window.py);
       ``tiers`` (when given): a model alias's tier counters, guard and learned model (tiers/router.py);
    5. ``metrics`` and 6. ``traces``: Prometheus counters and the OTel spans of the same record.
    """
    steps: list[EndStep] = [("tenant spend", admission.charge), ("admission release", admission.release),
                            ("audit", audit)]
    if versions is not None:
        steps.append(("versions", versions))
    if tiers is not None:
        steps.append(("tiers", tiers))
    if obs is not None and obs.metrics is not None:
        steps.append(("metrics", obs.metrics.observe))
    if obs is not None and obs.tracer is not None:
        steps.append(("traces", obs.tracer.emit))
    return RequestEnd(steps)


def check_startup_files(settings: Settings) -> Checked:
    """The fleet and both processes as the lifespan will use them, or ConfigError /
    ProcessValidationError (pure: ``inferlb validate --config`` and ``serve`` call it first)."""
    return check_files(settings, SERVICES, processes_dir=default_processes_dir(), request=REQUEST_CONTRACT,
                       health=HEALTH_CONTRACT, autoscale=AUTOSCALE_CONTRACT, rollout=ROLLOUT_CONTRACT)


def leader(app: FastAPI) -> bool:
    """Whether this replica should run once-only background work (retention prune, autoscaler,
    rollouts) now. One replica alone: always True once started. In a cluster: True only while this
    replica holds the database lease of role ``background`` (cluster/election.py); it turns
    False before the lease can pass to another replica, and another takes over when the holder
    dies. Writers should also call :func:`leadership` ``(app).fence(conn)`` inside their write
    transaction (the fencing token check). False before start-up and after shutdown."""
    fn = getattr(app.state, "leader", None)
    return bool(fn()) if callable(fn) else False


def leadership(app: FastAPI) -> Leadership:
    """The election of this app (``leader()``, ``fence(conn)``, ``status()``); a stand-in that always
    leads when the app runs alone or has not started."""
    got = getattr(app.state, "leadership", None)
    return got if got is not None else LocalLeader()


def create_app(settings: Settings, *, clock: Clock | None = None, node_launcher: Any = None,
               leader: Callable[[], bool] | None = None) -> FastAPI:
    """``node_launcher``: what the ``local`` autoscale actuator starts nodes with (``inferlb demo
    --autoscale`` passes the simulator's); ``leader``: whether this replica runs the once-only
    background work (audit maintenance, autoscale rounds, rollout steps); default: the cluster's
    election when replicas share Redis (:func:`leader`), else always."""
    clock = clock or SystemClock()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = app.state
        state.settings = settings
        state.ready = False
        state.draining = False
        # Every file first (fleet, both processes): a bad one fails before anything is opened.
        checked = check_startup_files(settings)
        fleet_cfg = checked.fleet
        # The fleet file's host names, by what they resolve to now (each connection checks again).
        await check_fleet_names(fleet_cfg, source=str(settings.config) if settings.fleet is None else None)
        if is_sqlite(settings.database_url):
            await asyncio.to_thread(upgrade, settings.database_url)
        engine = make_engine(settings.database_url, connect_timeout_s=settings.database_connect_timeout_s,
                             statement_timeout_ms=settings.database_statement_timeout_ms,
                             busy_timeout_ms=settings.database_busy_timeout_ms,
                             sqlite_synchronous=settings.audit_sqlite_synchronous)
        writer = AuditWriter(engine, journal_dir=settings.journal_dir, batch_size=settings.audit_batch_size,
                             flush_interval_s=settings.audit_flush_interval_s, clock=clock,
                             db_timeout_s=settings.audit_db_timeout_s,
                             wal_commit_interval_s=settings.audit_wal_commit_interval_s,
                             wal_commit_linger_s=settings.audit_wal_commit_linger_s,
                             max_records=settings.audit_max_records, max_bytes=settings.audit_max_bytes,
                             on_full=settings.audit_on_full)
        await writer.start()
        state.store = StoreHandle(engine=engine, writer=writer, slos=list(fleet_cfg.slos))
        # Once-only background work asks this (the explicit ``leader`` argument, else the election).
        state.leader = None

        def leads() -> bool:
            fn = leader if leader is not None else state.leader
            return bool(fn()) if callable(fn) else False

        # Day partitions ahead + retention, on the leader (started once the election runs, below).
        maintenance = state.audit_maintenance = AuditMaintenance(
            engine, clock=clock, retention_days=settings.audit_retention_days,
            interval_s=settings.audit_maintenance_interval_s, leader=leads)
        def node_policy() -> tuple[NetworkPolicy, tuple[Listener, ...]]:
            # The policy in force (a reload may change it), asked on each connection's resolution.
            cfg = state.gateway.rt.fleet.cfg if getattr(state, "gateway", None) is not None else fleet_cfg
            return cfg.network_policy, cfg.listeners

        upstream = Upstream(clock=clock, guard=node_policy)
        await upstream.start()
        process = checked.request_process
        state.process = process
        log.info("request process %s runs on the %s executor%s", process.path.name, process.mode,
                 f" (outside the compiled subset: {process.compiled_problems})" if process.compiled_problems else "")
        obs = state.observability = Observability(fleet_cfg, clock=clock)
        obs.instrument(process)
        # Model versions and the per-version window that canary rollouts decide on.
        versions = VersionTable.from_fleet(fleet_cfg)
        window = VersionWindow(clock, lambda m: versions.get(m) is not None, slos=fleet_cfg.slos,
                               max_age_s=max(fleet_cfg.rollouts.criteria.window_s, 3600.0))
        # writer.begin journals each request's start (fsynced) and refuses it (503) when it cannot be audited.
        clustered = settings.cluster_on()
        if settings.cluster.mode == "on" and not clustered:
            raise ConfigError("INFERLB_CLUSTER_MODE=on needs INFERLB_REDIS_URL (and INFERLB_LIMITS other than memory)")
        tier_router = TierRouter(clock)   # model aliases with tiers: their counts, guards, learned models
        obs.registry.register(TierCollector(tier_router))
        rt = build_runtime(settings, fleet_cfg, clock=clock, begin=writer.journal_start, versions=versions,
                           tiers=tier_router,
                           end=functools.partial(request_end, audit=writer.submit, obs=obs, versions=window.observe,
                                                 tiers=tier_router.observe),
                           admission_cls=SharedAdmission if clustered else AdmissionController)
        # The engines' KV events (inferlb/kvevents): one subscription a publishing node, the index routing reads.
        kv: KVEventsWiring | None = None
        if uses_kv_events(fleet_cfg):
            kv = KVEventsWiring.build(fleet_cfg, clock=clock, registry=obs.registry)
            rt.kv = kv.service
            await kv.start()
        state.kv_events = kv
        state.admission = rt.admission
        try:   # learned tier models (learned.enabled) start from the audit trail's outcomes
            warmed = await asyncio.to_thread(warm_from_audit, tier_router, fleet_cfg, engine)
            if warmed:
                log.info("tier models warmed from %d audited outcomes", warmed)
        except StoreError as exc:
            log.warning("tier models start cold: the audit trail cannot be read (%s)", exc)
        state.gateway = Gateway(rt, process, upstream, performers={"admission/wait": rt.admission.wait},
                                config_version=config_version(fleet_cfg), hop_id=settings.cluster.replica_id)
        admission = state.admission_service = AdmissionService(rt.admission, engine)   # keys, queue tick, Redis
        await admission.start()
        # Several replicas on one Redis: slot shares, shared health, election (cluster).
        cluster: ClusterService | None = None
        state.leadership = LocalLeader()
        if clustered and isinstance(rt.admission, SharedAdmission) and settings.admission.redis_url:
            cluster = state.cluster = ClusterService(
                settings.cluster, redis_url=settings.admission.redis_url, prefix=settings.admission.redis_prefix,
                admission=rt.admission, fleet=rt.fleet, clock=clock, engine=engine,
                config_hash=config_hash(fleet_cfg, (process.path, checked.health_process.path)),
                address=f"{settings.host}:{settings.port}")
            await cluster.start()
            state.leadership = cluster.election
            obs.registry.register(ClusterCollector(cluster))
        state.leader = state.leadership.leader
        await maintenance.start()
        obs.bind(rt.fleet, backlog=writer.backlog, queue_depth=lambda: queue_depth_of(state),
                 ready=lambda: bool(state.ready))
        await obs.start()
        # Node health: node_health.bpmn on SpiffWorkflow every health.interval_s; the first round
        # runs before ready (Envoy's cluster warming); state changes go to node_events.
        health_process = checked.health_process
        events = state.events = EventWriter(engine, clock=clock, journal_dir=settings.journal_dir)
        await events.start()
        prober = Prober(fleet_cfg.nodes, fleet_cfg.health, clock, guard=node_policy)
        monitor = state.monitor = HealthMonitor(fleet=state.gateway.rt.fleet, process=health_process, clock=clock,
                                                prober=prober, record=events.submit)
        await monitor.start()
        # The learned profile's feedback loop (training, scheduled retrain, drift events, metrics).
        learned = state.learned_loop = None
        if rt.learner is not None:
            obs.registry.register(LearnedCollector(rt.learner, lambda: state.gateway.rt.router))
            # in a cluster one replica trains and the others install its snapshots (learned/share.py)
            share = None if cluster is None else PredictorShare(
                rt.learner, redis=cluster.redis, key=cluster.key, channel=cluster.channel, me=cluster.id,
                leader=cluster.leader, clock=clock)
            if cluster is not None and share is not None:
                cluster.subscribe("learned", share.notify)
                cluster.subscribe("learned-obs", share.notify)
                cluster.parts["learned"] = share.status
            learned = state.learned_loop = LearnedLoop(rt.learner, clock=clock, engine=engine, record=events.submit,
                                                       share=share)
            await learned.start()
        # The other learned parts a cluster shares the same way (learned/share_length.py,
        # learned/share_reward.py), on a loop of their own that runs only in a cluster.
        if rt.lengths is not None:
            obs.registry.register(LengthCollector(rt.lengths))
        length_part: LengthState | None = None
        reward_part: RewardState | None = None
        others: list[StateShare] = []
        if cluster is not None:
            parts: list[LengthState | RewardState] = []
            if rt.lengths is not None:
                parts.append(length_part := LengthState(rt.lengths))
            if rt.learner is not None:   # the bandit of the router in force (a reload may replace both)
                parts.append(reward_part := RewardState(lambda: getattr(state.gateway.rt.router, "reward", None)))
            # The trainer looks at the followers' list on their message, else every 30 s (a message
            # missed while the listener reconnected): each look is a Redis round trip for it and the
            # coordinator, which an idle cluster pays for nothing (measured: docs/benchmarks.md).
            others = [StateShare(part, redis=cluster.redis, key=cluster.key, channel=cluster.channel, me=cluster.id,
                                 leader=cluster.leader, clock=clock, drain_every_s=30.0) for part in parts]
            for other in others:
                for kind in other.message_types:
                    cluster.subscribe(kind, other.notify)
                cluster.parts[other.kind] = other.status
        shares = state.learned_shares = SharesLoop(others, interval_s=2.0) if others else None
        if shares is not None:
            await shares.start()
        def swapped(snap: Snapshot) -> None:
            state.process = snap.process
            kv_now: KVEventsWiring | None = state.kv_events
            if kv_now is not None:
                kv_now.follow(snap.rt.fleet_cfg)
            elif uses_kv_events(snap.rt.fleet_cfg):   # a reload turned the feature on
                kv_now = state.kv_events = KVEventsWiring.build(snap.rt.fleet_cfg, clock=clock, registry=obs.registry)
                kv_now.start_soon()
            snap.rt.kv = kv_now.service if kv_now is not None else None
            if cluster is not None:   # the other replicas compare it (config conflicts)
                cluster.config_hash = config_hash(snap.rt.fleet_cfg, (snap.process.path, live.health_process.path))

        # Canary rollouts: steps decided on the leader only (its writes fenced by the election's
        # token); every replica follows the rollouts table.
        rollouts = state.rollouts = RolloutManager(versions=versions, window=window, process=checked.rollout_process,
                                                   clock=clock, cfg=fleet_cfg.rollouts, engine=engine,
                                                   leader=leads, fence=lambda conn: leadership(app).fence(conn))
        obs.registry.register(RolloutCollector(rollouts))
        # Reloads, node overrides and rollouts of other replicas (live/manager.py): the database's
        # overrides and running rollouts apply before readiness.
        live = state.live = LiveConfig(settings=settings, checked=checked, gateway=state.gateway,
                                       check=check_startup_files, clock=clock, engine=engine, monitor=monitor,
                                       obs=obs, store=state.store, record=events.submit,
                                       on_swap=swapped, poll_s=settings.overrides_poll_s, rollouts=rollouts,
                                       watch=revision_watch(engine, clock=clock,
                                                            reread_s=settings.overrides_reread_s))
        await live.start()
        # Node discovery (discovery): every replica watches; pods join through the live config.
        state.discovery = []
        if fleet_cfg.discovery:
            from inferlb.discovery.wiring import build_discovery

            state.discovery = build_discovery(fleet_cfg, live=live, fleet=rt.fleet, clock=clock,
                                              registry=obs.registry)
            for source in state.discovery:
                await source.start()
        # Autoscaling: autoscale.bpmn on SpiffWorkflow every autoscale.interval_s (autoscale).
        state.autoscaler = None
        if checked.autoscale_process is not None:
            from inferlb.autoscale.wiring import build_autoscaler

            state.autoscaler = build_autoscaler(fleet_cfg, checked.autoscale_process, fleet=rt.fleet, engine=engine,
                                                clock=clock, admin=live, launcher=node_launcher,
                                                registry=obs.registry, leader=leads)
            await state.autoscaler.start()
        await rollouts.start()
        state.ready = True
        try:
            yield
        finally:
            state.ready = False
            state.draining = True
            state.leader = None           # background work stops first
            for source in state.discovery:
                await source.close()
            await rollouts.close()
            await live.close()
            if state.autoscaler is not None:
                await state.autoscaler.close()
            await monitor.close()
            if learned is not None:
                await learned.close()
            if shares is not None:
                await shares.close()
            for part in (length_part, reward_part):
                if part is not None:
                    part.detach()         # each learns its own observations again
            await upstream.close()
            if state.kv_events is not None:
                await state.kv_events.close()
            if cluster is not None:
                await cluster.stop()      # shares handed back at once, the lease released
            await admission.stop()
            await maintenance.close()
            await writer.close(timeout_s=10.0)
            await obs.close()
            await events.close()
            engine.dispose()

    # /docs and /openapi.json are openapi_schema.router's (guarded: api/auth.py require_docs_reader)
    app = FastAPI(title="inferlb", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    # tenant keys when auth is on; then JSON bodies only, and no new requests while draining
    app.include_router(openai.router, dependencies=[Depends(edge.openai_guard)])
    app.include_router(health.router)
    # the admin plane: the admin key when one is set, else the admin listener only (api/auth.py)
    for r in (audit.router, admin.router, nodes.router, rollouts_api.router, capacity_api.router,
              tiers_api.router):
        app.include_router(r, dependencies=[Depends(require_admin)])
    app.include_router(keys_api.router)
    app.include_router(metrics_api.router)
    app.include_router(dashboard_api.router)
    app.include_router(openapi_schema.router)
    edge.install(app, settings.cors_allow_origins)    # HEAD, clients gone mid-body, CORS
    openapi_schema.install(app, settings.max_n)   # bodies of the OpenAI routes; errors as the 400 envelope, never 422

    @app.exception_handler(ClientError)
    async def _client_error(request: Request, exc: ClientError) -> JSONResponse:
        return JSONResponse(exc.envelope(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's 422 becomes the OpenAI 400 (what vLLM and SGLang answer too).
        first: dict[str, Any] = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(x) for x in first.get("loc", ())[1:]) or None
        return _envelope(400, str(first.get("msg", "invalid request")), "invalid_request_error",
                         "invalid_value", loc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        response = _envelope(exc.status_code, str(exc.detail), "invalid_request_error", code)
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            response.headers["allow"] = edge.allow_header(request)
        return response

    return app
