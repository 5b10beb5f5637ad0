"""The one timer-driven BPMN runner: node health, autoscale and rollouts run their process on it.

Contract:

* :class:`ProcessTimer` is a :class:`~inferlb.background.Periodic` whose turns are *rounds*:
  rounds start every ``interval_s`` (fixed rate: a slow round does not push the next ones back;
  the interval is read as each round starts, so a reload changes it), the first after
  ``first_s`` (None: one interval; :meth:`~inferlb.background.Periodic.start` may override it).
  A round is the owner's ``run_round(n)``, ``n`` its number; ``due`` (optional) skips a round
  uncounted when there is nothing to do.
* **Leader gating**: with ``leader`` given, a round while ``leader()`` is false runs ``standby()``
  instead (when given) and counts in :attr:`standby_rounds`; :attr:`rounds` counts the others, as
  they start (a failing round counts too).
* :meth:`run_once` is one round through the gate, its exception propagating. :meth:`run_logged`
  is a round as the timer runs it: a failure counts in :attr:`failed_rounds`, is kept in
  :attr:`last_error` (``"Type: message"``, cleared by the next good round), handed to
  ``on_error`` when given, and logged as Periodic logs a failing turn (one WARNING line
  ``"<what> round <n> failed: <error>; retrying in …"``, at most one a minute while it keeps
  failing, the rounds backing off meanwhile: background.py); the timer goes on. Cancellation is
  never a failure.
* :meth:`run_instance` is what a round does on the engine: a **fresh** instance of the current
  process (``process()``, read at every call: a reload swaps it between rounds; a long-lived
  looping instance would grow by a few task objects per turn) started with ``data`` and
  ``scope``; the executor runs the in-engine operations from the service table the process was
  loaded with; each external task is performed by ``performers[operation](call)``, whose result
  completes it, until the instance ends. It returns the ended instance (``data``, ``path``). An
  operation without a performer is a :class:`~inferlb.errors.WorkflowRuntimeError` naming the
  task; no process loaded, a RuntimeError. :data:`WAITS` names the operations a process waits on
  (``clock/wait`` and a timer event); :func:`waits` maps both to one performer.
* The owner keeps what its round means (the scope, the performers, what it keeps of the result);
  :meth:`~inferlb.background.Background.stop` stops the timer (a round in flight is cancelled).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from inferlb.background import Periodic
from inferlb.errors import WorkflowRuntimeError
from inferlb.workflow.base import ExternalCall, Instance
from inferlb.workflow.definition import ProcessDefinition
from inferlb.workflow.spiff import TIMER_OPERATION

__all__ = ["WAITS", "Performer", "ProcessTimer", "waits"]

T = TypeVar("T")

#: Performs one external task: the call in, the task's result out.
Performer = Callable[[ExternalCall], Awaitable[dict[str, Any]]]

#: The operations a process parks on to wait: the ``clock/wait`` service and a timer event.
WAITS = ("clock/wait", TIMER_OPERATION)


def waits(perform: Performer) -> dict[str, Performer]:
    """``perform`` for every operation of :data:`WAITS`."""
    return dict.fromkeys(WAITS, perform)


class ProcessTimer(Periodic[T]):
    """See the module docstring."""

    def __init__(self, name: str, *, what: str, process: Callable[[], ProcessDefinition | None],
                 interval_s: Callable[[], float], run_round: Callable[[int], Awaitable[T]], logger: logging.Logger,
                 first_s: float | None = None, leader: Callable[[], bool] | None = None,
                 standby: Callable[[], Awaitable[T]] | None = None, due: Callable[[], bool] | None = None,
                 on_error: Callable[[Exception], None] | None = None) -> None:
        async def turn() -> T:
            return await run_round(self.turns)

        super().__init__(name, turn, interval_s=interval_s, first_s=first_s, rate=True, leader=leader,
                         standby=standby, due=due, on_error=on_error, logger=logger)
        self.what = what
        self.process = process

    @property
    def rounds(self) -> int:
        return self.turns

    @property
    def standby_rounds(self) -> int:
        return self.standby_turns

    @property
    def failed_rounds(self) -> int:
        return self.turn_errors

    async def run_once(self) -> T | None:
        """One round through the leader gate (None on standby without ``standby``)."""
        return await self.once()

    async def run_logged(self) -> bool:
        """One round as the timer runs it (module docstring); True when it went well."""
        return await self.run_turn()

    def label(self) -> str:
        return f"{self.what} round {self.rounds}"

    async def run_instance(self, data: dict[str, Any], scope: Any, performers: Mapping[str, Performer]) -> Instance:
        """A fresh instance of the current process, performed to its end (module docstring)."""
        process = self.process()
        if process is None:
            raise RuntimeError(f"no {self.what} process loaded")
        inst = process.executor.start(data, scope)
        call = inst.advance()
        while call is not None:
            perform = performers.get(call.operation)
            if perform is None:
                raise WorkflowRuntimeError(call.task_id, f"no performer for external operation {call.operation!r}")
            inst.complete(await perform(call))
            call = inst.advance()
        return inst
