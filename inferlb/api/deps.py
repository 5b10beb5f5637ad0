"""Every router's dependencies, as ``Annotated`` types.

``create_app``'s lifespan puts the app-wide objects on ``app.state``; this module is the ONE place
that reads them there (routers and guards take these types, never ``request.app.state``), and
nothing here is created at import time. The getters are ``async``: FastAPI runs a plain ``def``
dependency in a worker thread, a measured 10-15 % of the gateway's CPU per request.

The getters of what every app has (gateway, settings, admission controller, store) raise
RuntimeError when it is missing, a wiring error rather than a client error; the optional ones
(observability, event writer, health monitor, autoscaler, cluster service) give None.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from inferlb.admission.controller import AdmissionController
from inferlb.autoscale.runner import AutoscaleRunner
from inferlb.cluster.service import ClusterService
from inferlb.config.settings import Settings
from inferlb.engine.gateway import Gateway
from inferlb.health.monitor import HealthMonitor
from inferlb.kvevents.wiring import KVEventsWiring
from inferlb.live.manager import LiveConfig
from inferlb.observability.hub import Observability
from inferlb.rollout.manager import RolloutManager
from inferlb.server.worker_metrics import WorkerMetrics
from inferlb.store import StoreHandle
from inferlb.store.events import EventWriter

__all__ = ["AdmissionDep", "AutoscalerDep", "ClusterDep", "EventsDep", "GatewayDep", "KVEventsDep", "Lifecycle",
           "LifecycleDep",
           "LiveDep", "MonitorDep", "ObservabilityDep", "OptionalStoreDep", "RolloutsDep", "SettingsDep", "StoreDep",
           "WorkerMetricsDep",
           "get_admission", "get_gateway", "get_rollouts", "get_settings", "get_store"]


def _required(request: Request, name: str) -> Any:
    value = getattr(request.app.state, name, None)
    if value is None:
        raise RuntimeError(f"app.state.{name} is not set: create_app's lifespan installs it")
    return value


async def get_gateway(request: Request) -> Gateway:
    gw: Gateway = _required(request, "gateway")
    return gw


async def get_settings(request: Request) -> Settings:
    settings: Settings = _required(request, "settings")
    return settings


async def get_admission(request: Request) -> AdmissionController:
    ctl: AdmissionController = _required(request, "admission")
    return ctl


async def get_store(request: Request) -> StoreHandle:
    store = _required(request, "store")
    if not isinstance(store, StoreHandle):
        raise RuntimeError("app.state.store is not a StoreHandle")
    return store


async def get_rollouts(request: Request) -> RolloutManager:
    manager: RolloutManager = _required(request, "rollouts")
    return manager


def _optional(name: str) -> Callable[[Request], Awaitable[Any]]:
    """The getter of an optional app-wide object: ``app.state.<name>``, or None."""
    async def get(request: Request) -> Any:
        return getattr(request.app.state, name, None)
    get.__name__ = f"get_{name}"
    return get


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """Where the app is in its life: ready (start-up done, not draining), draining (stop signal
    seen), and the request process's executor (None before start-up)."""

    ready: bool
    draining: bool
    engine: str | None


async def get_lifecycle(request: Request) -> Lifecycle:
    state = request.app.state
    process = getattr(state, "process", None)
    return Lifecycle(ready=bool(getattr(state, "ready", False)), draining=bool(getattr(state, "draining", False)),
                     engine=getattr(process, "mode", None))


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
AdmissionDep = Annotated[AdmissionController, Depends(get_admission)]
StoreDep = Annotated[StoreHandle, Depends(get_store)]
OptionalStoreDep = Annotated[StoreHandle | None, Depends(_optional("store"))]
ObservabilityDep = Annotated[Observability | None, Depends(_optional("observability"))]
EventsDep = Annotated[EventWriter | None, Depends(_optional("events"))]
MonitorDep = Annotated[HealthMonitor | None, Depends(_optional("monitor"))]
LiveDep = Annotated[LiveConfig | None, Depends(_optional("live"))]
AutoscalerDep = Annotated[AutoscaleRunner | None, Depends(_optional("autoscaler"))]
ClusterDep = Annotated[ClusterService | None, Depends(_optional("cluster"))]   # None: one replica alone
KVEventsDep = Annotated[KVEventsWiring | None, Depends(_optional("kv_events"))]   # None: no KV events used
# serve --workers N: this worker's view of its siblings' metrics (server/worker_metrics.py); None: one process
WorkerMetricsDep = Annotated[WorkerMetrics | None, Depends(_optional("worker_metrics"))]
LifecycleDep = Annotated[Lifecycle, Depends(get_lifecycle)]
RolloutsDep = Annotated[RolloutManager, Depends(get_rollouts)]
