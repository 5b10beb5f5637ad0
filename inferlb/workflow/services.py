"""The service-operation vocabulary shared by ``tasks`` (which provides operations) and
``workflow`` (which calls them). Neither imports the other; ``app.py`` injects the table.

A service operation is a synchronous, I/O-free function ``fn(scope, data, params) -> dict``:
``scope`` is the per-request context object (opaque to the workflow), ``data`` the instance's
workflow data (read it, do not mutate it), ``params`` the evaluated task parameters. It returns
JSON-able data stored under the task's result variable. It never sleeps and never blocks.

An *external* operation has no function: the workflow parks on it and the async layer (the
gateway) performs it and completes the task with the result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ProcessContract", "ServiceFn", "ServiceSpec", "ServiceTable", "StartData"]

ServiceFn = Callable[[Any, Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class ServiceSpec:
    """One operation: its function (None when external), default result variable, docs.

    ``writes`` lists every key the result variable can hold (each key any of the operation's
    answers uses; for an external operation, the keys of what the async layer completes it with).
    Process validation checks every constant key a condition, script or parameter reads
    (``routing["ok"]``, ``outcome.get("kind")``) against it; empty means "not declared, unchecked".
    """

    result: str
    fn: ServiceFn | None = None
    external: bool = False
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    params: Mapping[str, str] = field(default_factory=dict)   # name -> meaning
    doc: str = ""


ServiceTable = Mapping[str, ServiceSpec]

# The variables every instance of a kind of process starts with: name -> the keys it holds, or
# None when its keys are free.
StartData = Mapping[str, tuple[str, ...] | None]


@dataclass(frozen=True)
class ProcessContract:
    """What a kind of process (per request, node health) must contain and starts with.

    ``required``: operation -> the element id its service task must have. ``start_data``: what
    the caller puts in every instance; validation checks what conditions and scripts read
    against it and against the operations' ``writes``.
    """

    required: Mapping[str, str]
    start_data: StartData
