"""How the local actuator changes the gateway's fleet: through the live node-admin operations.

A node the autoscaler starts goes through the same path as one an operator adds with
``POST /admin/nodes`` (api/nodes.py): the pure operations of
:mod:`inferlb.live.fleet_admin` (:func:`~inferlb.live.fleet_admin.add_node`,
:func:`~inferlb.live.fleet_admin.set_drained`, :func:`~inferlb.live.fleet_admin.remove_node`)
handed to a :class:`NodeAdmin` — in a gateway, :class:`~inferlb.live.manager.LiveConfig`, whose
``change_nodes`` validates the change, writes it to the node overrides (so every replica applies
it) and reconciles the running fleet (:func:`~inferlb.live.fleet_admin.apply_fleet`). Hence:

* :meth:`FleetPort.add_node`: the node joins ``loading`` (no traffic); the health process probes
  it (the monitor's targets follow the fleet) and it takes traffic in slow start once healthy.
  A cold start is visible as ``loading`` in ``/admin/fleet``; its source there is ``admin``.
* :meth:`FleetPort.begin_drain`: an operator's drain: ``draining`` (out of routing at once, held:
  the health sweeps leave it alone), ``drained`` once nothing is in flight.
* :meth:`FleetPort.remove_node`: the admin remove, which refuses a node that is not drained
  (unless ``force``, used at shutdown: requests in flight still finish) and the last node of a
  model (then the error propagates: the actuator reports that pool as failed).

Node events (``loading``, ``draining``, ``drained``, ``removed``) are the fleet's, with the
evidence ``{"by": "autoscaler"}``. :class:`LocalNodeAdmin` is a :class:`NodeAdmin` without a
database (the same operations and reconciliation, overrides kept in memory) for one process that
has no :class:`~inferlb.live.manager.LiveConfig`: tests and tools.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from inferlb.config.settings import FleetConfig, NodeConfig
from inferlb.errors import InvalidRequest, NotFound
from inferlb.fleet.state import Fleet
from inferlb.live.fleet_admin import Effective, add_node, apply_fleet, merge_overrides, remove_node, set_drained
from inferlb.store.overrides import NodeOverride
from inferlb.types import Clock

__all__ = ["ACTOR", "AdminFleetPort", "FleetNode", "FleetPort", "LocalNodeAdmin", "NodeAdmin"]

# Who changed the node, in the node events' evidence and the overrides' audit columns.
ACTOR: dict[str, Any] = {"by": "autoscaler", "key_id": None}

NodeChange = Callable[[Effective, Sequence[NodeOverride]], list[NodeOverride]]


@dataclass(frozen=True)
class FleetNode:
    name: str
    models: tuple[str, ...]
    labels: dict[str, str]
    state: str               # the fleet's state; "draining" for a node held or retired by a drain / removal
    inflight: int


class FleetPort(Protocol):
    def nodes(self) -> list[FleetNode]: ...

    async def add_node(self, cfg: NodeConfig, *, price_per_hour: float = 0.0) -> None: ...

    async def begin_drain(self, name: str, reason: str) -> None: ...

    def inflight(self, name: str) -> int: ...

    async def remove_node(self, name: str, *, force: bool = False) -> None: ...


class NodeAdmin(Protocol):
    """What :class:`~inferlb.live.manager.LiveConfig` offers: validate, persist and apply one node change."""

    async def change_nodes(self, name: str, change: NodeChange, *, what: str,
                           actor: Mapping[str, Any]) -> dict[str, Any]: ...


class AdminFleetPort:
    """:class:`FleetPort` over the live node-admin operations (module docstring)."""

    def __init__(self, fleet: Fleet, admin: NodeAdmin, clock: Clock) -> None:
        self.fleet = fleet
        self.admin = admin
        self.clock = clock

    def nodes(self) -> list[FleetNode]:
        return [FleetNode(name, tuple(st.cfg.models), dict(st.cfg.labels),
                          "draining" if st.held or st.retired else st.state, st.inflight_requests)
                for name, st in self.fleet.nodes.items()]

    async def add_node(self, cfg: NodeConfig, *, price_per_hour: float = 0.0) -> None:
        if cfg.api_key is not None:   # it would be stored in plain text with the overrides
            raise InvalidRequest("A node added live takes its key from an environment variable (api_key_env), "
                                 "not a literal api_key", param="api_key", code="literal_api_key")
        spec = cfg.model_dump(mode="json", exclude_none=True)
        if price_per_hour:
            spec["price_per_hour"] = price_per_hour
        at = self.clock.time()

        def change(eff: Effective, rows: Sequence[NodeOverride]) -> list[NodeOverride]:
            return add_node(eff, rows, spec, key_id=None, at=at)[1]

        await self.admin.change_nodes(cfg.name, change, what="add", actor=ACTOR)

    async def begin_drain(self, name: str, reason: str) -> None:
        at = self.clock.time()

        def change(eff: Effective, rows: Sequence[NodeOverride]) -> list[NodeOverride]:
            return set_drained(eff, rows, name, True, key_id=None, at=at)

        await self.admin.change_nodes(name, change, what="drain", actor={**ACTOR, "reason": reason})

    def inflight(self, name: str) -> int:
        st = self.fleet.nodes.get(name)
        return 0 if st is None else st.inflight_requests

    async def remove_node(self, name: str, *, force: bool = False) -> None:
        st = self.fleet.nodes.get(name)
        if st is None or st.retired:
            return
        drained_here = st.held and st.inflight_requests == 0
        at = self.clock.time()

        def change(eff: Effective, rows: Sequence[NodeOverride]) -> list[NodeOverride]:
            return remove_node(eff, rows, name, drained_here=drained_here, force=force, key_id=None, at=at)

        try:
            await self.admin.change_nodes(name, change, what="remove", actor=ACTOR)
        except NotFound:   # removed meanwhile (an operator, another replica): nothing left to do
            return


class LocalNodeAdmin:
    """:class:`NodeAdmin` for one process without a database (module docstring): the overrides live
    in memory, every change is validated by merging and applied with ``apply_fleet``."""

    def __init__(self, fleet: Fleet, base: FleetConfig) -> None:
        self.fleet = fleet
        self.base = base
        self.rows: list[NodeOverride] = []
        self.effective = merge_overrides(base, [], source="fleet")

    async def change_nodes(self, name: str, change: NodeChange, *, what: str,
                           actor: Mapping[str, Any]) -> dict[str, Any]:
        rows = change(self.effective, self.rows)
        eff = merge_overrides(self.base, rows, source="node")
        self.rows, self.effective = rows, eff
        changes = apply_fleet(self.fleet, eff, {"trigger": what, **actor})
        return {"node": name, "action": what, "config_version": eff.version, "changes": changes}
