"""How a discrete-event run asks the gateway's admission rules about a request.

Contract: the simulation calls :meth:`Admission.admit` for every arrival, :meth:`Admission.release`
once for every request admitted or queued when it ends (whatever the outcome; a queued request
whose client gave up included), and :meth:`Admission.tick` at :meth:`Admission.next_timer`.
``admit`` answers :data:`ADMIT`, :data:`QUEUE` (the request waits in the gateway queue; a later
``release`` or ``tick`` grants it) or :data:`REJECT` with a reason. Rows granted from the queue
are returned by ``release`` / ``tick`` and dispatched by the simulation at once; ``tick`` also
returns the queued rows it turns away (wait over, shed), which end ``rejected``.
Implementations read the pool through :class:`Pools` and must be deterministic (no clock: ``now``
is passed).

:class:`OpenAdmission` is the gateway with ``admission.enabled: false``: only the gateway-wide
cap on requests in flight. The gateway's own rules (priority classes, pool slots, the bounded
queue, shedding) are :class:`inferlb.bench.des.admission.GatewayAdmission`, built on
``inferlb.admission`` (which the simulator may not import: tests/test_layering.py).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from inferlb.routing.types import NodeView

__all__ = ["ADMIT", "QUEUE", "REJECT", "Admission", "OpenAdmission", "Pools", "Verdict"]

ADMIT, QUEUE, REJECT = 0, 1, 2


class Verdict(NamedTuple):
    kind: int
    reason: str = ""


_ADMITTED = Verdict(ADMIT)


class Pools(Protocol):
    """The simulation's model pools as admission sees them."""

    def slots(self, pool: str) -> int:
        """Σ ``max_concurrency`` of the routable nodes serving ``pool``."""
        ...

    def views(self, pool: str) -> list[NodeView]:
        """The routing views of the nodes configured for ``pool`` (unhealthy ones included)."""
        ...

    def inflight(self) -> int:
        """Requests admitted and not ended, all pools."""
        ...


class Admission(Protocol):
    def admit(self, i: int, pool: str, priority: str | None, now: float, pools: Pools) -> Verdict: ...

    def release(self, i: int, now: float, ok: bool, pools: Pools) -> list[int]: ...

    def tick(self, now: float, pools: Pools) -> tuple[list[int], list[tuple[int, str]]]: ...

    def next_timer(self) -> float | None: ...


class OpenAdmission:
    """Admission off: every request is admitted while fewer than ``max_inflight`` are in flight
    (None: no cap), as ``AdmissionController.admit`` with ``enabled: false``."""

    def __init__(self, max_inflight: int | None = None) -> None:
        self.max_inflight = max_inflight

    def admit(self, i: int, pool: str, priority: str | None, now: float, pools: Pools) -> Verdict:
        cap = self.max_inflight
        if cap is not None and pools.inflight() >= cap:
            return Verdict(REJECT, f"{pools.inflight()} requests in flight (cap {cap})")
        return _ADMITTED

    def release(self, i: int, now: float, ok: bool, pools: Pools) -> list[int]:
        return []

    def tick(self, now: float, pools: Pools) -> tuple[list[int], list[tuple[int, str]]]:
        return [], []

    def next_timer(self) -> float | None:
        return None
