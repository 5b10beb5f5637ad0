"""The executor interface: one process instance per request, driven by one coroutine.

::

    inst = executor.start(data, scope)
    call = inst.advance()            # runs engine steps until the instance parks or ends
    while call is not None:
        result = await perform(call) # the async layer does the I/O / waiting
        inst.complete(result)        # stores result under call.result_var, completes the task
        call = inst.advance()
    inst.data, inst.path             # final data; BPMN element ids in visit order

``advance`` raises :class:`~inferlb.errors.WorkflowRuntimeError` when a task fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["ExecutorMode", "ExternalCall", "Instance", "ProcessExecutor", "ScriptEnv"]

ExecutorMode = str  # "compiled" | "spiff"


@dataclass(frozen=True)
class ExternalCall:
    """The instance is parked on ``task_id`` waiting for the async layer to perform ``operation``."""

    task_id: str
    operation: str
    params: dict[str, Any]
    result_var: str


class Instance(Protocol):
    data: dict[str, Any]
    path: list[str]

    def advance(self) -> ExternalCall | None: ...

    def complete(self, result: dict[str, Any]) -> None: ...

    @property
    def finished(self) -> bool: ...


class ProcessExecutor(Protocol):
    mode: ExecutorMode

    def start(self, data: dict[str, Any], scope: Any) -> Instance: ...


class ScriptEnv:
    """SpiffWorkflow's ``TaskDataEnvironment`` semantics with compiled code cached by source.

    Both executors evaluate conditions, parameters and scripts through this one class, so a
    process behaves the same whichever executor runs it. ``globals`` are functions made callable
    from scripts; task data overrides them in expressions, exactly as in SpiffWorkflow.
    """

    def __init__(self, env_globals: dict[str, Any] | None = None) -> None:
        self.globals: dict[str, Any] = dict(env_globals or {})
        self._eval_cache: dict[str, Any] = {}
        self._exec_cache: dict[str, Any] = {}

    def _code(self, src: str, mode: str) -> Any:
        cache = self._eval_cache if mode == "eval" else self._exec_cache
        code = cache.get(src)
        if code is None:
            code = compile(src, "<string>", mode)
            cache[src] = code
        return code

    def evaluate(self, expression: str, context: dict[str, Any], external: dict[str, Any] | None = None) -> Any:
        if not self.globals and not external and "__builtins__" not in context:
            # Nothing to merge: evaluate on the data itself (no copy) and take back the
            # ``__builtins__`` entry eval adds, leaving the data exactly as it was.
            try:
                return eval(self._code(expression, "eval"), context)
            finally:
                context.pop("__builtins__", None)
        ns = dict(self.globals)
        if external:
            ns.update(external)
        ns.update(context)
        return eval(self._code(expression, "eval"), ns)

    def execute(self, script: str, context: dict[str, Any], external: dict[str, Any] | None = None) -> bool:
        clash = set(self.globals).intersection(context)
        if external:
            clash.update(set(external).intersection(context))
        if clash:
            raise ValueError(f"task data overwrites predefined functions: {sorted(clash)}")
        added = dict(self.globals)
        if external:
            added.update(external)
        context.update(added)
        try:
            exec(self._code(script, "exec"), context)
        finally:
            # Same clean-up as SpiffWorkflow: no builtins, callables or globals left in the data.
            for k in list(context):
                if k == "__builtins__" or callable(context[k]) or k in added:
                    context.pop(k)
        return True

