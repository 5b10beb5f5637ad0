"""Build the autoscaler of a running gateway (called from ``create_app``'s lifespan only).

The actuator from the config (``local`` joins and removes nodes through the live node-admin
operations, :class:`~.fleet_port.AdminFleetPort` over the gateway's ``admin`` (its
:class:`~inferlb.live.manager.LiveConfig`), with the injected node launcher), the observer over the
audit database, the runner with its leader predicate (a plain callable: True when none is given,
i.e. this replica scales), and the Prometheus collector on the app's registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Engine

from inferlb.autoscale.actuators import build_actuator
from inferlb.autoscale.fleet_port import AdminFleetPort, LocalNodeAdmin, NodeAdmin
from inferlb.autoscale.forecast import make_forecaster
from inferlb.autoscale.metrics import AutoscaleCollector
from inferlb.autoscale.observe import audit_observer
from inferlb.autoscale.policy import Autoscaler
from inferlb.autoscale.runner import AutoscaleRunner
from inferlb.autoscale.store import insert_scaling_events
from inferlb.config.settings import FleetConfig
from inferlb.fleet.state import Fleet
from inferlb.types import Clock
from inferlb.workflow.definition import ProcessDefinition

__all__ = ["build_autoscaler"]


def build_autoscaler(fleet_cfg: FleetConfig, process: ProcessDefinition, *, fleet: Fleet, engine: Engine,
                     clock: Clock, admin: NodeAdmin | None = None, launcher: Any = None, registry: Any = None,
                     leader: Callable[[], bool] | None = None) -> AutoscaleRunner:
    """``admin``: what node changes go through (the gateway's LiveConfig); None: an in-memory
    :class:`~.fleet_port.LocalNodeAdmin` over ``fleet`` (no other replica learns of the nodes)."""
    cfg = fleet_cfg.autoscale
    if cfg is None:
        raise ValueError("the fleet has no autoscale: section")
    finops = fleet_cfg.observability.finops
    label = finops.gpu_label
    port = AdminFleetPort(fleet, admin or LocalNodeAdmin(fleet, fleet_cfg), clock)
    actuator = build_actuator(cfg, clock=clock, port=port, launcher=launcher, gpu_label=label,
                              gpu_prices=dict(finops.gpu_prices))

    def node_gpu() -> dict[str, str]:
        return {name: st.cfg.labels.get(label, "unknown") for name, st in fleet.nodes.items()}

    observe = audit_observer(engine, cfg, node_gpu=node_gpu, slos=list(fleet_cfg.slos))
    scaler = Autoscaler(cfg, make_forecaster(cfg.forecaster), gpu_prices=dict(finops.gpu_prices))
    runner = AutoscaleRunner(process=process, scaler=scaler, actuator=actuator, observe=observe, clock=clock,
                             write=lambda rows: insert_scaling_events(engine, rows),
                             **({} if leader is None else {"leader": leader}))
    if registry is not None:
        registry.register(AutoscaleCollector(runner))
    return runner
