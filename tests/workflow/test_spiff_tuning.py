"""The spiff executor's tuning (inferlb/workflow/spiff.py) changes what SpiffWorkflow builds,
never what a process does: same path and same data as SpiffWorkflow's own prediction."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from inferlb.tasks import REQUIRED_TASKS, SERVICES
from inferlb.workflow.definition import load_process
from inferlb.workflow.parser import LazyExclusiveGateway
from inferlb.workflow.spiff import SpiffExecutor
from tests.processes.harness import FIXTURES, MAIN, make_request, run_scenario
from tests.workflow.test_differential import FALLBACK_FLEET, SCENARIOS

OK = {"kind": "ok", "status": 200, "error_class": None, "retry_after_s": None}
RETRY = {"kind": "retryable", "status": 503, "error_class": "upstream_status", "retry_after_s": None}


def _gateways(path: Any) -> list[LazyExclusiveGateway]:
    d = load_process(path, SERVICES, engine="spiff", required=REQUIRED_TASKS)
    return [ts for ts in d.spec.task_specs.values() if isinstance(ts, LazyExclusiveGateway)]


@pytest.mark.parametrize("process", [MAIN, FIXTURES / "inference_request_spiff_ops.bpmn"], ids=["camunda", "spiff_ops"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_lazy_gateways_run_like_full_prediction(process: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = SCENARIOS[name]
    lazy = run_scenario(process, "spiff", sc["outcomes"], request=sc.get("request"), queue=sc.get("queue"))
    monkeypatch.setattr(SpiffExecutor, "lazy_gateways", False)
    full = run_scenario(process, "spiff", sc["outcomes"], request=sc.get("request"), queue=sc.get("queue"))
    assert lazy.path == full.path
    assert lazy.data == full.data
    assert lazy.dispatched == full.dispatched
    assert [r.status for r in lazy.records] == [r.status for r in full.records] == [sc["status"]]


def test_lazy_gateways_on_fallback_run_like_full_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    lazy = run_scenario(MAIN, "spiff", [RETRY, OK], fleet=FALLBACK_FLEET)
    monkeypatch.setattr(SpiffExecutor, "lazy_gateways", False)
    full = run_scenario(MAIN, "spiff", [RETRY, OK], fleet=FALLBACK_FLEET)
    assert lazy.path == full.path and lazy.data == full.data and lazy.dispatched == full.dispatched


def _removed_tasks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Tasks SpiffWorkflow built and then removed (predicted branches not taken), one ok request."""
    removed: list[Any] = []
    start = SpiffExecutor.start

    def counting_start(self: SpiffExecutor, data: dict[str, Any], scope: Any) -> Any:
        inst = start(self, data, scope)
        inst.wf.task_removed_event.connect(lambda wf, task: removed.append(task))
        return inst

    monkeypatch.setattr(SpiffExecutor, "start", counting_start)
    assert run_scenario(MAIN, "spiff", [OK], request=make_request()).data["result"]["status"] == "ok"
    return len(removed)


def test_lazy_gateways_build_no_branch_they_do_not_take(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _removed_tasks(monkeypatch) == 0
    monkeypatch.setattr(SpiffExecutor, "lazy_gateways", False)
    assert _removed_tasks(monkeypatch) > 0    # SpiffWorkflow's own prediction builds them


def test_processes_that_wait_keep_full_prediction() -> None:
    assert _gateways(MAIN) and not any(g.predict_branches for g in _gateways(MAIN))
    timer = _gateways(FIXTURES / "with_timer.bpmn")
    assert timer and all(g.predict_branches for g in timer)


def test_workflow_log_records_still_carry_their_extras(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="spiff.workflow"):
        run_scenario(MAIN, "spiff", [OK])
    done = [r for r in caplog.records if r.name == "spiff.workflow" and r.getMessage() == "Workflow completed"]
    assert len(done) == 1 and done[0].workflow_spec == "inference_request" and done[0].completed is False
