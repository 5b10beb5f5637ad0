"""What the admission controller keeps and answers (:mod:`.controller`): the records, no logic of its own.

:class:`Hold` is what one request holds from admission until it ends; :class:`PoolState` is a
model pool's admitted count, queue, service-time EWMA and per-class arrival rates; ``_reject``
builds the *rejected* answer of the ``admission/admit`` service task (HTTP status, OpenAI error,
``Retry-After``). The shared admission of several replicas (cluster/admission.py) uses
them too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from inferlb.admission.queue import PoolQueue, Ticket
from inferlb.config.admission import PriorityClass

__all__ = ["Hold", "PoolState", "_reject"]

_RATE_TAU_S = 5.0       # arrival rates per class decay with this time constant


@dataclass(eq=False)
class Hold:
    """What one request holds from admission until it ends."""

    request_id: str
    pool: str
    cls: PriorityClass
    rank: int
    deadline_at: float
    key_id: str | None = None
    tokens: int = 0                    # TPM taken at admission (0 without a TPM limit)
    rpm: bool = False                  # one RPM unit taken
    admitted_at: float | None = None   # monotonic; set once it holds a slot
    ticket: Ticket | None = None
    queue_wait_s: float = 0.0


@dataclass(eq=False)
class PoolState:
    name: str
    admitted: int = 0
    queue: PoolQueue | None = None
    service_s: float | None = None     # EWMA of admitted → finished for successful requests
    shed: int = 0
    expired: int = 0
    granted_from_queue: int = 0
    rates: dict[int, tuple[float, float]] = field(default_factory=dict)   # rank → (arrivals/s, at)

    def arrive(self, rank: int, now: float) -> None:
        """Count one arrival of class ``rank`` in a decaying rate (time constant ``_RATE_TAU_S``)."""
        rate, at = self.rates.get(rank, (0.0, now))
        self.rates[rank] = (rate * math.exp(-(now - at) / _RATE_TAU_S) + 1.0 / _RATE_TAU_S, now)

    def rate_above(self, rank: int, now: float) -> float:
        """Arrivals per second of the classes above ``rank`` (those that will overtake it)."""
        return sum(r * math.exp(-(now - at) / _RATE_TAU_S) for k, (r, at) in self.rates.items() if k < rank)

    def q(self) -> PoolQueue:
        if self.queue is None:
            self.queue = PoolQueue()
        return self.queue


def _reject(status: int, record_status: str, code: str, etype: str, message: str,
            retry_after: float | None, reason: str) -> dict[str, Any]:
    ra = None if retry_after is None else round(max(1.0, math.ceil(retry_after)), 3)
    return {"admitted": False, "queue": False, "reason": reason, "status": status, "retry_after_s": ra,
            "code": code, "type": etype, "message": message, "record_status": record_status}
