"""Check the names a process's conditions, scripts and parameters read against the data it holds.

Pure: ``data_problems(spec, services, start_data, flows)`` → ``[(element id, problem)]``; it parses
nothing from disk and changes nothing, so start-up, ``inferlb validate`` and a reload can all call it.

What counts as written:

- ``start_data``: the variables the caller puts in every instance (name → the keys it holds, or
  ``None`` when its keys are free, like ``tags``);
- each service task's result variable, holding the keys its operation declares (``ServiceSpec.writes``);
- each script task's assignments (``x = …`` makes ``x`` a variable with free keys; ``routing["k"] = …``
  adds the key ``k``).

What is checked, for every gateway condition, script, parameter and timer expression:

- it parses and compiles (``compile``, as the engine runs it: ``return`` at a script's top level
  parses but never runs);
- every free name it reads is a Python builtin, a script-environment global, or a variable set on
  **every** path from the start to that element (a name set only on some paths is a ``NameError``
  on the others);
- every constant key it reads, ``var["key"]`` or ``var.get("key")``, is one ``var`` can hold.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inferlb.workflow.parser import OperationTask
from inferlb.workflow.services import ServiceTable, StartData

__all__ = ["data_problems"]

_BUILTINS = frozenset(dir(builtins))
# Methods that change a dict's keys in ways a constant-key analysis cannot follow.
_KEY_MUTATORS = frozenset({"update", "setdefault", "__setitem__", "pop", "popitem", "clear"})


@dataclass
class _Code:
    """One piece of Python in the process: where it is and what it reads and writes."""

    element: str
    what: str                         # "condition of flow_x", "script", "parameter max_attempts"
    reads: set[str] = field(default_factory=set)
    keys: list[tuple[str, str]] = field(default_factory=list)       # (variable, constant key) read
    sets: set[str] = field(default_factory=set)                    # names assigned (scripts)
    key_sets: list[tuple[str, str | None]] = field(default_factory=list)   # (variable, key or None=any)


def _analyse(src: str, mode: str, element: str, what: str) -> _Code | tuple[str, str]:
    code = _Code(element, what)
    try:
        tree = ast.parse(src.strip(), mode=mode)
        # Compiled too, as the engine will: what parses but cannot run ('return' or 'await' at the
        # top of a script, 'break' outside a loop) fails here, not on every request.
        compile(src.strip(), element, mode)
    except SyntaxError as exc:
        return element, f"{what} is not valid Python: {exc.msg} in {src.strip()!r}"
    bound: set[str] = set()
    loads: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            key = node.slice.value if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) \
                else None
            if isinstance(node.ctx, ast.Load):
                if key is not None:
                    code.keys.append((node.value.id, key))
            else:
                code.key_sets.append((node.value.id, key))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name):
            var, meth = node.func.value.id, node.func.attr
            if meth == "get" and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                code.keys.append((var, node.args[0].value))
            elif meth in _KEY_MUTATORS:
                code.key_sets.append((var, None))
    code.reads = loads - bound
    # Names bound at the top of a script stay in the task data afterwards (SpiffWorkflow keeps
    # every new local); names bound inside functions or comprehensions do not, but counting them
    # only makes the check more lenient.
    code.sets = bound if mode == "exec" else set()
    return code


def _codes(spec: Any, flows: Mapping[tuple[str, str], str]) -> tuple[dict[str, list[_Code]], list[tuple[str, str]]]:
    """Every piece of Python per task spec name, and the syntax problems found on the way."""
    out: dict[str, list[_Code]] = {}
    problems: list[tuple[str, str]] = []

    def add(name: str, src: str, mode: str, element: str, what: str) -> None:
        res = _analyse(src, mode, element, what)
        if isinstance(res, tuple):
            problems.append(res)
        else:
            out.setdefault(name, []).append(res)

    for name, ts in spec.task_specs.items():
        eid = getattr(ts, "bpmn_id", None) or name
        for cond, target in getattr(ts, "cond_task_specs", ()) or ():
            if cond is not None and cond.args:
                flow = flows.get((eid, target))
                add(name, str(cond.args[0]), "eval", eid,
                    f"condition of {flow}" if flow else f"condition of the flow to {target}")
        if isinstance(ts, OperationTask):
            for pname, expr in ts.params.items():
                add(name, expr, "eval", eid, f"parameter {pname!r}")
        script = getattr(ts, "script", None)
        if isinstance(script, str) and script.strip():
            add(name, script, "exec", eid, "script")
        for attr in ("prescript", "postscript"):
            extra = getattr(ts, attr, None)
            if isinstance(extra, str) and extra.strip():
                add(name, extra, "exec", eid, attr)
        timer = getattr(getattr(ts, "event_definition", None), "expression", None)
        if isinstance(timer, str) and timer.strip():
            add(name, timer, "eval", eid, "timer expression")
    return out, problems


def _must_defined(spec: Any, gen: Mapping[str, set[str]], start: set[str]) -> dict[str, set[str]]:
    """Names set on every path from the start to each task spec (entry of the element)."""
    specs = spec.task_specs
    universe = set(start).union(*gen.values()) if gen else set(start)
    entry: dict[str, set[str]] = {name: set(universe) for name in specs}
    start_name = spec.start.name
    entry[start_name] = set(start)
    work = list(specs)
    while work:
        name = work.pop()
        ts = specs[name]
        if name != start_name:
            preds = [p.name for p in ts.inputs]
            new = set(universe)
            for p in preds:
                new &= entry[p] | gen.get(p, set())
            if not preds:
                new = set(start)
            if new == entry[name]:
                continue
            entry[name] = new
        work.extend(o.name for o in ts.outputs)
    return entry


def _fmt(names: Iterable[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def data_problems(spec: Any, services: ServiceTable, start_data: StartData,
                  flows: Mapping[tuple[str, str], str] | None = None,
                  env_globals: Iterable[str] = ()) -> list[tuple[str, str]]:
    """``(element id, problem)`` for every name or key the process's Python reads that nothing
    writes. ``flows`` maps (source id, target id) to a sequence flow's id, to name conditions."""
    codes, problems = _codes(spec, flows or {})
    known_globals = _BUILTINS | set(env_globals)

    # What each element writes, and which operations write each variable.
    gen: dict[str, set[str]] = {}
    writers: dict[str, list[str]] = {}
    keys: dict[str, set[str] | None] = {k: (set(v) if v is not None else None) for k, v in start_data.items()}
    origin: dict[str, str] = {k: "the gateway's start data" for k in start_data}
    for name, ts in spec.task_specs.items():
        if isinstance(ts, OperationTask) and ts.operation in services:
            svc = services[ts.operation]
            var = ts.result_variable or svc.result
            gen.setdefault(name, set()).add(var)
            writers.setdefault(var, []).append(ts.bpmn_id)
            if var in keys and keys[var] is None:
                continue
            if svc.writes:
                current = keys.get(var)
                keys[var] = (current or set()) | set(svc.writes)
                origin.setdefault(var, ts.operation)
            else:
                keys[var] = None     # an operation that declares no keys: anything goes
    for name, cs in codes.items():
        for c in cs:
            gen.setdefault(name, set()).update(c.sets)
            for var in c.sets:
                writers.setdefault(var, []).append(c.element)
                keys[var] = None     # a script (re)assigns it: its keys are whatever the script says
    for cs in codes.values():
        for c in cs:
            for var, key in c.key_sets:
                if var in keys and keys[var] is not None:
                    if key is None:
                        keys[var] = None
                    else:
                        keys[var].add(key)  # type: ignore[union-attr]

    entry = _must_defined(spec, gen, set(start_data))
    for name, cs in codes.items():
        here = entry.get(name, set())
        for c in cs:
            for var in sorted(c.reads):
                if var in known_globals or var in here or var in c.sets:
                    continue
                if var in writers or var in start_data:
                    by = ", ".join(sorted(set(writers.get(var, []))))
                    problems.append((c.element, f"{c.what} reads {var!r}, which is not set on every path to "
                                                f"{c.element} (set by {by})"))
                else:
                    problems.append((c.element, f"{c.what} reads {var!r}, which no operation, script or "
                                                f"start data of this process sets (set here: {_fmt(here)})"))
            seen: set[tuple[str, str]] = set()
            for var, key in c.keys:
                allowed = keys.get(var)
                if (var, key) in seen or allowed is None or key in allowed:
                    continue
                seen.add((var, key))
                problems.append((c.element, f"{c.what} reads {var}[{key!r}], but {var} (written by "
                                            f"{origin.get(var, 'a script')}) never holds {key!r}; its keys: "
                                            f"{_fmt(allowed)}"))
    return problems
