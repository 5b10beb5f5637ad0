"""The spiff executor: real SpiffWorkflow instances, tuned.

Tuning (see docs/spiffworkflow-notes.md): expressions compiled once and cached (:class:`ScriptEnv`);
our own driver loop that looks for the next READY task below the one just run instead of walking
the whole tree; no re-scan of WAITING tasks after every completion unless the process has
elements that wait (joins, catch events); the ``spiff`` logger at WARNING, and no walk of the
whole task tree to build a log record's extras nobody logs; in processes where nothing waits,
exclusive gateways build only the branch they take (:class:`~.parser.LazyExclusiveGateway`).
Runs any BPMN SpiffWorkflow supports; timers park the instance as a ``clock/timer`` call.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from typing import Any

from SpiffWorkflow.bpmn.script_engine import PythonScriptEngine
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.task import Task
from SpiffWorkflow.util.task import TaskState
from SpiffWorkflow.version import __version__ as SPIFF_VERSION

from inferlb.errors import WorkflowRuntimeError
from inferlb.workflow.base import ExternalCall, ScriptEnv
from inferlb.workflow.parser import LazyExclusiveGateway, OperationTask
from inferlb.workflow.services import ServiceTable

__all__ = ["TIMER_OPERATION", "SpiffExecutor", "SpiffInstance"]

TIMER_OPERATION = "clock/timer"
_MAX_STEPS = 10_000

logging.getLogger("spiff").setLevel(logging.WARNING)
_task_log = logging.getLogger("spiff.task")
_workflow_log = logging.getLogger("spiff.workflow")


def _quiet_set_state(self: Task, value: int) -> None:
    """``Task._set_state`` without building a log record's extras when INFO is off.

    SpiffWorkflow 3.2.0 builds an extras dict (and formats a message) on every state change even
    when nothing logs it: ≈ 15 % of an instance's CPU. Same state semantics; the log line is still
    emitted, with its extras, when the ``spiff.task`` logger is enabled for INFO.
    """
    if value != self.state:
        if _task_log.isEnabledFor(logging.INFO):
            _orig_set_state(self, value)
            return
        self.last_state_change = time.time()
        self._state = value


_orig_set_state = Task._set_state
if tuple(int(x) for x in SPIFF_VERSION.split(".")[:2]) == (3, 2):
    Task._set_state = _quiet_set_state


class _Environment:
    """Adapter giving SpiffWorkflow's script engine our cached :class:`ScriptEnv`."""

    def __init__(self, env: ScriptEnv) -> None:
        self.env = env
        self.globals = env.globals

    def evaluate(self, expression: str, context: dict[str, Any], external_context: Any = None) -> Any:
        return self.env.evaluate(expression, context, external_context)

    def execute(self, script: str, context: dict[str, Any], external_context: Any = None) -> bool:
        return self.env.execute(script, context, external_context)

    def call_service(self, context: dict[str, Any], **kwargs: Any) -> str:
        raise NotImplementedError("inferlb runs operations through run_operation")


class _ScriptEngine(PythonScriptEngine):  # type: ignore[misc]
    """Per-instance script engine: knows the service table and the request scope."""

    def __init__(self, env: _Environment, services: ServiceTable, scope: Any, inst: SpiffInstance) -> None:
        super().__init__(environment=env)
        self.services = services
        self.scope = scope
        self.inst = inst

    def run_operation(self, task: Any, spec: OperationTask) -> bool | None:
        data = task.data
        svc = self.services[spec.operation]
        var = spec.result_variable or svc.result
        env = self.environment.env
        try:
            params = {k: env.evaluate(v, data) for k, v in spec.params.items()} if spec.params else {}
            if svc.external:
                self.inst._park(task, ExternalCall(spec.bpmn_id or spec.name, spec.operation, params, var))
                return None
            assert svc.fn is not None
            data[var] = svc.fn(self.scope, data, params)
        except WorkflowRuntimeError:
            raise
        except Exception as exc:
            # Wrapped here: SpiffWorkflow 3.2.0 turns service errors into NameError('script').
            raise WorkflowRuntimeError(spec.bpmn_id or spec.name, f"{type(exc).__name__}: {exc}") from exc
        return True


class _Workflow(BpmnWorkflow):  # type: ignore[misc]
    """BpmnWorkflow that skips the WAITING re-scan when nothing in the process can wait."""

    refresh_waiting = True

    def collect_log_extras(self, dct: dict[str, Any] | None = None) -> dict[str, Any]:
        """The extras of a workflow log record, built only when the record will be emitted.

        SpiffWorkflow 3.2.0 lists every task of the tree in them (a whole-tree walk, ≈ 10 % of an
        instance) whenever the ``spiff.workflow`` logger's own level is unset, i.e. below INFO,
        even when its effective level drops the record; it does so at start and at completion.
        """
        if _workflow_log.isEnabledFor(logging.INFO):
            extras: dict[str, Any] = super().collect_log_extras(dct)
            return extras
        return dct if dct is not None else {}

    def _task_completed_notify(self, task: Any) -> None:
        self.last_task = task
        if task.task_spec.name == "End":
            self._mark_complete(task)
        if self.completed:
            self.completed_event(self)
        elif self.refresh_waiting:
            self.update_waiting_tasks()


