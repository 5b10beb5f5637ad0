"""The shipped process and its edited copies change behaviour without a Python change."""

from __future__ import annotations

import pytest

from inferlb.errors import ProcessValidationError
from inferlb.tasks import REQUIRED_TASKS, SERVICES
from inferlb.workflow.definition import load_process
from tests.processes.harness import FIXTURES, MAIN, run_scenario

RETRY = {"kind": "retryable", "status": 503, "error_class": "upstream_status", "retry_after_s": None}
OK = {"kind": "ok", "status": 200, "error_class": None, "retry_after_s": None}


@pytest.mark.parametrize("engine", ["compiled", "spiff"])
def test_retry_limit_comes_from_the_bpmn(engine: str) -> None:
    shipped = run_scenario(MAIN, engine, [RETRY, RETRY, RETRY])
    edited = run_scenario(FIXTURES / "inference_request_retry1.bpmn", engine, [RETRY])
    assert len(shipped.dispatched) == 3
    assert len(edited.dispatched) == 1
    assert edited.data["retry"]["reason"] == "1 attempts made (max 1)"
    assert edited.data["result"]["status"] == "upstream_error"


@pytest.mark.parametrize("engine", ["compiled", "spiff"])
def test_script_task_tags_the_audit_record(engine: str) -> None:
    res = run_scenario(FIXTURES / "inference_request_tagged.bpmn", engine, [RETRY, OK])
    assert "tag_record" in res.path
    assert res.records[0].tags == {"flow": "tagged", "attempts": 2}


def test_backoff_delays_are_bounded_full_jitter() -> None:
    res = run_scenario(MAIN, "compiled", [RETRY, RETRY, RETRY])
    # retry 1: [0, 25 ms), retry 2: [0, 75 ms) (Envoy's full jitter, base 25 ms)
    assert len(res.waits) == 2
    assert 0 <= res.waits[0] < 0.025 and 0 <= res.waits[1] < 0.075


def test_timer_process_runs_on_spiff_with_auto() -> None:
    d = load_process(FIXTURES / "with_timer.bpmn", SERVICES, engine="auto", required=REQUIRED_TASKS)
    assert d.mode == "spiff"
    assert ("wait_timer", "IntermediateCatchEvent") in d.compiled_problems
    with pytest.raises(ProcessValidationError, match="wait_timer"):
        load_process(FIXTURES / "with_timer.bpmn", SERVICES, engine="compiled", required=REQUIRED_TASKS)


def test_timer_process_retries_through_the_timer() -> None:
    res = run_scenario(FIXTURES / "with_timer.bpmn", "spiff", [RETRY, OK])
    assert "wait_timer" in res.path
    assert res.data["result"]["status"] == "ok"
    # SpiffWorkflow timers read the wall clock, so the harness (which never sleeps) is asked to
    # wait again until the fire time passes; the first wait is the whole computed backoff.
    assert res.waits and 0 < res.waits[0] < 0.025
    assert res.dispatched[0] != res.dispatched[1]


def test_unknown_operation_is_reported_with_element_id() -> None:
    with pytest.raises(ProcessValidationError) as ei:
        load_process(FIXTURES / "broken_unknown_op.bpmn", SERVICES, required=REQUIRED_TASKS)
    assert any(eid == "mystery" and "nope/unknown" in msg for eid, msg in ei.value.problems)


def test_missing_required_task_is_reported() -> None:
    with pytest.raises(ProcessValidationError) as ei:
        load_process(FIXTURES / "missing_dispatch.bpmn", SERVICES, required=REQUIRED_TASKS)
    assert any(eid == "dispatch" and "upstream/dispatch" in msg for eid, msg in ei.value.problems)


@pytest.mark.parametrize("engine", ["compiled", "spiff"])
def test_every_routing_decision_is_kept_with_its_attempt(engine: str) -> None:
    res = run_scenario(MAIN, engine, [RETRY, RETRY, OK])
    rec = res.records[0]
    assert [(d["attempt"], d["pick"]) for d in rec.decisions] == list(enumerate(res.dispatched, start=1))
    assert [a.node for a in rec.attempts] == res.dispatched and len(set(res.dispatched)) == 3
    assert rec.deadline_at is not None and rec.deadline_at > rec.received_at


@pytest.mark.parametrize("engine", ["compiled", "spiff"])
def test_a_refused_node_with_no_other_left_spends_no_retry(engine: str) -> None:
    fleet = {"models": [{"name": "m"}], "nodes": [{"name": "a", "url": "http://127.0.0.1:1", "models": ["m"]}]}
    refused = {"kind": "retryable", "status": None, "error_class": "connect_error", "retry_after_s": None}
    res = run_scenario(MAIN, engine, [refused], fleet=fleet)
    assert res.data["retry"] == {"retry": False, "delay_s": 0.0, "attempt": 1, "reason": "no other available node"}
    assert res.waits == []
    result = res.data["result"]
    assert result["http_status"] == 503 and result["error"]["code"] == "no_healthy_upstream"
    assert result["retry_after_s"] >= 1
