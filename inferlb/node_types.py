"""Health vocabulary: samples (what a source saw, with its age) and node events (state changes).

Contracts:

* A :class:`Sample` is data, never an exception: a node that refuses, times out or sends garbage
  yields ``ok=False`` with an ``error`` string. ``taken_at`` is on the monotonic clock (ages),
  ``wall_at`` is epoch seconds (display). ``values`` holds what the source parsed, by source:

  - ``probe``: ``{"loading": bool}`` (a 503 from the readiness path means "loading");
  - ``metrics``: ``{"running", "waiting", "kv_usage"}`` (numbers or None) and ``format``;
  - ``agent`` / ``dcgm``: ``{"nvml", "reason", "gpus": [...], "xid_events": [...], "boot_id"}``
    (the node agent's report shape; a DCGM scrape is converted to it).

* A :class:`NodeEvent` is one state change of one node: ``from_state`` → ``to_state`` with a
  human ``reason`` and JSON ``evidence``; ``at`` is epoch seconds. They are the audit trail of
  health decisions (table ``node_events``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["NODE_STATES", "SOURCES", "NodeEvent", "Sample"]

# healthy: takes traffic (maybe in slow start); cooldown: 429 Retry-After; ejected: passive outlier
# or hardware fault, timed; half_open: circuit trial requests only; down: active probes fail;
# loading: the server says it is loading (503 on its readiness path), or it was just added and
# waits for its first good probes; draining: GPU throttling, or an operator's drain / removal with
# requests still in flight (live/fleet_admin.py); drained: an operator's drain with none left.
# ``removed`` is only ever the target of an event: the node is gone from the fleet.
NODE_STATES = ("healthy", "cooldown", "ejected", "half_open", "down", "loading", "draining", "drained")
SOURCES = ("probe", "metrics", "agent", "dcgm")


@dataclass(frozen=True, slots=True)
class Sample:
    node: str
    source: str
    ok: bool
    taken_at: float
    wall_at: float
    latency_ms: float = 0.0
    status: int | None = None
    error: str | None = None
    values: dict[str, Any] = field(default_factory=dict)

    def age(self, now: float) -> float:
        return max(0.0, now - self.taken_at)

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "source": self.source, "ok": self.ok, "taken_at": self.taken_at,
                "wall_at": self.wall_at, "latency_ms": round(self.latency_ms, 3), "status": self.status,
                "error": self.error, "values": self.values}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Sample:
        return cls(node=str(d["node"]), source=str(d["source"]), ok=bool(d["ok"]), taken_at=float(d["taken_at"]),
                   wall_at=float(d.get("wall_at", 0.0)), latency_ms=float(d.get("latency_ms", 0.0)),
                   status=d.get("status"), error=d.get("error"), values=dict(d.get("values") or {}))


@dataclass(frozen=True, slots=True)
class NodeEvent:
    node: str
    from_state: str | None
    to_state: str
    reason: str
    at: float
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "from": self.from_state, "to": self.to_state, "reason": self.reason,
                "at": self.at, "evidence": self.evidence}
