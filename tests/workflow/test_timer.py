"""The one timer-driven BPMN runner (workflow/timer.py): a fresh instance per round performed by
the owner's performers, the process read at every round, the round accounting (rounds, standby,
failures reported once and cleared by a good round). Health, autoscale and rollout run their
real processes on it (tests/health, tests/autoscale, tests/rollout); here the executor is a
stand-in that parks on the calls it is given, so only the runner is under test."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from inferlb.errors import WorkflowRuntimeError
from inferlb.workflow.base import ExternalCall
from inferlb.workflow.spiff import TIMER_OPERATION
from inferlb.workflow.timer import WAITS, ProcessTimer, waits

log = logging.getLogger("test.timer")


@dataclass
class _Inst:
    calls: list[ExternalCall]
    data: dict[str, Any] = field(default_factory=dict)
    path: list[str] = field(default_factory=list)
    _parked: ExternalCall | None = None

    def advance(self) -> ExternalCall | None:
        self._parked = self.calls.pop(0) if self.calls else None
        if self._parked is not None:
            self.path.append(self._parked.task_id)
        return self._parked

    def complete(self, result: dict[str, Any]) -> None:
        assert self._parked is not None
        self.data[self._parked.result_var] = result

    @property
    def finished(self) -> bool:
        return not self.calls


@dataclass
class _Executor:
    ops: list[str]
    mode: str = "stand-in"
    started: list[tuple[dict[str, Any], Any]] = field(default_factory=list)

    def start(self, data: dict[str, Any], scope: Any) -> _Inst:
        self.started.append((data, scope))
        return _Inst([ExternalCall(f"t{i}", op, {"n": i}, f"r{i}") for i, op in enumerate(self.ops)])


@dataclass
class _Definition:
    executor: _Executor


def _timer(process: Any, **kw: Any) -> ProcessTimer[Any]:
    async def run_round(n: int) -> int:
        return n

    kw.setdefault("run_round", run_round)
    return ProcessTimer("test-timer", what="test", process=lambda: process, interval_s=lambda: 60.0, logger=log, **kw)


async def test_an_instance_is_started_fresh_and_its_external_tasks_performed_in_order() -> None:
    definition = _Definition(_Executor(["probe", "clock/wait", TIMER_OPERATION]))
    seen: list[str] = []

    async def probe(call: ExternalCall) -> dict[str, Any]:
        seen.append(call.operation)
        return {"count": call.params["n"] + 1}

    async def wait(call: ExternalCall) -> dict[str, Any]:
        seen.append(call.operation)
        return {"seconds": 0.0}

    timer = _timer(definition)
    scope = object()
    inst = await timer.run_instance({"round": 1}, scope, {"probe": probe, **waits(wait)})
    assert seen == ["probe", "clock/wait", TIMER_OPERATION] and set(WAITS) == {"clock/wait", TIMER_OPERATION}
    assert inst.data == {"r0": {"count": 1}, "r1": {"seconds": 0.0}, "r2": {"seconds": 0.0}}
    assert inst.path == ["t0", "t1", "t2"] and definition.executor.started == [({"round": 1}, scope)]
    second = await timer.run_instance({"round": 2}, scope, {"probe": probe, **waits(wait)})
    assert second is not inst and len(definition.executor.started) == 2


async def test_an_operation_without_a_performer_names_the_task() -> None:
    timer = _timer(_Definition(_Executor(["health/probe"])))
    with pytest.raises(WorkflowRuntimeError, match="no performer for external operation 'health/probe'") as err:
        await timer.run_instance({}, None, {})
    assert "t0" in str(err.value)


async def test_no_process_loaded_is_an_error_and_the_process_is_read_at_every_round() -> None:
    current: list[Any] = [None]
    timer: ProcessTimer[Any] = ProcessTimer("test-timer", what="rollout", process=lambda: current[0],
                                            interval_s=lambda: 1.0, run_round=lambda n: _noop(), logger=log)
    with pytest.raises(RuntimeError, match="no rollout process loaded"):
        await timer.run_instance({}, None, {})
    current[0] = _Definition(_Executor([]))          # a reload loads one
    assert (await timer.run_instance({}, None, {})).path == []


async def _noop() -> None:
    return None


async def test_rounds_failures_and_standby_are_counted_and_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    outcomes = iter([ValueError("bad parameter"), None])
    leading = [True]

    async def run_round(n: int) -> int:
        exc = next(outcomes)
        if exc is not None:
            raise exc
        return n

    async def standby() -> int:
        return -1

    timer = _timer(None, run_round=run_round, leader=lambda: leading[0], standby=standby)
    with caplog.at_level(logging.WARNING, "test.timer"):
        assert await timer.run_logged() is False
    assert timer.rounds == 1 and timer.failed_rounds == 1 and timer.last_error == "ValueError: bad parameter"
    msgs = [r.getMessage() for r in caplog.records if r.name == "test.timer"]
    assert len(msgs) == 1 and msgs[0].startswith("test round 1 failed: ValueError: bad parameter; retrying in ")
    assert await timer.run_logged() is True and timer.last_error is None and timer.rounds == 2
    leading[0] = False
    assert await timer.run_once() == -1 and timer.standby_rounds == 1 and timer.rounds == 2
