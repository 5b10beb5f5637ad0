"""One node's live state as the gateway sees it: :class:`NodeState`, kept by :class:`~inferlb.fleet.state.Fleet`.

A plain mutable record: the gateway's counters, the health state machine's fields (moved only by
:meth:`Fleet.transition <inferlb.fleet.state.Fleet.transition>`), the cost share, probe and metric
samples, the outlier interval's measures. Every attribute set that the routing view reads tells the
owning fleet, so its routing snapshot rebuilds this node's view, or only patches its in-flight counts
(:data:`COUNT_FIELDS`); a set of a field the view does not read (:data:`VIEW_BLIND`) tells nobody
(see :meth:`Fleet.views <inferlb.fleet.state.Fleet.views>`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from inferlb.config.settings import NodeConfig
from inferlb.cost import Share
from inferlb.node_types import Sample

if TYPE_CHECKING:
    from inferlb.fleet.state import Fleet

__all__ = ["COUNT_FIELDS", "VIEW_BLIND", "NodeState"]

# The routing view (Fleet._view) reads none of these fields: setting one leaves the node's view as
# it is. tests/fleet/test_views_incremental.py checks each of them against a full rebuild.
VIEW_BLIND = frozenset({
    "requests_total", "failures_total", "since", "since_wall", "consecutive_failures", "backoff",
    "ejected_until", "price_per_hour", "share", "half_open_successes", "probe_failures",
    "probe_successes", "hw_baseline", "hw_findings", "hw_at", "iv_requests", "iv_successes", "iv_ttft",
    "iv_tpot", "ttft_baseline", "ttft_intervals", "tpot_baseline", "tpot_intervals", "held", "retired",
})
# The view copies these as they are (the in-flight counts, and the speed estimates every answer
# updates): setting one patches those fields of the view (Fleet._patch), no rebuild.
COUNT_FIELDS = frozenset({"inflight_requests", "inflight_tokens", "tokens_per_s", "ttft_ewma"})


@dataclass
class NodeState:
    cfg: NodeConfig
    inflight_requests: int = 0
    inflight_tokens: int = 0
    requests_total: int = 0
    failures_total: int = 0
    tokens_per_s: float | None = None
    # the state machine
    state: str = "healthy"
    since: float = 0.0                    # monotonic
    since_wall: float = 0.0
    reason: str = "configured"
    evidence: dict[str, Any] = field(default_factory=dict)
    consecutive_failures: int = 0
    ejections: int = 0                    # total, never decreases (a counter for metrics)
    backoff: int = 0                      # ejections in a row: Envoy's ejection-time multiplier
    ejected_until: float = 0.0
    hardware_fault: bool = False          # ejected for a GPU fault: never offered in panic mode
    cooldown_until: float = 0.0
    # cost (cost.py): the resolved price and the equal-share integral, on the wall clock
    price_per_hour: float = 0.0
    share: Share = field(default_factory=Share)
    slow_start_at: float | None = None
    half_open_successes: int = 0
    # active probes and samples
    probe_failures: int = 0
    probe_successes: int = 0
    samples: dict[str, Sample] = field(default_factory=dict)    # the last one per source
    load: Sample | None = None            # the last good metrics sample
    hw_baseline: dict[str, Any] | None = None
    hw_findings: list[dict[str, Any]] = field(default_factory=list)
    hw_at: float | None = None            # when the last good GPU report was taken
    # this outlier interval; two latency measures, never mixed (fleet/rules.py: latency_outliers)
    iv_requests: int = 0
    iv_successes: int = 0
    iv_ttft: list[float] = field(default_factory=list)   # streamed: time to first token (s)
    iv_tpot: list[float] = field(default_factory=list)   # non-streamed: time per output token (s)
    ttft_baseline: float | None = None
    ttft_intervals: int = 0               # intervals that taught ttft_baseline
    tpot_baseline: float | None = None
    tpot_intervals: int = 0
    ttft_ewma: float | None = None        # streamed TTFT, the prefill estimate for non-streamed answers
    # live admin (live/fleet_admin.py): held out by an operator's drain (the sweeps leave it alone);
    # retired: removed from the fleet, kept until its requests in flight are done
    held: bool = False
    retired: bool = False
    rtt_ms: float | None = None           # EWMA of the readiness probe's time (health/isolation.py: observe)
    # LoRA adapters that failed to load here → monotonic time their cool-down ends (Fleet.adapter_failed)
    lora_failed: dict[str, float] = field(default_factory=dict)

    # The fleet that caches this node's routing view: told of every attribute set (see Fleet.views).
    _owner: ClassVar[Fleet | None] = None

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        owner = self._owner
        if owner is not None and name not in VIEW_BLIND:
            if name in COUNT_FIELDS:
                owner._counts.add(self.cfg.name)
            elif name == "state":
                owner._rebuild_all = True   # panic mode reads every node's state
            else:
                owner._dirty.add(self.cfg.name)

    def unhealthy_reason(self, now: float) -> str | None:
        """Why routing skips this node now (None: it takes traffic). The text does not change with
        time alone, so a routing snapshot holds it until the node's state changes; the timers
        themselves are in :meth:`Fleet.describe`."""
        if now < self.cooldown_until:
            return "cooling down after a 429 (Retry-After)"
        s = self.state
        if s in ("healthy", "half_open", "cooldown"):
            return None
        if s == "ejected":
            length = self.evidence.get("ejection_s")
            span = f"for {length:g}s " if isinstance(length, int | float) else ""
            return f"ejected {span}after {self.ejections} ejection(s): {self.reason}"
        return f"{s}: {self.reason}"
