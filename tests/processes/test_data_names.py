"""Validation reads every condition, script and parameter: a name or key nothing writes is an error
with the element id, found when the file is loaded, not as a 500 on every request later.

Each fixture is processes/inference_request.bpmn with one edit (see the fixture's name).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlb.errors import ProcessValidationError
from inferlb.tasks import HEALTH_REQUIRED_TASKS, HEALTH_START_DATA, REQUEST_START_DATA, REQUIRED_TASKS, SERVICES
from inferlb.workflow.datacheck import data_problems
from inferlb.workflow.definition import load_process
from inferlb.workflow.parser import make_parser, sequence_flows
from tests.processes.harness import FIXTURES, MAIN, run_scenario

ROOT = MAIN.parents[1]


def _problems(path: Path) -> list[tuple[str, str]]:
    with pytest.raises(ProcessValidationError) as ei:
        load_process(path, SERVICES, required=REQUIRED_TASKS, start_data=REQUEST_START_DATA)
    assert ei.value.source == str(path)
    return ei.value.problems


@pytest.mark.parametrize(("fixture", "element", "needles"), [
    # routing["okk"]: every request would be a 500 at gw_routed.
    ("typo_routing_key.bpmn", "gw_routed", ["flow_routed_yes", "routing['okk']", "routing/select"]),
    # retry["retyr"]: 200s until a node fails, then every retry a 500.
    ("typo_retry_key.bpmn", "gw_retry", ["flow_retry_yes", "retry['retyr']", "delay_s"]),
    # admision["admitted"]: a typo of the variable, not of the key.
    ("typo_variable_name.bpmn", "gw_admitted", ["flow_admitted_yes", "'admision'", "no operation"]),
    # admission.get("queu", False): no error at run time, the queue branch would silently never run.
    ("typo_get_key.bpmn", "gw_admitted", ["flow_admitted_queue", "admission['queu']"]),
    # a parameter is Python too: the wait task's seconds = retry["delay"].
    ("typo_parameter_key.bpmn", "wait", ["parameter 'seconds'", "retry['delay']"]),
    # a script on the done path reads retry, which is unset when the first attempt succeeded.
    ("unset_on_some_paths.bpmn", "tag_record", ["script", "'retry'", "not set on every path", "backoff"]),
])
def test_each_typo_is_one_problem_naming_the_element(fixture: str, element: str, needles: list[str]) -> None:
    problems = _problems(FIXTURES / fixture)
    assert len(problems) == 1, problems
    eid, msg = problems[0]
    assert eid == element
    for n in needles:
        assert n in msg, msg


@pytest.mark.parametrize("engine", ["compiled", "spiff"])
def test_the_typo_really_fails_requests_at_run_time(engine: str) -> None:
    """What validation prevents: loaded without the check, routing["okk"] fails the request."""
    from inferlb.errors import WorkflowRuntimeError

    with pytest.raises(WorkflowRuntimeError, match="gw_routed"):
        run_scenario(FIXTURES / "typo_routing_key.bpmn", engine, [{"kind": "ok", "status": 200}])


def _request_files() -> list[Path]:
    broken = {"broken_unknown_op.bpmn", "missing_dispatch.bpmn", "unset_on_some_paths.bpmn"}
    examples = sorted(p for p in FIXTURES.glob("*.bpmn") if p.name not in broken and not p.name.startswith("typo_"))
    return [MAIN, *examples]


@pytest.mark.parametrize("path", _request_files(), ids=lambda p: p.name)
def test_shipped_and_example_request_processes_pass(path: Path) -> None:
    d = load_process(path, SERVICES, required=REQUIRED_TASKS, start_data=REQUEST_START_DATA)
    assert d.process_id == "inference_request"


@pytest.mark.parametrize("path", [ROOT / "processes" / "node_health.bpmn",
                                  *sorted((ROOT / "tests" / "health" / "fixtures").glob("*.bpmn"))],
                         ids=lambda p: p.name)
def test_health_processes_pass(path: Path) -> None:
    load_process(path, SERVICES, engine="spiff", required=HEALTH_REQUIRED_TASKS, start_data=HEALTH_START_DATA)


def test_a_variable_no_operation_writes_is_named() -> None:
    """Without the operation that writes ``routing``, the condition reading it is the problem."""
    p = make_parser()
    p.add_bpmn_file(str(MAIN))
    spec = p.get_spec("inference_request")
    assert data_problems(spec, SERVICES, REQUEST_START_DATA, sequence_flows(str(MAIN))) == []
    without_routing = {k: v for k, v in SERVICES.items() if k != "routing/select"}
    problems = data_problems(spec, without_routing, REQUEST_START_DATA, sequence_flows(str(MAIN)))
    assert [e for e, _ in problems] == ["gw_routed"]
    assert "'routing'" in problems[0][1] and "flow_routed_yes" in problems[0][1]


def test_validation_is_pure() -> None:
    """Loading twice gives the same answer and leaves the file as it was (reload relies on it)."""
    before = (FIXTURES / "typo_retry_key.bpmn").read_bytes()
    assert _problems(FIXTURES / "typo_retry_key.bpmn") == _problems(FIXTURES / "typo_retry_key.bpmn")
    assert (FIXTURES / "typo_retry_key.bpmn").read_bytes() == before


async def test_app_start_up_refuses_the_typo_before_opening_anything(tmp_path: Path) -> None:
    """create_app's lifespan validates the same way, first: nothing is started, so nothing leaks."""
    from inferlb.app import create_app
    from tests.support import fleet_for, settings_for

    pdir = tmp_path / "processes"
    pdir.mkdir()
    (pdir / "inference_request.bpmn").write_bytes((FIXTURES / "typo_routing_key.bpmn").read_bytes())
    (pdir / "node_health.bpmn").write_bytes((ROOT / "processes" / "node_health.bpmn").read_bytes())
    app = create_app(settings_for(tmp_path, fleet_for({"a": "http://127.0.0.1:9"}), processes_dir=pdir))
    with pytest.raises(ProcessValidationError, match=r"gw_routed: condition of flow_routed_yes reads routing\['okk'\]"):
        async with app.router.lifespan_context(app):
            pass
    assert not (tmp_path / "audit.db").exists() and not (tmp_path / "journal").exists()


@pytest.mark.parametrize(("script", "needle"), [
    ('return {"flow": "tagged"}', "'return' outside function"),
    ("break", "'break' outside loop"),
    ('tags = {"flow": "tagged"', "was never closed"),
])
def test_a_script_that_parses_but_cannot_run_names_its_element(tmp_path: Path, script: str, needle: str) -> None:
    """Scripts are compiled as the engine compiles them: 'return' at a script's top level parses
    (ast.parse) but fails on every request; validation says so at load (and reload) time."""
    src = (FIXTURES / "inference_request_tagged.bpmn").read_text()
    good = 'tags = {"flow": "tagged", "attempts": len(outcome.get("tried", []))}'
    assert good in src
    path = tmp_path / "inference_request.bpmn"
    path.write_text(src.replace(good, script))
    problems = _problems(path)
    assert len(problems) == 1, problems
    eid, msg = problems[0]
    assert eid == "tag_record" and "script is not valid Python" in msg and needle in msg, msg
