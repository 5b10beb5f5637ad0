"""How the local actuator changes the gateway's fleet: a small interface, a minimal implementation.

The fleet was static when this was written (``engine/fleet.py`` builds its nodes once from the
fleet file); live node add / drain belongs to the fleet itself. Until it has it, the autoscaler
goes through :class:`FleetPort` only, and :class:`EngineFleetPort` implements it against today's
:class:`~inferlb.engine.fleet.Fleet` by adjusting the same internal tables its constructor builds
(``nodes``, the per-node model sets, ``serving``, the routing-snapshot positions) and asking for a
full routing rebuild. When the fleet grows public add / drain / remove methods, only this class
changes.

* :meth:`add_node`: the node joins in state ``loading`` (no traffic); the health monitor's probes
  (its target list is extended here) bring it to ``healthy`` through slow start once its
  readiness path answers 200: a cold start is visible as ``loading`` in ``/admin/fleet``.
* :meth:`begin_drain`: the node leaves routing at once (it serves no model any more) and is shown
  ``draining``; requests in flight on it finish. :meth:`inflight` says how many are left.
* :meth:`remove_node`: the node's state is dropped (after the drain).

Node events (``loading``, ``draining``) go through :meth:`Fleet.transition`, so they land in
``node_events`` like every other state change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..cost import Share
from ..fleet import Fleet, NodeState
from ..health.probe import targets_for
from ..settings import NodeConfig

__all__ = ["EngineFleetPort", "FleetNode", "FleetPort"]


@dataclass(frozen=True)
class FleetNode:
    name: str
    models: tuple[str, ...]
    labels: dict[str, str]
    state: str
    inflight: int


class FleetPort(Protocol):
    def nodes(self) -> list[FleetNode]: ...

    def add_node(self, cfg: NodeConfig, *, price_per_hour: float = 0.0) -> None: ...

    def begin_drain(self, name: str, reason: str) -> None: ...

    def inflight(self, name: str) -> int: ...

    def remove_node(self, name: str) -> None: ...


class EngineFleetPort:
    """:class:`FleetPort` over today's :class:`Fleet` (see the module docstring). ``prober``: the
    health monitor's prober, whose targets follow the fleet (optional: tests without probes)."""

    def __init__(self, fleet: Fleet, prober: Any | None = None) -> None:
        self.fleet = fleet
        self.prober = prober
        self._draining: dict[str, frozenset[str]] = {}

    def nodes(self) -> list[FleetNode]:
        f = self.fleet
        return [FleetNode(name, tuple(sorted(self._draining.get(name) or f._model_sets[name])),
                          dict(st.cfg.labels), st.state, st.inflight_requests) for name, st in f.nodes.items()]

    def add_node(self, cfg: NodeConfig, *, price_per_hour: float = 0.0) -> None:
        f = self.fleet
        if cfg.name in f.nodes:
            raise ValueError(f"node {cfg.name!r} is already in the fleet")
        unknown = [m for m in cfg.models if m not in f.models]
        if unknown:
            raise ValueError(f"node {cfg.name!r} serves unknown model(s) {unknown}")
        now, wall = f.clock.monotonic(), f.clock.time()
        st = NodeState(cfg, since=now, since_wall=wall, price_per_hour=price_per_hour or cfg.price_per_hour,
                       share=Share(wall))
        f.nodes[cfg.name] = st
        f._model_sets[cfg.name] = frozenset(cfg.models)
        for m in cfg.models:
            f.serving.setdefault(m, []).append(cfg.name)
        f._pos[cfg.name] = len(f._names)
        f._names.append(cfg.name)
        object.__setattr__(st, "_owner", f)
        f._rebuild_all = True
        f.transition(st, "loading", "started by the autoscaler: cold start (waiting for its readiness probe)",
                     {"autoscaler": True, "url": cfg.url})
        if self.prober is not None:
            self.prober.targets.extend(targets_for([cfg], self.prober.cfg))

    def begin_drain(self, name: str, reason: str) -> None:
        f = self.fleet
        st = f.nodes[name]
        self._draining[name] = f._model_sets[name]
        f._model_sets[name] = frozenset()          # out of every model's routing list at once
        for names in f.serving.values():
            if name in names:
                names.remove(name)
        f._rebuild_all = True
        f.transition(st, "draining", reason, {"autoscaler": True, "inflight": st.inflight_requests})

    def inflight(self, name: str) -> int:
        st = self.fleet.nodes.get(name)
        return 0 if st is None else st.inflight_requests

    def remove_node(self, name: str) -> None:
        f = self.fleet
        if name not in f.nodes:
            return
        if name not in self._draining:
            self.begin_drain(name, "removed by the autoscaler")
        del f.nodes[name]
        del f._model_sets[name]
        self._draining.pop(name, None)
        f._names.remove(name)
        f._pos = {n: i for i, n in enumerate(f._names)}
        f._dirty.discard(name)
        f._ramping.discard(name)
        f._expires.pop(name, None)
        f._rebuild_all = True
        if self.prober is not None:
            self.prober.targets[:] = [t for t in self.prober.targets if t.node != name]
