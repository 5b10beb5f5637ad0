"""A request's cost: ONE price resolution and ONE attribution rule.

Used by the gateway (each attempt's charge, summed into the audit row's ``cost_est``, from which
the Prometheus cost counter and the tenant's spend are fed) and by the cost ledger
(:mod:`.store.ledger`, the cost report over the audit rows), so the four agree.

**Price.** :func:`node_prices`: a node's ``price_per_hour``; else the price of its GPU type
(``observability.finops.gpu_prices`` keyed by the node label ``gpu_label``); else 0.

**Rule.** A node's cost at every instant is shared equally among the attempts in flight on it then:
over a stretch where ``k`` attempts overlap, each is charged ``1/k`` of the elapsed seconds.
:class:`Share` keeps the running integral of ``1/k`` over a node's busy time; an attempt's
GPU-seconds are the integral at its end minus the integral at its start. :func:`cost_of` turns
GPU-seconds into money. Pure, no I/O; the time unit is the caller's (seconds in the gateway,
microseconds in the ledger's sweep).
"""

from __future__ import annotations

from collections.abc import Iterable

from inferlb.config.observability import FinOpsConfig
from inferlb.config.settings import NodeConfig

__all__ = ["Share", "cost_of", "node_prices"]


def node_prices(nodes: Iterable[NodeConfig], finops: FinOpsConfig | None = None) -> dict[str, float]:
    """Price per hour of each configured node (see the module docstring)."""
    finops = finops or FinOpsConfig()
    out: dict[str, float] = {}
    for n in nodes:
        gpu = n.labels.get(finops.gpu_label)
        out[n.name] = n.price_per_hour or (finops.gpu_prices.get(gpu, 0.0) if gpu is not None else 0.0)
    return out


def cost_of(gpu_seconds: float, price_per_hour: float) -> float:
    """Money for ``gpu_seconds`` of a node priced ``price_per_hour``."""
    return gpu_seconds * price_per_hour / 3600.0


class Share:
    """One node's equal-share integral: ``integral`` = ∫ 1/k dt over the time ``k`` > 0 attempts
    were in flight, up to :attr:`at`. Times must not go backwards (an earlier time counts as now)."""

    __slots__ = ("at", "integral", "k")

    def __init__(self, at: float = 0.0) -> None:
        self.at = at
        self.integral = 0.0
        self.k = 0

    def advance(self, t: float) -> float:
        """Move to ``t``; returns the idle time (no attempt in flight) that passed."""
        dt = t - self.at
        if dt <= 0:
            return 0.0
        self.at = t
        if self.k > 0:
            self.integral += dt / self.k
            return 0.0
        return dt

    def start(self, t: float) -> float:
        """An attempt starts at ``t``; returns its mark (the integral at its start)."""
        self.advance(t)
        self.k += 1
        return self.integral

    def end(self, t: float, mark: float) -> float:
        """The attempt started with ``mark`` ends at ``t``; returns its share of the node's time."""
        self.advance(t)
        self.k = max(0, self.k - 1)
        return self.integral - mark
