"""Closed-loop sessions in the discrete-event simulation: a session's next turn leaves when the
client has the previous turn's answer, plus a think time, as a chat user sends it.

Contract:

* A :class:`Session` is a start time, its turns (requests with the :class:`~.api.RequestLike`
  fields, as dataclass instances: ``PlannedRequest`` of :mod:`inferlb.bench.loadgen.workload`;
  their own ``t`` is ignored) and its think times (``think_s[k]`` separates the end of turn ``k``'s
  answer from turn ``k + 1``; extra ones are ignored). The sessions, think times included, are the
  plan: drawn before the run, so every profile replays the same ones.
* :meth:`ClosedLoop.run_sessions`: each session's first turn arrives at its ``start`` (the
  sessions arrive open loop, so the offered session rate does not depend on the routing); turn
  ``k + 1`` arrives at ``end_k + think_s[k]`` (never earlier than the event that released it, so a
  float rounding cannot put it in the past), where ``end_k`` is when the client saw turn ``k``'s
  last token (its arrival + e2e: the node's network delay included). A turn is therefore never
  sent before its previous answer has ended, and the node that served it has already cached the
  answer (:class:`~.prefix.PrefixCaches` inserts it when the row leaves the node, before any later
  arrival is handled).
* A turn that does not end ``ok`` (``rejected``, ``no_node``, ``failed``, ``timeout``) ends its
  session: the user leaves rather than retries (the DES models no client retries elsewhere either);
  its later turns are counted in :attr:`ClosedLoop.abandoned`. With ``stop_s``, a turn due at or
  after it is not sent (the arrival window, as an open-loop plan is cut), counted in
  :attr:`ClosedLoop.cut`; neither is a row of the results.
* Rows are in arrival order: :attr:`ClosedLoop.requests` ``[i]`` is row ``i``'s request (its ``t``
  the arrival), :attr:`ClosedLoop.turn_of` ``[i]`` its (session index, turn index). The same
  sessions and seed give the same run, on any machine.
* Everything else is :class:`~.sim.Simulation`'s (admission, routing, hooks, ties: node events at
  ``t`` before an arrival at ``t``); its open-loop :meth:`~.sim.Simulation.run` is untouched by this
  module. A session whose turns all release open loop at the same times as a plan's requests (one
  turn each) gives the same results as ``run`` on that plan.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from inferlb.simulator.des.results import OK, DesResults
from inferlb.simulator.des.sim import Simulation

__all__ = ["ClosedLoop", "Session"]


@dataclass(frozen=True, slots=True)
class Session:
    """One user's conversation: when it starts, its turns, the think time after each answer."""

    start: float
    turns: Sequence[Any]
    think_s: Sequence[float]


class _EndHookResults(DesResults):
    """The results columns, telling ``on_end(row, outcome)`` as each row ends (every end of a row
    goes through :meth:`DesResults.finish`, exactly once: the lifecycle's contract)."""

    def __init__(self, on_end: Callable[[int, int], None]) -> None:
        super().__init__()
        self._on_end = on_end

    def finish(self, i: int, outcome: int, *, node: int = -1, ttft: float = math.nan, e2e: float = math.nan,
               tokens: int = 0, reason: str | None = None) -> None:
        super().finish(i, outcome, node=node, ttft=ttft, e2e=e2e, tokens=tokens, reason=reason)
        self._on_end(i, outcome)


class ClosedLoop(Simulation):
    """A :class:`~.sim.Simulation` that also runs closed-loop sessions; see the module docstring.
    Takes :class:`~.sim.Simulation`'s arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        hooked = _EndHookResults(self._ended)
        hooked.nodes = self.results.nodes      # the initial fleet was recorded while building
        self.results = hooked
        self.requests: list[Any] = []
        self.turn_of: list[tuple[int, int]] = []
        self.abandoned = 0
        self.cut = 0
        self._sessions: Sequence[Session] = ()
        self._pending: list[tuple[float, int, int]] = []     # (due, session, turn): the release heap
        self._stop = math.inf

    def run_sessions(self, sessions: Iterable[Session], *, stop_s: float | None = None,
                     until: float | None = None) -> DesResults:
        """Every session's turns as they are released, then the drain (until nothing is in flight,
        or virtual time ``until``). ``stop_s``: no turn is sent at or after it."""
        self._sessions = list(sessions)
        self._stop = math.inf if stop_s is None else stop_s
        self._pending = [(s.start, k, 0) for k, s in enumerate(self._sessions) if s.turns and s.start < self._stop]
        self.cut += sum(len(s.turns) for s in self._sessions if s.turns and s.start >= self._stop)
        heapq.heapify(self._pending)
        limit = math.inf if until is None else until
        pending = self._pending
        last = -math.inf
        while True:  # bounded: each pass handles an event or releases a turn; turns are finite
            at = pending[0][0] if pending else math.inf
            if at == math.inf and not (self._live or self._queued):
                break
            nxt = self._next_at()
            if nxt <= at:            # node events at a tie run before the arrival (Simulation's rule)
                if nxt == math.inf or nxt > limit:
                    break
                self._until(nxt)
                continue
            if at > limit:
                break
            _, k, j = heapq.heappop(pending)
            self._until(at)          # the timers _next_at leaves out while nothing is in flight
            self.now = at
            last = at
            r = dataclasses.replace(self._sessions[k].turns[j], t=at)
            self.requests.append(r)
            self.turn_of.append((k, j))
            self._arrive(r)
        return self._close_run(last, until)

    def _ended(self, i: int, outcome: int) -> None:
        if i >= len(self.turn_of):    # a row of a plain open-loop run on this simulation
            return
        k, j = self.turn_of[i]
        s = self._sessions[k]
        left = len(s.turns) - j - 1
        if left <= 0:
            return
        if outcome != OK:
            self.abandoned += left
            return
        res = self.results
        due = max(res.t[i] + res.e2e[i] + s.think_s[j], self.now)
        if due >= self._stop:
            self.cut += left
            return
        heapq.heappush(self._pending, (due, k, j + 1))
