"""What reached an emulated node: the counters tests assert on (``GET /sim/stats``)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_TRACKED_IDS", "NodeStats"]

# Attempt counts are kept per x-request-id; the oldest are forgotten beyond this many ids, so a
# long benchmark cannot grow the node's memory without bound.
MAX_TRACKED_IDS = 100_000


@dataclass
class NodeStats:
    """Counters a test reads to assert what reached the node (``GET /sim/stats`` serves them)."""

    requests_total: int = 0
    by_path: Counter[str] = field(default_factory=Counter)
    attempts: OrderedDict[str, int] = field(default_factory=OrderedDict)  # x-request-id → attempts
    statuses: Counter[int] = field(default_factory=Counter)
    live: int = 0
    max_live: int = 0
    completed: int = 0        # bodies written to the end
    disconnects: int = 0      # handlers ended by the client (or a node stop) going away
    rejected: int = 0         # 429 for max_concurrency
    faults_injected: int = 0
    last_headers: dict[str, str] = field(default_factory=dict)
    last_peer: str = ""       # "ip:port" of the last inference request (shows connection reuse)
    prefill_legs: int = 0     # disaggregated prefill legs answered with kv_transfer_params (simulator/disagg.py)
    decode_legs: int = 0      # disaggregated decode legs (KV pulled from a prefill node)

    def to_json(self) -> dict[str, Any]:
        """The JSON form of ``GET /sim/stats``."""
        return {
            "requests_total": self.requests_total,
            "by_path": dict(self.by_path),
            "attempts": dict(self.attempts),
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "live": self.live,
            "max_live": self.max_live,
            "completed": self.completed,
            "disconnects": self.disconnects,
            "rejected": self.rejected,
            "faults_injected": self.faults_injected,
            "last_headers": dict(self.last_headers),
            "last_peer": self.last_peer,
            "prefill_legs": self.prefill_legs,
            "decode_legs": self.decode_legs,
        }
