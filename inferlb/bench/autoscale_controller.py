"""The autoscaler as the discrete-event simulation's controller: the gateway's policy object on a DES fleet.

:class:`ScalerController` is a :data:`~inferlb.simulator.des.api.Controller` (called every
``control_every_s`` of virtual time with the :class:`~inferlb.simulator.des.sim.Simulation`). Each call
is one autoscaler round, as ``processes/autoscale.bpmn`` runs it in the gateway
(:mod:`inferlb.autoscale.runner`), with the DES in place of the audit trail and the actuator:

* **observe**: the arrivals' tokens (prompt + output, the unit of the forecasts and the capacity
  model) of :meth:`Simulation.take_window` are summed into steps of ``cfg.step_s``; a step is
  closed at the first round at or after its end. The series handed to
  :meth:`Autoscaler.observe` is the warm-up history (the same workload's earlier days, binned the
  same way, standing for the audit trail a gateway would have) followed by the closed steps,
  cut to the last ``cfg.history_s`` as the gateway's observer reads it.
* **forecast**: :meth:`Autoscaler.forecast` when a step closed (the forecasters are pure
  functions of the history, so between two closes the gateway's per-round forecast is the same
  one: it is kept, not recomputed). A forecast that fell back (too little history, a library
  missing) is counted and its reason kept (:attr:`fallbacks`).
* **burst input** (``LoadHistory.recent``): every round, the tokens/s of the round's own
  arrivals plus the backlog waiting in the nodes' queues (waiting requests × the round's mean
  tokens per request, to be served within one round); the planner's burst path sizes for it in
  this round when it is beyond the replicas in place (:attr:`bursts` counts those rounds).
  ``LoadHistory.routed``: the pool's tokens/s of the last closed step (one pool: a share of 1).
* **plan**: :meth:`Autoscaler.plan` every round, with ``current`` = the pool's nodes that are
  starting or ready (what the local actuator counts: draining nodes are not), and the capacity
  model given (one replica's tokens/s at SLO).
* **actuate**, like the ``local`` actuator (autoscale/actuator_local.py): scale-up adds
  one node per missing replica with :meth:`Simulation.add_node` and the pool's ``cold_start_s``
  (no traffic until ready; GPU time counts from the start); scale-down drains the newest nodes
  first (:meth:`Simulation.drain_node`: no new requests, removed once idle), never below ``min``.
  Nodes of the initial fleet are the autoscaler's too (a backtest has no configured nodes).

Virtual time only: nothing here reads a clock or sleeps. :attr:`rounds` keeps one row per round
(time, observed and forecast load, capacity ready, replicas starting / ready / draining, the
plan's desired), :attr:`events` one row per scaling action.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferlb.autoscale.capacity import Capacity
from inferlb.autoscale.policy import Autoscaler, LoadHistory
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.spec import NodeSpec

__all__ = ["RoundRow", "ScalerController"]


@dataclass(frozen=True, slots=True)
class RoundRow:
    """One round: ``actual`` the last closed step's tokens/s, ``forecast`` the forecast's first step,
    ``capacity`` tokens/s of the ready nodes at SLO."""

    t: float
    actual: float
    forecast: float | None
    method: str | None
    capacity: float
    starting: int
    ready: int
    draining: int
    desired: int


class ScalerController:
    """See the module docstring. ``make_spec(name)`` builds a new replica's node spec; ``warm``: the
    tokens/s per step before the simulation's start (oldest first); ``start``: the simulation's start."""

    def __init__(self, scaler: Autoscaler, *, model: str, gpu: str, capacity_tokens_s: float,
                 make_spec: Callable[[str], NodeSpec], start: float, warm: list[float] | None = None,
                 on_step: Callable[[int], None] | None = None) -> None:
        pools = {(p.model, p.gpu): p for p in scaler.cfg.pools}
        if (model, gpu) not in pools:
            raise ValueError(f"the autoscale config has no pool {model}/{gpu}")
        self.scaler = scaler
        self.pool = pools[(model, gpu)]
        self.model, self.gpu = model, gpu
        self.capacity_tokens_s = capacity_tokens_s
        self.capacity = {(model, gpu): Capacity(model, gpu, capacity_tokens_s, "prior",
                                                "calibrated in the simulation (backtest)")}
        self.make_spec = make_spec
        self.step_s = scaler.cfg.step_s
        self.series: list[float] = list(warm or [])      # tokens/s per closed step, warm-up first
        self.step_end = start + self.step_s
        self._tokens = 0
        self._keep = max(1, math.ceil(scaler.cfg.history_s / self.step_s))
        self.first = 0                                   # index in series of the history's first step
        self.on_step = on_step
        self._seq = 0
        self.ours: list[str] = []                        # starting or ready, oldest first
        self.rounds: list[RoundRow] = []
        self.events: list[dict[str, Any]] = []
        self.fallbacks = 0
        self.fallback_reasons: dict[str, int] = {}
        self.forecasts = 0
        self.bursts = 0
        self._observed = False
        self._recent = 0.0

    # -------------------------------------------------------------- the initial fleet

    def initial(self, now: float, sim: Simulation | None = None) -> list[NodeSpec]:
        """Plan once at ``now`` with nothing in place: the specs of the fleet to start with (ready at
        the start, as a fleet already running would be). With ``sim``, they are added to it instead."""
        self._forecast(now)
        plan = self.scaler.plan(now=now, current={(self.model, self.gpu): 0}, capacity=self.capacity)
        want = plan.desired()[(self.model, self.gpu)]
        specs = [self.make_spec(self._name()) for _ in range(want)]
        self.ours.extend(s.name for s in specs)
        if sim is not None:
            for s in specs:
                sim.add_node(s)
        return specs

    def _name(self) -> str:
        self._seq += 1
        return f"as-{self.model}-{self.gpu}-{self._seq}"

    # -------------------------------------------------------------- one round

    def __call__(self, sim: Simulation) -> None:
        now = sim.now
        w = sim.take_window()
        tokens = w.prompt_tokens + w.output_tokens
        self._tokens += tokens
        span = max(w.end - w.start, 1e-9)
        waiting = sum(n.waiting for n in sim.nodes_info() if n.state == "ready")
        per_request = tokens / w.arrivals if w.arrivals else 0.0
        self._recent = (tokens + waiting * per_request) / span
        closed = False
        while now >= self.step_end - 1e-9:
            # A round every control_every_s (a divisor of step_s): the window ends at the step's end.
            self.series.append(self._tokens / self.step_s)
            self._tokens = 0
            self.step_end += self.step_s
            closed = True
            if self.on_step is not None:
                self.on_step(len(self.series))
        if closed or not self._observed:
            self._forecast(now)
        else:
            self.scaler.observe(self._history(now))
        info = {n.name: n for n in sim.nodes_info()}
        self.ours = [n for n in self.ours if n in info and info[n].state in ("starting", "ready")]
        before = len(self.ours)
        plan = self.scaler.plan(now=now, current={(self.model, self.gpu): before}, capacity=self.capacity)
        want = min(max(plan.desired()[(self.model, self.gpu)], self.pool.min), self.pool.max)
        self.bursts += any(d.burst for d in plan.pools)
        if want > before:
            added = []
            for _ in range(want - before):
                name = self._name()
                sim.add_node(self.make_spec(name), cold_start_s=self.pool.cold_start_s)
                self.ours.append(name)
                added.append(name)
            self.events.append({"t": now, "action": "up", "before": before, "after": want, "nodes": added})
        elif want < before:
            victims = list(reversed(self.ours))[:before - want]     # newest first (starting ones first)
            for name in victims:
                sim.drain_node(name)
                self.ours.remove(name)
            self.events.append({"t": now, "action": "down", "before": before, "after": want, "nodes": victims})
        states = [n.state for n in sim.nodes_info()]
        f = self.scaler.forecasts.get(self.model)
        ready = states.count("ready")
        self.rounds.append(RoundRow(now, self.series[-1] if self.series else 0.0,
                                    f.values[0] if f is not None and f.values else None,
                                    f.method if f is not None else None, ready * self.capacity_tokens_s,
                                    states.count("starting"), ready, states.count("draining"), want))

    def _history(self, now: float) -> LoadHistory:
        last = self.series[-1] if self.series else 0.0
        return LoadHistory(self.step_s, now, {self.model: self.series[self.first:]},
                           recent={self.model: self._recent}, routed={(self.model, self.gpu): last})

    def _forecast(self, now: float) -> None:
        self.first = max(0, len(self.series) - self._keep)
        self.scaler.observe(self._history(now))
        out = self.scaler.forecast()
        self.forecasts += 1
        self._observed = True
        f = out.get(self.model)
        if f is not None and f.fallback is not None:
            self.fallbacks += 1
            key = re.sub(r"\d+", "N", f.fallback)   # one entry per kind of reason
            self.fallback_reasons[key] = self.fallback_reasons.get(key, 0) + 1
