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

Each row has three figures, so the process can be read apart from what it calls:

* ``cpu_us``: the whole request as above (the gateway's start/attempt bookkeeping, the process
  and every service operation);
* ``process_cpu_us``: the process alone: the executor, its conditions and parameter expressions
  and the data passing, with every service operation (and every external one) answered by a stub
  returning the result the real one gave on a recorded request of the same scenario (a constant:
  a list lookup). Starts from the same start data, without the gateway's bookkeeping; the stubbed
  run must visit the same elements and end in the same status, or the row is refused;
* ``ops_us``: the time spent inside the real service operations per request, measured in a third
  pass around each call with ``time.perf_counter_ns`` (the thread CPU clock costs ≈ 1.7 µs a read
  here, too much to put around each call; the operations do no I/O, so wall ≈ CPU).

``cpu_us.mean - process_cpu_us.mean - ops_us.mean`` is the bookkeeping of the scripted gateway
(``begin_request``, ``begin_attempt``) plus the measurement overhead.

``python -m inferlb.bench.engine --help`` runs it alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferlb.app import request_end
from inferlb.bench.loadgen.results import pcts
from inferlb.config.settings import Settings, fleet_from_mapping
from inferlb.engine.scope import IncomingRequest, Runtime, begin_request, build_runtime
from inferlb.store.records import RequestRecord
from inferlb.tasks import REQUIRED_TASKS, SERVICES
from inferlb.types import ManualClock
from inferlb.workflow.definition import ProcessDefinition, load_process
from inferlb.workflow.services import ServiceSpec, ServiceTable
from inferlb.workflow.spiff import TIMER_OPERATION

__all__ = ["ENGINES", "SCENARIOS", "EngineScenario", "default_process_path", "main", "measure_engine"]

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
    from inferlb.app import default_processes_dir

    return default_processes_dir() / "inference_request.bpmn"


class _Driver:
    """Runs scripted requests through one loaded process over one runtime.

    ``calls``, when set, receives ``(operation, result)`` for every external operation the driver
    completes (the recording of :class:`_Replay`).
    """

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
        self.calls: list[tuple[str, dict[str, Any]]] | None = None
        self.start_data: dict[str, Any] = {}
        self.path: list[str] = []

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
        if self.calls is not None:
            self.start_data = dict(data)
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
            elif call.operation in ("clock/wait", TIMER_OPERATION):
                seconds = float(call.params.get("seconds", 0.0))
                clock.advance(seconds)
                out = {"seconds": seconds}
            else:  # e.g. admission/wait: the pool is never saturated here, so this is a bench bug
                raise RuntimeError(f"unexpected external operation {call.operation!r} in {call.task_id}")
            if self.calls is not None:
                self.calls.append((call.operation, out))
            inst.complete(out)
            call = inst.advance()
        self.path = inst.path
        return str(inst.data["result"]["status"])


