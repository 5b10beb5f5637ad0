"""Load a BPMN process once: parse and XSD-validate with SpiffWorkflow, check its operations
against the service table, and pick the executor.

``INFERLB_ENGINE=auto`` (default) uses the compiled executor when the process stays inside its
subset and SpiffWorkflow otherwise; ``spiff`` / ``compiled`` force one (``compiled`` on a process
outside the subset is a start-up error naming the elements).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from SpiffWorkflow.bpmn.parser.ValidationException import ValidationException

from inferlb.errors import ProcessError, ProcessValidationError
from inferlb.workflow.base import ProcessExecutor, ScriptEnv
from inferlb.workflow.compiled import CompiledExecutor, plan_problems
from inferlb.workflow.datacheck import data_problems
from inferlb.workflow.parser import OperationTask, element_tags, make_parser, sequence_flows
from inferlb.workflow.services import ServiceTable, StartData
from inferlb.workflow.spiff import SpiffExecutor

__all__ = ["ProcessDefinition", "load_process"]

log = logging.getLogger("inferlb.workflow")

# Elements that would park an instance forever on a gateway (a human or a message nobody sends).
_UNSUPPORTED = {
    "userTask": "needs a person; a request cannot wait for one",
    "manualTask": "needs a person; a request cannot wait for one",
    "receiveTask": "waits for a message nothing sends",
    "sendTask": "message flows are not supported",
    "callActivity": "called processes are not supported",
    "businessRuleTask": "DMN decisions are not supported",
}


@dataclass
class ProcessDefinition:
    """A parsed, validated process and the executor chosen for it."""

    path: Path
    process_id: str
    spec: Any
    executor: ProcessExecutor
    compiled_problems: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    # The file's content hash (SHA-256, 12 hex digits): the audit record's ``process_version``.
    version: str = ""

    @property
    def mode(self) -> str:
        return self.executor.mode


def _first_process_id(parser: Any) -> str:
    ids = parser.get_process_ids()
    if not ids:
        raise ProcessError("no executable process in the file")
    return str(ids[0])


def load_process(
    path: Path | str,
    services: ServiceTable,
    *,
    engine: str = "auto",
    required: dict[str, str] | None = None,
    env: ScriptEnv | None = None,
    start_data: StartData | None = None,
) -> ProcessDefinition:
    """Parse, validate and build the executor. Raises ProcessValidationError listing
    ``(element id, problem)`` for unknown operations, missing required tasks, unsupported elements
    and, when ``start_data`` (the variables every instance starts with, name -> keys or None) is
    given, every name or constant key a condition, script or parameter reads that nothing in the
    process writes (see :mod:`.datacheck`). Reads the file; changes nothing."""
    p = Path(path)
    parser = make_parser()
    try:
        parser.add_bpmn_file(str(p))
        pid = _first_process_id(parser)
        spec = parser.get_spec(pid)
    except ValidationException as exc:
        eid = getattr(exc, "id", None) or "?"
        line = getattr(exc, "line_number", None)
        where = f" (line {line})" if line else ""
        raise ProcessValidationError(str(p), [(str(eid), f"{exc.args[0] if exc.args else exc}{where}")]) from exc
    except OSError as exc:
        raise ProcessValidationError(str(p), [("(file)", f"cannot read: {exc.strerror}")]) from exc
    except Exception as exc:  # lxml / SpiffWorkflow internals on malformed files
        raise ProcessValidationError(str(p), [("(file)", f"{type(exc).__name__}: {exc}")]) from exc

    problems: list[tuple[str, str]] = []
    ops_seen: dict[str, str] = {}
    for ts in spec.task_specs.values():
        if isinstance(ts, OperationTask):
            ops_seen[ts.bpmn_id] = ts.operation
            if ts.operation not in services:
                problems.append((ts.bpmn_id, f"unknown service operation {ts.operation!r} "
                                             f"(known: {', '.join(sorted(services))})"))
    for eid, tag in element_tags(str(p)):
        if tag in _UNSUPPORTED:
            problems.append((eid, f"unsupported element {tag}: {_UNSUPPORTED[tag]}"))
    for op, eid in (required or {}).items():
        if op not in ops_seen.values():
            problems.append((eid, f"missing required task: a service task with operation {op!r}"))
    env = env or ScriptEnv()
    if start_data is not None and not problems:
        problems.extend(data_problems(spec, services, start_data, sequence_flows(str(p)), env.globals))
    if problems:
        raise ProcessValidationError(str(p), problems)

    compiled_problems = plan_problems(spec)
    if engine == "compiled" and compiled_problems:
        raise ProcessValidationError(str(p), [(e, f"outside the compiled subset: {r}") for e, r in compiled_problems])
    executor: ProcessExecutor
    if engine == "spiff" or (engine == "auto" and compiled_problems):
        executor = SpiffExecutor(spec, services, env)
    elif engine in ("auto", "compiled"):
        executor = CompiledExecutor(spec, services, env)
    else:
        raise ProcessError(f"unknown engine {engine!r}: use auto, spiff or compiled")
    try:
        version = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
    except OSError as exc:   # the file went away since it was parsed
        raise ProcessValidationError(str(p), [("(file)", f"cannot read: {exc.strerror}")]) from exc
    return ProcessDefinition(p, pid, spec, executor, compiled_problems, version=version)
