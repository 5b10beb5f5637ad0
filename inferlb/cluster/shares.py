"""This replica's share of every cluster-wide limit, as the last sync (or an outage) left it.

Pure bookkeeping, no I/O: the cluster service fills it from :data:`~.lua.SYNC_LUA`'s answers and
the shared admission controller reads it on the request path (a dict look-up).

Contract:

* A *resource* is ``pool:<model>`` (the pool's concurrency slots) or ``key:<id>`` (a key's
  ``max_parallel``). :meth:`SlotShares.quota` is how many of it this replica may hold now: the grant
  of the last sync; before the first sync, or once Redis has been away for longer than the last
  grants' lease (:attr:`degraded`, set by the cluster service), its *fallback share* ``max(1,
  floor(limit / replicas))`` with the replica count last seen — the issue's "each replica falls back
  to its share of the limits".
* While a sync is in flight (:meth:`SlotShares.reported_in_use` until :meth:`SlotShares.answered`),
  the quota of every resource it reported is at most what it reported in use: the script may
  lower the grant to that and record it for the other replicas to count, so a slot taken on the
  old grant before the answer is read would be held outside every recorded grant (the others
  could be granted it too). A slot freed meanwhile may be taken again. Not while
  :attr:`~SlotShares.degraded`: the fallback share is not a recorded grant (see the module
  docstring of :mod:`.service` for what Redis away guarantees).
* :meth:`short` records that a request found the quota too small while the limit itself had
  room: the demand the next sync reports, and a reason to sync now (``on_short``).
* :class:`RetryShare` is one pool's retry budget as the cluster sees it: each sync *claims* a
  part of what the window leaves, sized by this replica's recent need (one when idle; counted in
  Redis at once, so the claims of all replicas never pass the budget) and gives back the unspent
  rest of the last claim; a retry is granted while the claim lasts, and the claim running low
  (or a refusal) asks for a sync at once. While
  Redis is away the local window decides, with the ``min_retries`` floor divided by the replica
  count, and those retries are reported when it returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["RetryShare", "SlotShares"]


@dataclass
class RetryShare:
    """One pool's shared retry budget (see the module docstring)."""

    requests: int = 0            # in the window, all replicas, at the last sync (claims included)
    retries: int = 0
    d_requests: int = 0          # admitted here since the last sync (sent by the next one)
    d_extra: int = 0             # retries made here outside a claim (Redis away), sent by the next sync
    part: int = 0                # the retries this replica claimed at its last sync
    spent: int = 0               # of which spent
    synced: bool = False

    denied: int = 0              # retries refused here since the last sync (demand)

    def take_report(self) -> tuple[int, int, int]:
        """``(requests, retry correction, claim wanted)`` for a sync: the correction is the retries
        made outside a claim minus the unspent claim, which is given back; the claim wanted is one
        (an idle replica holds one retry for an isolated failure) plus twice what was spent or
        refused since the last sync. No retry is granted until the answer."""
        report = (self.d_requests, self.d_extra - (self.part - self.spent),
                  1 + 2 * (self.spent + self.d_extra + self.denied))
        self.d_requests = self.d_extra = self.denied = 0
        self.part = self.spent
        return report

    def put_back(self, report: tuple[int, int, int]) -> None:
        """The sync failed: what it would have reported is reported by the next one."""
        self.d_requests += report[0]
        self.d_extra += report[1] + (self.part - self.spent)
        self.part = self.spent

    def claimed(self, requests: int, retries: int, part: int) -> None:
        self.requests, self.retries = requests, retries
        self.part, self.spent = part, 0
        self.synced = True


@dataclass
class SlotShares:
    """Grants per resource; see the module docstring."""

    replicas: int = 1                       # live replicas at the last sync (≥ 1)
    degraded: bool = True                   # no successful sync yet, or Redis away past the lease
    grants: dict[str, int] = field(default_factory=dict)
    targets: dict[str, int] = field(default_factory=dict)
    shortfall: dict[str, int] = field(default_factory=dict)   # refusals since the last sync
    reported: dict[str, int] = field(default_factory=dict)    # demand sent at the last sync
    retry: dict[str, RetryShare] = field(default_factory=dict)
    on_short: Callable[[], None] | None = None
    # Set by the sync that reported nothing in use, no demand and no request (and so renewed with
    # the idle lease, service.py): the first request admitted after it calls ``on_busy``.
    idle: bool = False
    on_busy: Callable[[], None] | None = None
    in_flight: dict[str, int] | None = None   # in use as reported by the sync in flight, if any

    def reported_in_use(self, in_use: dict[str, int]) -> None:
        """A sync took its report (``resource → in use here``): hold each quota to it until
        :meth:`answered`."""
        self.in_flight = in_use

    def answered(self) -> None:
        """The sync in flight ended (answer applied, failed or cancelled): quotas are the grants again."""
        self.in_flight = None

    def fallback(self, limit: float) -> int:
        """Each replica's share of ``limit`` while it cannot ask Redis (at least one)."""
        return max(1, math.floor(limit / max(1, self.replicas)))

    def quota(self, resource: str, limit: float) -> int:
        """How many of ``resource`` (cluster-wide ``limit``) this replica may hold now."""
        if self.degraded:
            return self.fallback(limit)
        g = self.grants.get(resource)
        q = self.fallback(limit) if g is None else min(g, math.floor(limit))
        if self.in_flight is not None:
            held = self.in_flight.get(resource)
            if held is not None:
                q = min(q, held)    # the answer may lower the grant to this (see the module docstring)
        return q

    def short(self, resource: str, demand: int) -> None:
        """A request found the quota of ``resource`` too small; ``demand`` is what this replica
        wants now (in use + waiting). Wakes the sync when that is more than it last reported."""
        self.shortfall[resource] = self.shortfall.get(resource, 0) + 1
        if demand > self.reported.get(resource, 0) and self.on_short is not None:
            self.on_short()

    def busy(self) -> None:
        """A request was admitted here: if the last sync called this replica idle, it is not any
        more (``on_busy``: the sync loop goes back to its normal renewal)."""
        if self.idle:
            self.idle = False
            if self.on_busy is not None:
                self.on_busy()

    def wants_more(self) -> bool:
        """Whether some resource's fair target is above its grant (another replica must give back)."""
        return any(self.targets.get(r, 0) > g for r, g in self.grants.items())

    def retry_of(self, pool: str) -> RetryShare:
        rs = self.retry.get(pool)
        if rs is None:
            rs = self.retry[pool] = RetryShare()
        return rs
