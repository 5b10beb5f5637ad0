"""``request/evaluate`` resolves a model alias to its tier (tiers/router.py): the tier becomes the
request's model, the choice goes to the audit record and into ``evaluation`` (``tier``,
``tier_score``) for the process's conditions; a tier whose context or output limit does not hold
the request is passed over; a model that is no alias carries no tier."""

from __future__ import annotations

from functools import partial
from typing import Any

from inferlb.app import request_end
from inferlb.config.settings import Settings, fleet_from_mapping
from inferlb.engine.scope import IncomingRequest, RequestScope, Runtime, begin_request, build_runtime
from inferlb.tasks.evaluate import evaluate
from inferlb.types import ManualClock


def runtime() -> Runtime:
    cfg = fleet_from_mapping({
        "models": [{"name": "auto", "tiers": {"models": [{"model": "small", "max_score": 0.3}, {"model": "large"}]}},
                   {"name": "small", "max_output_tokens": 100, "default_max_tokens": 16, "max_context_tokens": 400},
                   {"name": "large", "max_output_tokens": 1000, "default_max_tokens": 16,
                    "max_context_tokens": 100_000}],
        "nodes": [{"name": "n0", "url": "http://127.0.0.1:1", "models": ["small"]},
                  {"name": "n1", "url": "http://127.0.0.1:2", "models": ["large"]}],
    })
    return build_runtime(Settings(), cfg, clock=ManualClock(), seed=1, end=partial(request_end, audit=lambda r: None))


def run(rt: Runtime, model: str = "auto", **kw: Any) -> tuple[dict[str, Any], RequestScope]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    scope, data = begin_request(rt, IncomingRequest(endpoint="chat", model=model, body=body, **kw))
    return evaluate(scope, data, {}), scope


def test_an_alias_resolves_to_its_tier_and_says_so() -> None:
    rt = runtime()
    out, scope = run(rt, prompt_bytes=8)
    assert out["ok"] and out["model"] == "small" and out["tier"] == "small"
    assert isinstance(out["tier_score"], float) and out["tier_score"] <= 0.3
    assert scope.model == "small" and scope.models_tried == ["small"]
    tier = scope.record.tags["tier"]
    assert tier == scope.tier and tier["alias"] == "auto" and tier["model"] == "small"
    assert scope.record.model_requested == "auto"


def test_a_tier_that_cannot_hold_the_request_is_passed_over() -> None:
    rt = runtime()
    long, _ = run(rt, prompt_bytes=2000)           # about 500 tokens: over small's context of 400
    assert long["model"] == "large" and long["tier"] == "large"
    wide, scope = run(rt, max_tokens=150, prompt_bytes=8)   # over small's output limit of 100
    assert wide["model"] == "large"
    assert "does not fit its context or output limit" in scope.record.tags["tier"]["why"]


def test_the_tier_models_limits_apply_not_the_aliass() -> None:
    rt = runtime()
    big, _ = run(rt, max_tokens=900, prompt_bytes=8)          # over small's 100, within large's 1000
    assert big["ok"] and big["model"] == "large"
    over, scope = run(rt, max_tokens=5000, prompt_bytes=8)    # over every tier's limit: the last tier's 400
    assert over["ok"] is False and over["code"] == "max_tokens_too_large"
    assert scope.record.tags["tier"]["model"] == "large"      # the choice is still on the record


def test_a_model_that_is_no_alias_has_no_tier() -> None:
    out, scope = run(runtime(), model="small", prompt_bytes=8)
    assert out["ok"] and out["tier"] is None and out["tier_score"] is None
    assert "tier" not in scope.record.tags and scope.tier is None
