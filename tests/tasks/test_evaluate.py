"""``request/evaluate`` adapts the engine's model rules (engine/outcomes.py) to the process data."""

from __future__ import annotations

import pytest

from inferlb.engine.scope import Runtime
from inferlb.tasks.evaluate import evaluate
from tests.tasks.conftest import start


@pytest.mark.parametrize(("endpoint", "model", "kw", "status", "code", "param"), [
    ("chat", "nope", {}, 404, "model_not_found", "model"),
    ("chat", "emb", {}, 400, "model_not_supported", "model"),
    ("embeddings", "m", {}, 400, "model_not_supported", "model"),
    ("responses", "m", {}, 501, "unsupported_endpoint", None),          # a tgi node cannot serve it
    ("chat", "m", {"max_tokens": 101}, 400, "max_tokens_too_large", "max_tokens"),
    ("chat", "m", {"max_tokens": 100, "prompt_bytes": 4000}, 400, "context_length_exceeded", "messages"),
])
def test_refusals_name_status_code_and_param(rt: Runtime, endpoint: str, model: str, kw: dict[str, int],
                                             status: int, code: str, param: str | None) -> None:
    scope, data = start(rt, endpoint, model, **kw)
    out = evaluate(scope, data, {})
    assert (out["ok"], out["status"], out["code"], out["param"]) == (False, status, code, param)
    assert out["message"] and scope.model == "" and scope.output_budget == 0   # nothing decided


def test_an_admissible_request_gets_its_budget_and_deadline_once(rt: Runtime) -> None:
    scope, data = start(rt, max_tokens=10, n=3, deadline_s=5.0, priority="batch")
    out = evaluate(scope, data, {})
    assert out["ok"] and out["model"] == "m" and out["output_budget"] == 30 == scope.output_budget
    assert out["deadline_s"] == 5.0 and scope.deadline_at == scope.received_mono + 5.0
    assert scope.record.deadline_at == pytest.approx(scope.record.received_at + 5.0)
    assert (scope.model, scope.models_tried, scope.record.priority) == ("m", ["m"], "batch")
    scope, data = start(rt, "embeddings", "emb", deadline_s=500.0)
    out = evaluate(scope, data, {})
    assert out["ok"] and out["output_budget"] == 0 and out["deadline_s"] == 60.0   # capped by total_s
