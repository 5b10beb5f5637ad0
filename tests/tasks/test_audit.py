"""``audit/record`` adapts the engine's outcome table (engine/outcomes.py) into the record, then
ends the request through the end-of-request hook exactly once."""

from __future__ import annotations

from typing import Any

from inferlb.engine.scope import Runtime
from inferlb.errors import error_body
from inferlb.store.records import AttemptRecord
from inferlb.tasks.audit import record
from tests.tasks.conftest import Ended, start


def test_a_refused_request_is_recorded_and_ended_once(rt: Runtime, ended: Ended) -> None:
    scope, data = start(rt, model="nope")
    data["evaluation"] = {"ok": False, "status": 404, "code": "model_not_found",
                          "message": "The model 'nope' does not exist", "param": "model"}
    data["tags"] = {"ab": "x"}
    result = record(scope, data, {})
    assert result == {"status": "rejected", "http_status": 404, "retry_after_s": None,
                      **error_body("The model 'nope' does not exist", "invalid_request_error", "model_not_found",
                                   "model")}
    rec = scope.record
    assert (rec.status, rec.http_status, rec.error_class, rec.tags, rec.model_served) == (
        "rejected", 404, "model_not_found", {"ab": "x"}, None)
    assert ended == [rec]


def test_an_answered_request_names_the_model_served(rt: Runtime, ended: Ended) -> None:
    scope, data = start(rt)
    scope.model = "m"
    data.update(evaluation={"ok": True}, admission={"admitted": True}, outcome={"kind": "ok", "status": 200})
    result = record(scope, data, {})
    assert (result["status"], result["http_status"], result["error"]) == ("ok", 200, None)
    assert scope.record.model_served == "m" and scope.record.error_class is None and ended == [scope.record]


def test_no_reachable_node_is_a_503_not_a_502(rt: Runtime, ended: Ended) -> None:
    scope, data = start(rt)
    scope.record.attempts = [AttemptRecord(number=i, node="n0", model="m", started_at=0.0,
                                           error_class="connect_error") for i in (1, 2)]
    out: dict[str, Any] = {"kind": "retryable", "status": None, "error_class": "connect_error"}
    data.update(evaluation={"ok": True}, admission={"admitted": True}, outcome=out)
    result = record(scope, data, {})
    assert (result["http_status"], result["error"]["code"], result["retry_after_s"]) == (
        503, "no_healthy_upstream", 1.0)
    assert scope.record.error_class == "no_healthy_upstream" and len(ended) == 1
