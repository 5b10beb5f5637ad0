"""``local``: starts and stops model-server nodes on this machine and joins them to the gateway's fleet.

What starts a node is injected (:class:`NodeLauncher`): ``inferlb demo --autoscale`` passes one
that runs an emulated GPU node (``inferlb/simulator``) which reports "loading" (503 on its
readiness path) for the pool's ``cold_start_s`` — a real cold start the health monitor sees — and
the engine never imports the simulator. Nodes join and leave through :class:`~..fleet_port.FleetPort`:
in a gateway, the live node-admin operations (the path of ``POST /admin/nodes``, drain, remove).

* Scale-up: one node per missing replica, named ``as-<model>-<gpu>-<n>``, labelled with its GPU
  type (``observability.finops.gpu_label``) and ``autoscaler: local``; it joins in ``loading`` and
  takes traffic once its probes pass (slow start).
* Scale-down: only nodes this actuator started are removed, newest first. Each is drained first:
  out of routing at once, then up to ``drain_timeout_s`` for its in-flight requests to finish,
  then removed from the fleet and stopped; one still busy then stays out of routing and is
  removed by a later round once idle (a node is never removed under a request). Configured
  nodes are counted but never stopped: asking below them is a ``partial`` result that says so.
* A failing launch stops that pool's scale-up there; the result says how many are in place.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from inferlb.autoscale.actuator import PoolResult, guard_min
from inferlb.autoscale.fleet_port import FleetPort
from inferlb.autoscale.planner import Plan, PoolDecision
from inferlb.autoscale.planner import pool_price as _pool_price
from inferlb.config.autoscale import AutoscaleConfig
from inferlb.config.settings import NodeConfig
from inferlb.types import Clock

__all__ = ["LaunchedNode", "LocalActuator", "NodeLauncher"]

log = logging.getLogger("inferlb.autoscale")


@dataclass(frozen=True)
class LaunchedNode:
    url: str
    capacity_tokens: int = 32_768
    max_concurrency: int = 64
    kind: str = "sim"


class NodeLauncher(Protocol):
    async def start(self, name: str, model: str, gpu: str, cold_start_s: float) -> LaunchedNode: ...

    async def stop(self, name: str) -> None: ...


class LocalActuator:
    name = "local"

    def __init__(self, cfg: AutoscaleConfig, port: FleetPort, launcher: NodeLauncher, *, clock: Clock,
                 gpu_label: str = "gpu", gpu_prices: dict[str, float] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.cfg = cfg
        self.pools = {(p.model, p.gpu): p for p in cfg.pools}
        self.port = port
        self.launcher = launcher
        self.clock = clock
        self.gpu_label = gpu_label
        self.gpu_prices = dict(gpu_prices or {})
        self.sleep = sleep
        self.started: dict[tuple[str, str], list[str]] = {k: [] for k in self.pools}
        self.draining: list[str] = []      # out of routing, waiting for in-flight requests to end
        self._seq = itertools.count(1)

    def _members(self, key: tuple[str, str]) -> list[str]:
        model, gpu = key
        return [n.name for n in self.port.nodes()
                if model in n.models and n.labels.get(self.gpu_label) == gpu and n.state != "draining"]

    async def current(self) -> dict[tuple[str, str], int]:
        return {k: len(self._members(k)) for k in self.pools}

    async def apply(self, plan: Plan) -> list[PoolResult]:
        await self._reap()     # nodes a past round left draining
        out = []
        for d in plan.changes:
            want = guard_min(d, self.pools)
            have = len(self._members(d.key))
            if want > have:
                out.append(await self._up(d, have, want))
            elif want < have:
                out.append(await self._down(d, have, want))
            else:
                out.append(PoolResult(d.model, d.gpu, d.current, want, have, True, detail="already in place"))
        return out

    async def _up(self, d: PoolDecision, have: int, want: int) -> PoolResult:
        pool = self.pools[d.key]
        added: list[str] = []
        for _ in range(want - have):
            name = f"as-{d.model}-{d.gpu}-{next(self._seq)}"
            try:
                node = await self.launcher.start(name, d.model, d.gpu, pool.cold_start_s)
                await self.port.add_node(NodeConfig(name=name, url=node.url, models=[d.model], kind=node.kind,
                                              capacity_tokens=node.capacity_tokens,
                                              max_concurrency=node.max_concurrency,
                                              labels={self.gpu_label: d.gpu, "autoscaler": "local"}),
                                   price_per_hour=_pool_price(pool, self.gpu_prices))
            except Exception as exc:   # a launch failure is a result, not a crash of the round
                await self._quiet_stop(name)
                after = len(self._members(d.key))
                return PoolResult(d.model, d.gpu, have, want, after, False, f"{type(exc).__name__}: {exc}"[:500],
                                  f"started {len(added)} of {want - have}: {', '.join(added) or 'none'}")
            added.append(name)
            self.started[d.key].append(name)
        return PoolResult(d.model, d.gpu, have, want, len(self._members(d.key)), True,
                          detail=f"started {', '.join(added)} (cold start {pool.cold_start_s:g}s)")

    async def _down(self, d: PoolDecision, have: int, want: int) -> PoolResult:
        ours = [n for n in self.started[d.key] if n in self._members(d.key)]
        victims = list(reversed(ours))[:have - want]
        for name in victims:
            await self.port.begin_drain(name, f"autoscaler scale-down of {d.model}/{d.gpu} to {want}: draining")
            self.started[d.key].remove(name)
            self.draining.append(name)
        deadline = self.clock.monotonic() + self.cfg.actuator.drain_timeout_s
        while any(self.port.inflight(n) for n in victims) and self.clock.monotonic() < deadline:
            await self.sleep(0.05)
        removed = await self._reap()
        after = len(self._members(d.key))
        detail = f"drained and stopped {', '.join(n for n in victims if n in removed) or 'none'}"
        still = [n for n in victims if n not in removed]
        if still:
            detail += f"; still draining (requests in flight, removed in a later round): {', '.join(still)}"
        if after > want:
            return PoolResult(d.model, d.gpu, have, want, after, False,
                              f"{after - want} node(s) of this pool were not started by the local actuator "
                              "(configured nodes are never stopped)", detail)
        return PoolResult(d.model, d.gpu, have, want, after, True, detail=detail)

    async def _reap(self) -> list[str]:
        """Remove and stop every drained node with nothing left in flight (never one still busy). A
        removal the fleet refuses (the database away, the last node of a model) leaves the node
        drained, out of routing, for the next round to retry: the error is logged, not raised."""
        done = []
        for name in [n for n in self.draining if not self.port.inflight(n)]:
            try:
                await self.port.remove_node(name)
            except Exception as exc:
                log.warning("autoscaler: %s stays drained, not removed yet: %s", name, exc)
                continue
            self.draining.remove(name)
            done.append(name)
            await self._quiet_stop(name)
        return done

    async def _quiet_stop(self, name: str) -> None:
        try:
            await self.launcher.stop(name)
        except Exception:   # already gone or never started: nothing left to stop
            return

    async def _quiet_remove(self, name: str) -> None:
        """Shutdown: remove even if requests are in flight (they still finish); a refusal (the last
        node of a model) leaves the node in the fleet, stopped, to be seen and removed by an operator."""
        try:
            await self.port.remove_node(name, force=True)
        except Exception:
            return

    async def close(self) -> None:
        for name in list(self.draining):
            await self._quiet_remove(name)
            await self._quiet_stop(name)
        self.draining.clear()
        for names in self.started.values():
            for name in list(names):
                await self._quiet_remove(name)
                await self._quiet_stop(name)
            names.clear()
