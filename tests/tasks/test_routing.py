"""Model fallbacks: request/evaluate sends a prompt over the context window to the first
``context_window_fallbacks`` (else ``fallbacks``) model that fits; routing/fallback skips a fallback
model the request does not fit; both say in the audit row which model and why."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from inferlb.app import request_end
from inferlb.config.settings import Settings, fleet_from_mapping
from inferlb.engine.scope import Runtime, build_runtime
from inferlb.tasks.evaluate import evaluate
from inferlb.tasks.routing import fallback
from inferlb.types import ManualClock
from tests.tasks.conftest import start


def _rt(m: dict[str, Any]) -> Runtime:
    cfg = fleet_from_mapping({
        "models": [{"name": "m", "max_context_tokens": 200, "max_output_tokens": 50, **m},
                   {"name": "small", "max_context_tokens": 200},
                   {"name": "short-out", "max_context_tokens": 100_000, "max_output_tokens": 10},
                   {"name": "big", "max_context_tokens": 100_000, "versions": [{"name": "b1", "weight": 1}]},
                   {"name": "emb", "kind": "embedding", "max_context_tokens": 100_000}],
        "nodes": [{"name": "a", "url": "http://127.0.0.1:9000", "models": ["m", "small", "short-out", "big", "emb"]}],
    })
    return build_runtime(Settings(), cfg, clock=ManualClock(), seed=1, end=partial(request_end, audit=lambda r: None))


@pytest.mark.parametrize(("lists", "served"), [
    ({"fallbacks": ["small", "emb", "short-out", "big"]}, "big"),          # no dedicated list: fallbacks
    ({"fallbacks": ["small"], "context_window_fallbacks": ["big"]}, "big"),  # the dedicated list wins
])
def test_a_long_prompt_goes_to_the_first_fallback_that_fits(lists: dict[str, Any], served: str) -> None:
    rt = _rt(lists)
    scope, data = start(rt, prompt_bytes=4000, max_tokens=20, model_version="v9")   # ~1,000 tokens
    ev = evaluate(scope, data, {})
    assert ev["ok"] and ev["model"] == served == scope.model and scope.models_tried == ["m", served]
    assert ev["version"] == "b1"   # the pin named "m": the fallback model gets its own version
    assert scope.output_budget == 20 and ev["prompt_tokens_est"] > 200
    assert scope.record.model_served == served
    [move] = scope.record.tags["model_fallback"]
    assert (move["from"], move["to"], move["reason"], move["context_tokens"]) == ("m", served, "context_window", 200)


def test_no_fallback_that_fits_keeps_the_400() -> None:
    scope, data = start(_rt({"fallbacks": ["small", "short-out"]}), prompt_bytes=4000, max_tokens=20)
    ev = evaluate(scope, data, {})
    assert (ev["ok"], ev["status"], ev["code"]) == (False, 400, "context_length_exceeded")
    assert "model_fallback" not in scope.record.tags


def test_routing_fallback_skips_a_model_the_request_does_not_fit_and_says_why() -> None:
    scope, data = start(_rt({"fallbacks": ["short-out", "small", "big"]}), prompt_bytes=400, max_tokens=20)
    data["evaluation"] = evaluate(scope, data, {})
    assert data["evaluation"]["ok"] and scope.model == "m"
    data["routing"] = {"ok": False, "reason": "no node can serve"}
    out = fallback(scope, data, {})
    # short-out: max_tokens 20 is over its output limit of 10; small holds 100 + 20 of 200 tokens
    assert out == {"ok": True, "model": "small", "reason": "falling back from m"}
    assert scope.record.tags["model_fallback"] == [{"from": "m", "to": "small", "reason": "no_node"}]
    data["routing"], data["outcome"] = {"ok": True}, {"kind": "retryable", "error_class": "upstream_status"}
    out = fallback(scope, data, {})
    assert out["ok"] and scope.model == "big" and scope.record.model_served == "big"
    assert scope.record.tags["model_fallback"][-1] == {"from": "small", "to": "big",
                                                       "reason": "failed: upstream_status"}
    assert fallback(scope, data, {}) == {"ok": False, "model": None, "reason": "no fallback model left"}


def test_routing_is_given_the_output_estimate_not_the_budget(rt: Runtime) -> None:
    import dataclasses

    from inferlb.tasks.routing import select

    seen: list[int] = []

    class Spy:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def decide(self, req: Any, views: Any) -> Any:
            seen.append(req.output_tokens)
            return self.inner.decide(req, views)

    rt = dataclasses.replace(rt, router=Spy(rt.router))
    assert rt.lengths is not None
    scope, data = start(rt)
    ev = evaluate(scope, data, {})
    for _ in range(25):
        rt.lengths.observe("m", prompt_tokens=int(ev["prompt_tokens_est"]), tokens=5, endpoint="chat")
    scope, data = start(rt)
    data["evaluation"] = evaluate(scope, data, {})
    select(scope, data, {})
    assert seen == [5] and scope.output_budget == 16     # the estimate, not the model's default budget
