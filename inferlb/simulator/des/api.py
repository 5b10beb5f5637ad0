"""What code built on the simulation reads and passes in: the request fields, the hooks, the
controller's view of a node and of a window.

Contract: :class:`RequestLike` is what :class:`~.sim.Simulation` reads of a request
(``PlannedRequest`` has these fields); a :data:`PrefillHook` returns how many prompt tokens a
node already holds for a request; a :data:`Controller` is called with the simulation every
``control_every_s``; :class:`NodeInfo` is a node as a controller sees it; :class:`Window` the
counts between two :meth:`~.sim.Simulation.take_window` calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from inferlb.simulator.des.node import DesNode

if TYPE_CHECKING:   # sim.py imports this module: a runtime import would be a cycle
    from inferlb.simulator.des.sim import Simulation

__all__ = ["Controller", "NodeInfo", "PrefillHook", "RequestLike", "Window"]


class RequestLike(Protocol):
    """What the simulation reads of a request (``PlannedRequest`` has these fields). Optional
    fields, read when present: ``max_tokens`` (what the client declares; None: none),
    ``tenant`` and ``adapter`` (the LoRA adapter it names, :mod:`.lora`). ``output_tokens`` is
    the answer the model writes: only the node's engine reads it."""

    @property
    def t(self) -> float: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def model(self) -> str | None: ...
    @property
    def priority(self) -> str | None: ...
    @property
    def stream(self) -> bool: ...


PrefillHook = Callable[[int, RequestLike, DesNode], int]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node as a controller sees it."""

    name: str
    preset: str | None
    models: frozenset[str]
    state: str
    added_at: float
    ready_at: float
    inflight: int
    waiting: int
    busy_s: float


@dataclass(slots=True)
class Window:
    """What happened between two :meth:`Simulation.take_window` calls (virtual seconds)."""

    start: float
    end: float = 0.0
    arrivals: int = 0
    prompt_tokens: int = 0          # of the arrivals
    output_tokens: int = 0          # of the arrivals: the output budget the gateway counts, not the answers
    completed: int = 0
    rejected: int = 0
    failed: int = 0                 # failed, timeout and no_node
    e2e_sum_s: float = 0.0          # of the completed
    ttft_sum_s: float = 0.0         # of the completed


Controller = Callable[["Simulation"], None]
