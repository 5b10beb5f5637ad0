"""The compiled executor: a plan built once from SpiffWorkflow's parsed spec, run on one dict.

Covers the hot-path subset: start/end events, exclusive gateways (conditions in the same order
SpiffWorkflow tests them, then the default), script tasks, service tasks, and loops through
sequence flows. :func:`plan_problems` says why a spec is outside the subset; those processes run
on the spiff executor. Semantics match the spiff executor (a differential test holds them equal):
same script environment, same visit path, same final data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from SpiffWorkflow.bpmn.specs.control import BpmnStartTask, SimpleBpmnTask, _EndJoin
from SpiffWorkflow.bpmn.specs.defaults import EndEvent, StartEvent
from SpiffWorkflow.bpmn.specs.mixins.exclusive_gateway import ExclusiveGateway
from SpiffWorkflow.bpmn.specs.mixins.script_task import ScriptTask

from inferlb.errors import ProcessError, WorkflowRuntimeError
from inferlb.workflow.base import ExternalCall, ScriptEnv
from inferlb.workflow.parser import OperationTask
from inferlb.workflow.services import ServiceTable

__all__ = ["CompiledExecutor", "CompiledInstance", "plan_problems"]

_MAX_STEPS = 10_000  # a runaway loop in an edited process fails the request instead of hanging


@dataclass
class _Step:
    name: str
    bpmn_id: str | None
    kind: str                      # pass | script | service | gateway | end
    next: str | None = None
    script: str = ""
    conds: list[tuple[str, str]] = field(default_factory=list)
    default: str | None = None
    op: str = ""
    params: dict[str, str] = field(default_factory=dict)
    result_var: str = ""
    external: bool = False


def _is_internal(spec: Any) -> bool:
    # SpiffWorkflow's own scaffolding around every process: Start, <process>.EndJoin, End.
    return isinstance(spec, BpmnStartTask | SimpleBpmnTask | _EndJoin)


def plan_problems(spec: Any) -> list[tuple[str, str]]:
    """Elements of ``spec`` outside the compiled subset, as (element id, reason)."""
    problems: list[tuple[str, str]] = []
    for name, ts in spec.task_specs.items():
        if _is_internal(ts) or isinstance(ts, StartEvent | EndEvent | ScriptTask | OperationTask):
            if isinstance(ts, StartEvent | EndEvent) and getattr(ts, "event_definition", None) is not None \
                    and type(ts.event_definition).__name__ != "NoneEventDefinition":
                problems.append((ts.bpmn_id or name, f"{type(ts.event_definition).__name__} on a start/end event"))
            if getattr(ts, "prescript", None) or getattr(ts, "postscript", None):
                problems.append((ts.bpmn_id or name, "pre/post scripts"))
            continue
        if isinstance(ts, ExclusiveGateway):
            continue
        problems.append((getattr(ts, "bpmn_id", None) or name, type(ts).__name__))
    return problems


def _build_plan(spec: Any, services: ServiceTable) -> dict[str, _Step]:
    plan: dict[str, _Step] = {}
    for name, ts in spec.task_specs.items():
        bid = getattr(ts, "bpmn_id", None)
        nxt = ts.outputs[0].name if len(ts.outputs) == 1 else None
        if isinstance(ts, ExclusiveGateway):
            conds = [(c.args[0], target) for c, target in ts.cond_task_specs if c is not None]
            plan[name] = _Step(name, bid, "gateway", conds=conds, default=ts.default_task_spec, next=nxt)
        elif isinstance(ts, ScriptTask):
            plan[name] = _Step(name, bid, "script", next=nxt, script=ts.script)
        elif isinstance(ts, OperationTask):
            svc = services[ts.operation]
            plan[name] = _Step(
                name, bid, "service", next=nxt, op=ts.operation, params=dict(ts.params),
                result_var=ts.result_variable or svc.result, external=svc.external,
            )
        elif not ts.outputs:
            plan[name] = _Step(name, bid, "end")
        else:
            if len(ts.outputs) != 1:
                raise ProcessError(f"{bid or name}: {len(ts.outputs)} outgoing flows outside a gateway")
            plan[name] = _Step(name, bid, "pass", next=nxt)
    return plan


class CompiledInstance:
    """One request's instance on the compiled plan."""

    def __init__(self, ex: CompiledExecutor, data: dict[str, Any], scope: Any) -> None:
        self._ex = ex
        self.data = data
        self.scope = scope
        self.path: list[str] = []
        self._cur: str | None = ex.start_name
        self._parked: _Step | None = None
        self._steps = 0

    @property
    def finished(self) -> bool:
        return self._cur is None and self._parked is None

    def complete(self, result: dict[str, Any]) -> None:
        step = self._parked
        if step is None:
            raise ProcessError("complete() without a parked task")
        self.data[step.result_var] = result
        self._parked = None
        self._cur = step.next

    def advance(self) -> ExternalCall | None:
        plan, env, data = self._ex.plan, self._ex.env, self.data
        while self._cur is not None:
            self._steps += 1
            if self._steps > _MAX_STEPS:
                raise WorkflowRuntimeError(self._cur, f"more than {_MAX_STEPS} steps: a loop never exits")
            step = plan[self._cur]
            if step.bpmn_id is not None:
                self.path.append(step.bpmn_id)
            kind = step.kind
            try:
                if kind == "pass":
                    self._cur = step.next
                elif kind == "gateway":
                    target = step.default
                    for cond, name in step.conds:
                        if env.evaluate(cond, data):
                            target = name
                            break
                    if target is None:
                        raise WorkflowRuntimeError(step.bpmn_id or step.name, "no condition matched and no default")
                    self._cur = target
                elif kind == "service":
                    # Most operations take no parameters: no comprehension to build for them.
                    params = {k: env.evaluate(v, data) for k, v in step.params.items()} if step.params else {}
                    if step.external:
                        self._parked = step
                        self._cur = None
                        return ExternalCall(step.bpmn_id or step.name, step.op, params, step.result_var)
                    fn = self._ex.services[step.op].fn
                    assert fn is not None
                    data[step.result_var] = fn(self.scope, data, params)
                    self._cur = step.next
                elif kind == "script":
                    env.execute(step.script, data)
                    self._cur = step.next
                else:  # end
                    self._cur = None
            except WorkflowRuntimeError:
                raise
            except Exception as exc:
                raise WorkflowRuntimeError(step.bpmn_id or step.name, f"{type(exc).__name__}: {exc}") from exc
        return None


class CompiledExecutor:
    """Builds the plan once; ``start`` costs one object."""

    mode = "compiled"

    def __init__(self, spec: Any, services: ServiceTable, env: ScriptEnv) -> None:
        problems = plan_problems(spec)
        if problems:
            raise ProcessError("outside the compiled subset: " + ", ".join(f"{e} ({r})" for e, r in problems))
        self.services = services
        self.env = env
        self.plan = _build_plan(spec, services)
        self.start_name = spec.start.name

    def start(self, data: dict[str, Any], scope: Any) -> CompiledInstance:
        return CompiledInstance(self, data, scope)
