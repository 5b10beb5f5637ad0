"""The engine alone: CPU per request of the request process, without HTTP.

The shipped ``inference_request.bpmn`` is loaded once per executor (``compiled``, ``spiff``)
with the real service table, and instances are driven the way the gateway drives them, with a
scripted dispatch in place of the upstream call (as ``tests/processes/harness.py`` does, with the
gateway's own ``begin_request`` and ``begin_attempt``):

* ``ok``: one dispatch answers 200;
* ``retry``: the first node answers 503, the backoff is computed, the second node answers 200;
* ``fallback``: the only node of the model answers 503, the process falls back to the smaller
  model and its node answers 200.

Each request's CPU time is the calling thread's CPU clock (``time.thread_time_ns``) around the
whole instance: start, every ``advance``/``complete``, the service tasks (evaluate, admit, route,
backoff, fallback, record) and handing the audit record over. Time is a manual clock, so backoffs
cost nothing but their computation. Between two requests (outside the measurement) the clock
moves ``gap_s`` (60 s), so every scripted request is an isolated event: windowed state such as the
retry budget (retries ≤ 10 % of a pool's requests per 10 s) starts empty, instead of seeing the
100 % retry storm that back-to-back ``retry`` requests would be, which the budget rightly refuses.
Loops are bounded by count and by ``max_seconds``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferlb.engine.app import request_end
from inferlb.engine.scope import IncomingRequest, Runtime, begin_request, build_runtime
from inferlb.engine.settings import Settings, fleet_from_mapping
from inferlb.engine.store.records import RequestRecord
from inferlb.engine.types import ManualClock
from inferlb.engine.workflow import TIMER_OPERATION, ProcessDefinition, load_process
from inferlb.tasks import REQUIRED_TASKS, SERVICES

from .loadgen.results import pcts

__all__ = ["ENGINES", "SCENARIOS", "EngineScenario", "default_process_path", "measure_engine"]

ENGINES = ("compiled", "spiff")

_OK = {"kind": "ok", "status": 200, "error_class": None, "retry_after_s": None}
_RETRY = {"kind": "retryable", "status": 503, "error_class": "upstream_status", "retry_after_s": None}

_FLEET = {
    "models": [{"name": "m", "fallbacks": ["m-small"], "max_output_tokens": 512}, {"name": "m-small"}],
    "nodes": [{"name": n, "url": f"http://127.0.0.1:{i + 1}", "models": ["m"]} for i, n in enumerate("abc")]
    + [{"name": "s", "url": "http://127.0.0.1:4", "models": ["m-small"]}],
}
_FALLBACK_FLEET = {
    "models": [{"name": "m", "fallbacks": ["m-small"]}, {"name": "m-small"}],
    "nodes": [{"name": "a", "url": "http://127.0.0.1:1", "models": ["m"]},
              {"name": "s", "url": "http://127.0.0.1:4", "models": ["m-small"]}],
}


@dataclass(frozen=True)
class EngineScenario:
    """A scripted request: the outcome of each dispatch, over a fleet, ending in ``status``."""

    name: str
    outcomes: tuple[dict[str, Any], ...]
    fleet: dict[str, Any]
    status: str = "ok"


SCENARIOS: tuple[EngineScenario, ...] = (
    EngineScenario("ok", (_OK,), _FLEET),
    EngineScenario("retry", (_RETRY, _OK), _FLEET),
    EngineScenario("fallback", (_RETRY, _OK), _FALLBACK_FLEET),
)


def default_process_path() -> Path:
    """The shipped request process (the repo's ``processes/`` or the packaged copy)."""
    from inferlb.engine.app import default_processes_dir

    return default_processes_dir() / "inference_request.bpmn"


class _Driver:
    """Runs scripted requests through one loaded process over one runtime."""

    def __init__(self, definition: ProcessDefinition, scenario: EngineScenario, gap_s: float = 60.0) -> None:
        self.definition = definition
        self.scenario = scenario
        self.gap_s = gap_s
        self.clock = ManualClock()
        self.submitted = 0
        self.rt: Runtime = build_runtime(Settings(max_inflight=1_000_000), fleet_from_mapping(scenario.fleet),
                                         clock=self.clock, seed=7,
                                         end=functools.partial(request_end, audit=self._submit))
        self._seq = 0

    def _submit(self, record: RequestRecord) -> None:
        self.submitted += 1

    def one(self) -> str:
        """One request, start to end; returns its final status."""
        self.clock.advance(self.gap_s)
        self._seq += 1
        clock = self.clock
        req = IncomingRequest(endpoint="chat", model="m", body={}, max_tokens=32, prompt_bytes=400,
                              request_id=f"req-{self._seq}")
        scope, data = begin_request(self.rt, req, engine=self.definition.mode)
        rec = scope.record
        inst = self.definition.executor.start(data, scope)
        rec.workflow_path = inst.path
        plays = iter(self.scenario.outcomes)
        call = inst.advance()
        while call is not None:
            if call.operation == "upstream/dispatch":
                attempt = scope.begin_attempt()
                node = attempt.node
                out = dict(next(plays))
                out["node"] = node
                out["tried"] = list(scope.tried)
                attempt.outcome, attempt.error_class = out["kind"], out.get("error_class")
                if out["kind"] == "ok":
                    rec.node = node
                inst.complete(out)
            elif call.operation in ("clock/wait", TIMER_OPERATION):
                seconds = float(call.params.get("seconds", 0.0))
                clock.advance(seconds)
                inst.complete({"seconds": seconds})
            else:  # e.g. admission/wait: the pool is never saturated here, so this is a bench bug
                raise RuntimeError(f"unexpected external operation {call.operation!r} in {call.task_id}")
            call = inst.advance()
        return str(inst.data["result"]["status"])


def measure_engine(n: int = 2000, *, engines: Sequence[str] = ENGINES,
                   scenarios: Sequence[EngineScenario] = SCENARIOS, warmup: int = 50,
                   max_seconds: float = 30.0, process_path: Path | None = None) -> dict[str, Any]:
    """CPU µs per request for each executor and scenario.

    Returns ``{"process": path, "n": n, "rows": [{"engine", "scenario", "n", "cpu_us": {p50, p90, p99,
    max, mean, n}, "wall_us": {...}}, ...]}``. Raises RuntimeError when a scenario does not end in
    its expected status (the benchmark would be measuring something else).
    """
    path = process_path or default_process_path()
    rows: list[dict[str, Any]] = []
    for engine in engines:
        definition = load_process(path, SERVICES, engine=engine, required=REQUIRED_TASKS)
        if definition.mode != engine:
            raise RuntimeError(f"{path.name} runs on {definition.mode}, not {engine}")
        for sc in scenarios:
            drv = _Driver(definition, sc)
            t_end = time.monotonic() + max_seconds
            for _ in range(warmup):
                status = drv.one()
                if status != sc.status:
                    raise RuntimeError(f"{engine}/{sc.name}: request ended {status!r}, "
                                       f"expected {sc.status!r}")
                if time.monotonic() > t_end:
                    break
            cpu: list[float] = []
            wall: list[float] = []
            t_end = time.monotonic() + max_seconds
            for _ in range(n):
                c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
                drv.one()
                w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
                cpu.append((c1 - c0) / 1e3)
                wall.append((w1 - w0) / 1e3)
                if time.monotonic() > t_end:
                    break
            rows.append({"engine": engine, "scenario": sc.name, "n": len(cpu), "records": drv.submitted,
                         "cpu_us": pcts(cpu), "wall_us": pcts(wall)})
    return {"process": str(path), "n": n, "rows": rows}
