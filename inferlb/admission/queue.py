"""The bounded gateway queue of one model pool: ordered by priority class, then deadline.

Contract:

* A :class:`Ticket` is one waiting request. It settles exactly once, to ``granted`` (a slot was
  handed to it), ``expired`` (its wait ran out), ``shed`` (evicted for a higher class) or
  ``cancelled`` (the request ended while waiting); :meth:`Ticket.settle` records when and wakes
  the coroutine waiting on it, if any. The asyncio event is made lazily, only by a waiter, so the
  queue itself works without an event loop (unit tests and the process harness drive it
  synchronously).
* :meth:`PoolQueue.pop_best` returns the queued ticket with the lowest (rank, deadline, arrival);
  :meth:`PoolQueue.worst` the one to shed first: the lowest class, latest deadline, newest.
  :meth:`PoolQueue.expire_due` settles every ticket whose wait ended by ``now``.
* Removal is lazy (settled tickets stay in the heaps until they surface); the heaps are rebuilt
  when dead entries outnumber live ones, so memory stays proportional to the queue's bound.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["PoolQueue", "Ticket"]


@dataclass(eq=False)
class Ticket:
    request_id: str
    pool: str
    rank: int
    deadline_at: float              # monotonic: the request's deadline
    wait_until: float               # monotonic: when its queue wait ends
    enqueued_at: float
    seq: int
    state: str = "queued"           # queued | granted | expired | shed | cancelled
    settled_at: float | None = None
    _event: asyncio.Event | None = field(default=None, repr=False)

    def event(self) -> asyncio.Event:
        """The event a waiter awaits; already set when the ticket has settled."""
        if self._event is None:
            self._event = asyncio.Event()
            if self.state != "queued":
                self._event.set()
        return self._event

    def settle(self, state: str, now: float) -> bool:
        """Settle once; False (nothing changes) when it already has."""
        if self.state != "queued":
            return False
        self.state = state
        self.settled_at = now
        if self._event is not None:
            self._event.set()
        return True

    @property
    def waited_s(self) -> float:
        return max(0.0, (self.settled_at if self.settled_at is not None else self.enqueued_at) - self.enqueued_at)


class PoolQueue:
    """One pool's waiting tickets."""

    def __init__(self) -> None:
        self._order: list[tuple[int, float, int, Ticket]] = []
        self._expiry: list[tuple[float, int, Ticket]] = []
        self._by_rank: Counter[int] = Counter()
        self.live = 0

    def __len__(self) -> int:
        return self.live

    def push(self, t: Ticket) -> None:
        heapq.heappush(self._order, (t.rank, t.deadline_at, t.seq, t))
        heapq.heappush(self._expiry, (t.wait_until, t.seq, t))
        self._by_rank[t.rank] += 1
        self.live += 1

    def ahead(self, rank: int) -> int:
        """Tickets a new ticket of ``rank`` would wait behind (same or higher class)."""
        return sum(n for r, n in self._by_rank.items() if r <= rank)

    def settle(self, t: Ticket, state: str, now: float) -> bool:
        if not t.settle(state, now):
            return False
        self._by_rank[t.rank] -= 1
        self.live -= 1
        self._compact()
        return True

    def pop_best(self) -> Ticket | None:
        """The best queued ticket, removed from the order heap (still ``queued``: the caller settles it)."""
        while self._order:
            t = heapq.heappop(self._order)[3]
            if t.state == "queued":
                return t
        return None

    def push_back(self, t: Ticket) -> None:
        """Undo :meth:`pop_best` for a ticket the caller did not settle."""
        heapq.heappush(self._order, (t.rank, t.deadline_at, t.seq, t))

    def worst(self) -> Ticket | None:
        live = [e for e in self._order if e[3].state == "queued"]
        if not live:
            return None
        return max(live, key=lambda e: (e[0], e[1], e[2]))[3]

    def expire_due(self, now: float) -> list[Ticket]:
        out: list[Ticket] = []
        while self._expiry and self._expiry[0][0] <= now:
            t = heapq.heappop(self._expiry)[2]
            if self.settle(t, "expired", now):
                out.append(t)
        return out

    def in_order(self) -> list[Ticket]:
        """Queued tickets, best first."""
        return [e[3] for e in sorted(e for e in self._order if e[3].state == "queued")]

    def oldest_enqueued(self) -> float | None:
        live = [e[3].enqueued_at for e in self._order if e[3].state == "queued"]
        return min(live) if live else None

    def _compact(self) -> None:
        if len(self._order) > 2 * self.live + 64:
            self._order = [e for e in self._order if e[3].state == "queued"]
            heapq.heapify(self._order)
        if len(self._expiry) > 2 * self.live + 64:
            self._expiry = [e for e in self._expiry if e[2].state == "queued"]
            heapq.heapify(self._expiry)