class _Replay:
    """Answers every operation of one request with the results a recorded request got, in order."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.calls = calls
        self.i = 0

    def take(self, operation: str) -> dict[str, Any]:
        op, result = self.calls[self.i]
        if op != operation:
            raise RuntimeError(f"replay expected {op!r}, the process called {operation!r}")
        self.i += 1
        return result

    def stub(self, operation: str) -> Callable[[Any, Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]:
        take = self.take
        return lambda scope, data, params: take(operation)


def _recording(services: ServiceTable, calls: list[tuple[str, dict[str, Any]]]) -> ServiceTable:
    """The table with every operation also appending ``(operation, result)`` to ``calls``."""
    def wrap(op: str, fn: Any) -> Any:
        def recorded(scope: Any, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
            result: dict[str, Any] = fn(scope, data, params)
            calls.append((op, result))
            return result
        return recorded
    return {op: dataclasses.replace(s, fn=wrap(op, s.fn)) if s.fn is not None else s for op, s in services.items()}


def _timed(services: ServiceTable, spent: list[int]) -> ServiceTable:
    """The table with the time inside every operation added to ``spent[0]`` (ns)."""
    clock = time.perf_counter_ns

    def wrap(fn: Any) -> Any:
        def timed(scope: Any, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
            t0 = clock()
            try:
                result: dict[str, Any] = fn(scope, data, params)
            finally:
                spent[0] += clock() - t0
            return result
        return timed
    return {op: dataclasses.replace(s, fn=wrap(s.fn)) if s.fn is not None else s for op, s in services.items()}


def _stubbed(services: ServiceTable, replay: _Replay) -> dict[str, ServiceSpec]:
    return {op: dataclasses.replace(s, fn=replay.stub(op)) if s.fn is not None else s for op, s in services.items()}


def _loop(n: int, max_seconds: float, body: Callable[[], Any]) -> list[float]:
    """Thread CPU µs of ``body()`` per call, ``n`` calls or ``max_seconds``, whichever ends first."""
    cpu: list[float] = []
    t_end = time.monotonic() + max_seconds
    for _ in range(n):
        c0 = time.thread_time_ns()
        body()
        cpu.append((time.thread_time_ns() - c0) / 1e3)
        if time.monotonic() > t_end:
            break
    return cpu


def _process_alone(path: Path, engine: str, sc: EngineScenario, n: int, warmup: int,
                   max_seconds: float) -> list[float]:
    """CPU µs per request of the process with every operation stubbed (see the module docstring)."""
    calls: list[tuple[str, dict[str, Any]]] = []
    rec_def = load_process(path, _recording(SERVICES, calls), engine=engine, required=REQUIRED_TASKS)
    drv = _Driver(rec_def, sc)
    drv.calls = calls
    drv.one()
    want_path, start_data = list(drv.path), drv.start_data
    replay = _Replay(calls)
    executor = load_process(path, _stubbed(SERVICES, replay), engine=engine, required=REQUIRED_TASKS).executor

    def run(data: dict[str, Any]) -> Any:
        replay.i = 0
        inst = executor.start(data, None)
        call = inst.advance()
        while call is not None:
            inst.complete(replay.take(call.operation))
            call = inst.advance()
        return inst

    inst = run(dict(start_data))
    status = inst.data["result"]["status"]
    if inst.path != want_path or status != sc.status or replay.i != len(calls):
        raise RuntimeError(f"{engine}/{sc.name}: the stubbed process went {inst.path} ({status!r}), "
                           f"the real one {want_path}")
    for _ in range(warmup):
        run(dict(start_data))
    datas = [dict(start_data) for _ in range(n)]   # built outside the measurement: the process's input
    it = iter(datas)
    return _loop(n, max_seconds, lambda: run(next(it)))


def measure_engine(n: int = 2000, *, engines: Sequence[str] = ENGINES,
                   scenarios: Sequence[EngineScenario] = SCENARIOS, warmup: int = 50,
                   max_seconds: float = 30.0, process_path: Path | None = None) -> dict[str, Any]:
    """CPU µs per request for each executor and scenario.

    Returns ``{"process": path, "n": n, "rows": [{"engine", "scenario", "n", "records", "cpu_us": {p50,
    p90, p99, max, mean, n}, "wall_us": {...}, "process_cpu_us": {...}, "ops_us": {...}}, ...]}`` (see
    the module docstring for the three figures). Raises RuntimeError when a scenario does not end
    in its expected status (the benchmark would be measuring something else).
    """
    path = process_path or default_process_path()
    rows: list[dict[str, Any]] = []
    for engine in engines:
        definition = load_process(path, SERVICES, engine=engine, required=REQUIRED_TASKS)
        if definition.mode != engine:
            raise RuntimeError(f"{path.name} runs on {definition.mode}, not {engine}")
        spent = [0]
        timed_def = load_process(path, _timed(SERVICES, spent), engine=engine, required=REQUIRED_TASKS)
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
            process = _process_alone(path, engine, sc, n, warmup, max_seconds)
            tdrv = _Driver(timed_def, sc)
            for _ in range(warmup):
                tdrv.one()
            ops: list[float] = []
            t_end = time.monotonic() + max_seconds
            for _ in range(n):
                spent[0] = 0
                tdrv.one()
                ops.append(spent[0] / 1e3)
                if time.monotonic() > t_end:
                    break
            rows.append({"engine": engine, "scenario": sc.name, "n": len(cpu), "records": drv.submitted,
                         "cpu_us": pcts(cpu), "wall_us": pcts(wall), "process_cpu_us": pcts(process),
                         "ops_us": pcts(ops)})
    return {"process": str(path), "n": n, "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m inferlb.bench.engine``: the engine-alone table (also part of ``inferlb bench overhead``)."""
    from inferlb.bench.report import engine_table, format_table

    ap = argparse.ArgumentParser(prog="python -m inferlb.bench.engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="requests per executor and scenario (2000)")
    ap.add_argument("--warmup", type=int, default=50, help="unmeasured requests first (50)")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated executors (compiled,spiff)")
    ap.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS),
                    help="comma-separated scenarios (ok,retry,fallback)")
    ap.add_argument("--max-seconds", type=float, default=30.0, help="cap on each measured loop (30)")
    ap.add_argument("--process", type=Path, default=None, help="BPMN file (the shipped inference_request.bpmn)")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw result here")
    ap.add_argument("--markdown", action="store_true", help="markdown table")
    args = ap.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    by_name = {s.name: s for s in SCENARIOS}
    names = [s for s in args.scenarios.split(",") if s]
    unknown = [x for x in engines if x not in ENGINES] + [x for x in names if x not in by_name]
    if unknown:
        ap.error(f"unknown executor or scenario: {', '.join(unknown)}")
    out = measure_engine(args.n, engines=engines, scenarios=[by_name[s] for s in names], warmup=args.warmup,
                         max_seconds=args.max_seconds, process_path=args.process)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
    print(format_table(engine_table(out), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
