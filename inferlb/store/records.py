"""The audit record handed from the request path to the batched writer.

Plain dataclasses, no SQLAlchemy: the gateway builds them, the writer persists them, the journal
serialises them to JSON lines (``to_json`` / ``from_json`` round-trip exactly).
Timestamps are epoch seconds as floats with µs precision (``round(t, 6)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AttemptRecord", "RequestRecord"]


@dataclass
class AttemptRecord:
    """One try of one request against one node."""

    number: int                       # 1-based
    node: str
    model: str                        # the model asked of the node (differs after a fallback)
    started_at: float                 # epoch s
    ended_at: float | None = None
    outcome: str = "unknown"          # ok | retryable | fatal | midstream_error | client_closed
    http_status: int | None = None
    error_class: str | None = None    # connect_error | timeout | upstream_status | protocol_error ...
    first_byte_at: float | None = None


@dataclass
class RequestRecord:
    """Everything the audit trail keeps about one client request."""

    request_id: str
    received_at: float
    endpoint: str                     # chat | completions | embeddings | predict
    model_requested: str
    tenant: str | None = None
    model_served: str | None = None
    model_version: str | None = None
    node: str | None = None           # the node that produced the final answer
    priority: str | None = None
    stream: bool = False
    status: str = "unknown"           # ok | rejected | rejected_invalid | no_healthy_upstream | upstream_error
                                      # | upstream_error_midstream | client_closed | workflow_error | ...
    http_status: int | None = None
    error_class: str | None = None
    admitted_at: float | None = None
    routed_at: float | None = None
    first_byte_at: float | None = None
    last_byte_at: float | None = None
    prompt_tokens_est: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_est: float | None = None     # currency units: the attempts' equal-share charges (cost.py)
    decision: dict[str, Any] | None = None   # the last routing decision: candidates, eliminations, scores, pick
    # Every routing decision of the request, in order, each with ``"attempt"`` (the number of the
    # attempt it picked the node for; null when it picked none) and ``"model"``.
    decisions: list[dict[str, Any]] = field(default_factory=list)
    deadline_at: float | None = None  # epoch s: when the request's time runs out (evaluate)
    workflow_path: list[str] = field(default_factory=list)  # BPMN element ids in visit order
    tags: dict[str, Any] = field(default_factory=dict)      # set by process scripts (``tags`` data)
    engine: str | None = None         # compiled | spiff
    attempts: list[AttemptRecord] = field(default_factory=list)
    queue_wait_ms: float | None = None   # time spent in the gateway's admission queue (None: never queued)
    # What the request ran on (migration 0005): the request process's content hash and the
    # effective fleet config's hash (file + node overrides), as swapped in by a reload (live/manager.py).
    process_version: str | None = None
    config_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of every field (what ``dataclasses.asdict`` gives, without its deep
        copy: 10× faster, and the journal serialises every record)."""
        d = dict(self.__dict__)
        d["attempts"] = [dict(a.__dict__) for a in self.attempts]
        d["workflow_path"] = list(self.workflow_path)
        return d

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        d = dict(data)
        d["attempts"] = [AttemptRecord(**a) for a in d.get("attempts", [])]
        return cls(**d)

    @property
    def e2e_s(self) -> float | None:
        end = self.last_byte_at
        return None if end is None else end - self.received_at

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_byte_at is None else self.first_byte_at - self.received_at
