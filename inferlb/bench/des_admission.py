"""The gateway's admission rules in a discrete-event run: the real :class:`AdmissionController`.

Contract: :class:`GatewayAdmission` implements :class:`inferlb.simulator.des.admission.Admission` by driving
the gateway's own :class:`~inferlb.admission.controller.AdmissionController` (priority
classes, pool slots, the "hot pool" rule, the bounded priority queue with its expected-wait
shedding and evictions, the service-time EWMA) the way the request process does: ``admit`` per
arrival, ``admit`` again once a queued request's ticket settles (granted, expired, shed),
``release`` when it ends, and the queue *tick* every ``queue.tick_s`` while something waits (as
the admission service's tick loop). Only the environment differs: the pool's nodes are the
simulation's routing views, the clock is the simulation's virtual time, and the request's scope
and record are the few fields the controller reads. Tenant keys (RPM/TPM, spend budgets) are not
used: requests in a plan carry no API key.

It lives in ``bench`` because the simulator may not import the engine's admission package
(tests/test_layering.py); ``bench`` may.
"""

from __future__ import annotations

import math
from typing import Any

from inferlb.admission.controller import AdmissionController
from inferlb.config.admission import AdmissionPolicy
from inferlb.routing.types import NodeView
from inferlb.simulator.des.admission import ADMIT, QUEUE, REJECT, Pools, Verdict
from inferlb.store.records import RequestRecord

__all__ = ["GatewayAdmission"]

_EPOCH = 1_767_225_600.0


class _Clock:
    """The simulation's virtual time as the controller's clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return _EPOCH + self.now


class _Fleet:
    """The two things the controller reads of the fleet."""

    def __init__(self) -> None:
        self.pools: Pools | None = None

    def views(self) -> list[NodeView]:
        raise NotImplementedError("GatewayAdmission reads pools through _views")   # never called

    def inflight_total(self) -> int:
        return self.pools.inflight() if self.pools is not None else 0


class _Record:
    __slots__ = ("admitted_at", "queue_wait_ms", "request_id")

    def __init__(self, rid: str) -> None:
        self.request_id = rid
        self.admitted_at: float | None = None
        self.queue_wait_ms: float | None = None


class _Scope:
    __slots__ = ("deadline_at", "model", "models_tried", "record")

    def __init__(self, rid: str, model: str, deadline_at: float) -> None:
        self.record = _Record(rid)
        self.model = model
        self.models_tried: list[str] = [model]
        self.deadline_at = deadline_at


class _Controller(AdmissionController):
    """The controller with its pool read from the simulation (same rules, no fleet snapshot scan)."""

    sim_pools: Pools | None = None

    def _views(self, pool: str) -> list[NodeView]:
        assert self.sim_pools is not None
        return [v for v in self.sim_pools.views(pool) if v.healthy]


class GatewayAdmission:
    """See the module docstring. ``deadline_s``: the deadline each request carries (as the load
    generator's ``x-inferlb-deadline-ms``); None: its priority class's default."""

    def __init__(self, policy: AdmissionPolicy | None = None, *, max_inflight: int | None = None,
                 deadline_s: float | None = None) -> None:
        self.clock = _Clock()
        self._fleet = _Fleet()
        self.ctl = _Controller(policy or AdmissionPolicy(), self._fleet, self.clock,  # type: ignore[arg-type]
                               max_inflight=max_inflight if max_inflight is not None else 1 << 62)
        self.deadline_s = deadline_s
        self._scopes: dict[int, tuple[_Scope, dict[str, Any]]] = {}
        self._queued: dict[int, _Scope] = {}
        self._next_tick: float | None = None

    def _bind(self, now: float, pools: Pools) -> None:
        self.clock.now = now
        self.ctl.sim_pools = pools
        self._fleet.pools = pools

    def admit(self, i: int, pool: str, priority: str | None, now: float, pools: Pools) -> Verdict:
        self._bind(now, pools)
        cls = self.ctl.policy.cls(priority)
        span = self.deadline_s if self.deadline_s is not None else cls.deadline_s
        scope = _Scope(str(i), pool, now + span if span is not None else math.inf)
        ev = {"priority": priority, "model": pool}
        out = self.ctl.admit(scope, ev, None)
        if out["admitted"]:
            self._scopes[i] = (scope, ev)
            return Verdict(ADMIT)
        if out["queue"]:
            self._scopes[i] = (scope, ev)
            self._queued[i] = scope
            if self._next_tick is None:
                self._next_tick = now + self.ctl.policy.queue.tick_s
            return Verdict(QUEUE, str(out["reason"]))
        self.ctl.holds.pop(str(i), None)
        return Verdict(REJECT, f"{out['status']} {out['reason']}")

    def release(self, i: int, now: float, ok: bool, pools: Pools) -> list[int]:
        self._bind(now, pools)
        self._queued.pop(i, None)
        if self._scopes.pop(i, None) is None:
            return []
        self.ctl.release(RequestRecord(request_id=str(i), received_at=0.0, endpoint="chat", model_requested="",
                                       status="ok" if ok else "upstream_error"))
        return self._settled()[0] if self._queued else []

    def tick(self, now: float, pools: Pools) -> tuple[list[int], list[tuple[int, str]]]:
        self._bind(now, pools)
        self.ctl.tick()
        # a ticket whose wait ran out settles here, as the performer's timeout would expire it
        for scope in self._queued.values():
            hold = self.ctl.holds.get(scope.record.request_id)
            t = hold.ticket if hold is not None else None
            if t is not None and t.state == "queued" and t.wait_until <= now:
                q = self.ctl.pools[t.pool].queue
                if q is not None:
                    q.settle(t, "expired", now)
        granted, rejected = self._settled()
        self._next_tick = now + self.ctl.policy.queue.tick_s if self._queued else None
        return granted, rejected

    def next_timer(self) -> float | None:
        return self._next_tick

    def _settled(self) -> tuple[list[int], list[tuple[int, str]]]:
        """Queued requests whose ticket settled: ``admit`` again, as the process does after the wait."""
        granted: list[int] = []
        rejected: list[tuple[int, str]] = []
        for i, scope in list(self._queued.items()):
            hold = self.ctl.holds.get(scope.record.request_id)
            t = hold.ticket if hold is not None else None
            if t is not None and t.state == "queued":
                continue
            del self._queued[i]
            _, ev = self._scopes[i]
            out = self.ctl.admit(scope, ev, None)
            if out["admitted"]:
                granted.append(i)
            else:
                self.ctl.holds.pop(str(i), None)
                self._scopes.pop(i, None)
                rejected.append((i, f"{out['status']} {out['reason']}"))
        return granted, rejected
