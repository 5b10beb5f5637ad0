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


def test_routing_and_load_count_the_predicted_length_the_budget_still_bounds_the_rest(rt: Runtime) -> None:
    scope, data = start(rt, n=2)
    out = evaluate(scope, data, {})
    # no data yet: the estimate is the model's default (16 per choice), as without a predictor
    assert out["output_budget"] == 32 == out["output_estimate"] == scope.output_estimate
    assert rt.lengths is not None
    for _ in range(25):   # the gateway's history: short answers (engine/gateway.py _learn)
        rt.lengths.observe("m", prompt_tokens=int(out["prompt_tokens_est"]), tokens=4, endpoint="chat")
    scope, data = start(rt, n=2)
    out = evaluate(scope, data, {})
    assert out["output_budget"] == 32 and scope.output_budget == 32          # timeouts, TPM: the declared budget
    assert out["output_estimate"] == 8 == scope.output_estimate               # routing, node load: 2 × 4
    assert scope.length_estimate is not None and scope.length_estimate.level == "band"
    scope, data = start(rt, max_tokens=3)
    assert evaluate(scope, data, {})["output_estimate"] == 3                 # never above the declared cap