class SpiffInstance:
    """One request's SpiffWorkflow instance."""

    def __init__(self, ex: SpiffExecutor, data: dict[str, Any], scope: Any) -> None:
        self._ex = ex
        self.scope = scope
        self.path: list[str] = []
        self._parked_task: Any = None
        self._call: ExternalCall | None = None
        self._timer = False
        self._steps = 0
        engine = _ScriptEngine(ex.environment, ex.services, scope, self)
        self.wf = _Workflow(ex.spec, script_engine=engine)
        self.wf.refresh_waiting = ex.has_waiting
        self._last: Any = None
        # A new instance holds a handful of tasks: scan the id -> task map rather than walk the tree.
        for t in list(self.wf.tasks.values()):
            if t.state == TaskState.READY:
                t.data.update(data)
        self.data: dict[str, Any] = data

    @property
    def finished(self) -> bool:
        done: bool = self.wf.is_completed()
        return done

    def _park(self, task: Any, call: ExternalCall) -> None:
        self._parked_task = task
        self._call = call

    def complete(self, result: dict[str, Any]) -> None:
        if self._timer:
            self._timer = False
            self.wf.refresh_timers()
            return
        task, call = self._parked_task, self._call
        if task is None or call is None:
            raise WorkflowRuntimeError("?", "complete() without a parked task")
        task.data[call.result_var] = result
        self._parked_task = self._call = None
        task.complete()
        self._last = task

    def _next_ready(self) -> Any:
        # The task that just ran made its successors READY: look there before walking the tree.
        last = self._last
        if self.wf.completed:
            # ``End`` ran, so the end join saw every other task finished: nothing can be READY.
            return None
        if last is not None:
            for child in last.children:
                if child.state == TaskState.READY:
                    return child
        return self.wf.get_next_task(state=TaskState.READY)

    def advance(self) -> ExternalCall | None:
        wf = self.wf
        while True:
            task = self._next_ready()
            if task is None:
                break
            self._steps += 1
            if self._steps > _MAX_STEPS:
                raise WorkflowRuntimeError(task.task_spec.bpmn_id or task.task_spec.name, "runaway loop")
            spec = task.task_spec
            if spec.bpmn_id is not None:
                self.path.append(spec.bpmn_id)
            try:
                task.run()
            except WorkflowRuntimeError:
                raise
            except Exception as exc:
                raise WorkflowRuntimeError(spec.bpmn_id or spec.name, f"{type(exc).__name__}: {exc}") from exc
            self._last = task
            if self._call is not None:
                return self._call
        if wf.is_completed():
            end = wf.last_task
            if end is not None:
                self.data = end.data
            return None
        events = wf.waiting_events()
        timers = [e for e in events if e.event_type in ("TimerEventDefinition", "DurationTimerEventDefinition")
                  or "Timer" in str(e.event_type)]
        if timers:
            due = min(_due(e.value) for e in timers)
            self._timer = True
            return ExternalCall("timer", TIMER_OPERATION, {"seconds": max(0.0, due)}, "")
        raise WorkflowRuntimeError("?", f"instance stalled with nothing ready: {[e.name for e in events]}")


def _due(value: Any) -> float:
    """Seconds until a SpiffWorkflow timer event's fire time (ISO string or datetime)."""
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else value
        now = datetime.now(when.tzinfo) if when.tzinfo else datetime.now()
        return float((when - now).total_seconds())
    except (TypeError, ValueError, AttributeError):
        try:
            return float(json.loads(value))
        except (TypeError, ValueError):
            return 0.0


class SpiffExecutor:
    """Runs a parsed spec on SpiffWorkflow."""

    mode = "spiff"
    # Exclusive gateways build only the branch they take where nothing reads predicted tasks
    # (parser.LazyExclusiveGateway); False keeps SpiffWorkflow's full prediction everywhere.
    lazy_gateways = True

    def __init__(self, spec: Any, services: ServiceTable, env: ScriptEnv) -> None:
        self.spec = spec
        self.services = services
        self.environment = _Environment(env)
        names = {type(ts).__name__ for ts in spec.task_specs.values()}
        self.has_waiting = bool(names & {
            "ParallelGateway", "InclusiveGateway", "IntermediateCatchEvent", "BoundaryEvent",
            "EventBasedGateway", "ReceiveTask", "_BoundaryEventParent", "BoundaryEventSplit",
            "BoundaryEventJoin",
        })
        # Only joins, event gateways and waiting events read predicted tasks; without them the
        # gateways need not predict the branches they will not take (parser.LazyExclusiveGateway).
        for ts in spec.task_specs.values():
            if isinstance(ts, LazyExclusiveGateway):
                ts.predict_branches = self.has_waiting or not self.lazy_gateways

    def start(self, data: dict[str, Any], scope: Any) -> SpiffInstance:
        return SpiffInstance(self, data, scope)
