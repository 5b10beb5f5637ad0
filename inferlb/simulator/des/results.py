"""Per-request results of a discrete-event run, as columns, and the fleet's node table.

Contract: :class:`DesResults` holds one row per request of the plan, in arrival order (row ``i``
is the plan's request ``i``), as typed :mod:`array` columns (1 M rows take ~60 MB), so metrics
code reads whole columns; :meth:`DesResults.rows` yields :class:`DesOutcome` tuples for code that
wants records. Times are virtual seconds: ``t`` from the start of the run, ``ttft`` / ``e2e`` /
``queue`` from the request's arrival at the gateway (so the gateway queue is in them). A value
that does not apply is NaN (the TTFT of a request that never got a token). ``outcome`` is an index
into :data:`OUTCOMES`:

- ``ok``: every token came;
- ``rejected``: admission turned it away (shed, queue wait over, gateway cap);
- ``no_node``: routing found no node that may serve it (the gateway's 503);
- ``failed``: the node lost it (OOM crash, removed while it ran, context over the KV cache);
- ``timeout``: the client gave up after the workload's ``timeout_s`` (the node aborts it).

:class:`NodeRecord` is one node's life in the run (added, ready, removed, requests served, busy
seconds), the source of GPU-hours and cost.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["OUTCOMES", "DesOutcome", "DesResults", "NodeRecord"]

OUTCOMES = ("ok", "rejected", "no_node", "failed", "timeout")
OK, REJECTED, NO_NODE, FAILED, TIMEOUT = range(5)
_NAN = math.nan


class DesOutcome(NamedTuple):
    """One request: arrival ``t``; ``node`` that served it (None if none); times from arrival."""

    i: int
    t: float
    prompt_tokens: int
    output_tokens: int
    stream: bool
    priority: str | None
    node: str | None
    ttft: float | None
    e2e: float | None
    queue: float
    tokens: int
    outcome: str
    reason: str | None


@dataclass
class NodeRecord:
    """One node's life in a run (virtual seconds)."""

    name: str
    preset: str | None
    gpu: str
    added_at: float
    ready_at: float
    removed_at: float | None = None
    requests: int = 0
    busy_s: float = 0.0
    preemptions: int = 0

    def up_s(self, end: float) -> float:
        """Seconds it was held (cold start included) until ``end`` or its removal."""
        stop = self.removed_at if self.removed_at is not None else end
        return max(0.0, stop - self.added_at)


class DesResults:
    """The columns (see the module docstring). Filled by the simulation; read by anyone."""

    def __init__(self) -> None:
        self.t = array("d")
        self.prompt_tokens = array("l")
        self.output_tokens = array("l")     # the answer the node writes (cut at a declared max_tokens)
        self.stream = array("b")
        self.priority = array("h")          # index into ``priorities``; -1: none
        self.node = array("l")              # index into ``nodes``; -1: none
        self.ttft = array("d")
        self.e2e = array("d")
        self.queue = array("d")
        self.tokens = array("l")
        self.outcome = array("b")           # index into OUTCOMES; -1 while in flight
        self.priorities: list[str] = []
        self.nodes: list[NodeRecord] = []
        self.reasons: dict[int, str] = {}   # row → why, for rows that are not ok
        self.end_s = 0.0                    # virtual time when the run ended

    def __len__(self) -> int:
        return len(self.t)

    def _prio(self, name: str | None) -> int:
        if name is None:
            return -1
        try:
            return self.priorities.index(name)
        except ValueError:
            self.priorities.append(name)
            return len(self.priorities) - 1

    def add(self, t: float, prompt_tokens: int, output_tokens: int, stream: bool, priority: str | None) -> int:
        """A new row (in flight); returns its index."""
        self.t.append(t)
        self.prompt_tokens.append(prompt_tokens)
        self.output_tokens.append(output_tokens)
        self.stream.append(stream)
        self.priority.append(-1 if priority is None else self._prio(priority))
        self.node.append(-1)
        self.ttft.append(_NAN)
        self.e2e.append(_NAN)
        self.queue.append(0.0)
        self.tokens.append(0)
        self.outcome.append(-1)
        return len(self.t) - 1

    def finish(self, i: int, outcome: int, *, node: int = -1, ttft: float = _NAN, e2e: float = _NAN,
               tokens: int = 0, reason: str | None = None) -> None:
        self.outcome[i] = outcome
        self.node[i] = node
        self.ttft[i] = ttft
        self.e2e[i] = e2e
        self.tokens[i] = tokens
        if reason is not None:
            self.reasons[i] = reason

    def rows(self) -> Iterator[DesOutcome]:
        """Every request as a :class:`DesOutcome` (rows still in flight have outcome ``"pending"``)."""
        names = [n.name for n in self.nodes]
        prios = self.priorities
        for i in range(len(self.t)):
            o = self.outcome[i]
            ttft, e2e, node, p = self.ttft[i], self.e2e[i], self.node[i], self.priority[i]
            yield DesOutcome(i, self.t[i], self.prompt_tokens[i], self.output_tokens[i], bool(self.stream[i]),
                             prios[p] if p >= 0 else None, names[node] if node >= 0 else None,
                             None if math.isnan(ttft) else ttft, None if math.isnan(e2e) else e2e,
                             self.queue[i], self.tokens[i], OUTCOMES[o] if o >= 0 else "pending",
                             self.reasons.get(i))

    def counts(self) -> dict[str, int]:
        """Requests per outcome."""
        out = dict.fromkeys(OUTCOMES, 0)
        for code in range(len(OUTCOMES)):
            out[OUTCOMES[code]] = self.outcome.count(code)
        pending = self.outcome.count(-1)
        if pending:
            out["pending"] = pending
        return out

    def gpu_hours(self) -> dict[str, float]:
        """GPU-hours held per preset (or GPU name), cold starts included, up to ``end_s``."""
        out: dict[str, float] = {}
        for n in self.nodes:
            key = n.preset or n.gpu
            out[key] = out.get(key, 0.0) + n.up_s(self.end_s) / 3600.0
        return out
