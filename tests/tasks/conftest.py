"""A runtime on a ManualClock for the service-task adapters (no I/O, no process)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from inferlb.app import request_end
from inferlb.config.settings import Settings, fleet_from_mapping
from inferlb.engine.scope import IncomingRequest, RequestScope, Runtime, begin_request, build_runtime
from inferlb.store.records import RequestRecord
from inferlb.types import ManualClock


class Ended(list[RequestRecord]):
    """The records the end-of-request hook handed to the audit step, in order."""


@pytest.fixture
def ended() -> Ended:
    return Ended()


@pytest.fixture
def rt(ended: Ended) -> Runtime:
    cfg = fleet_from_mapping({
        "models": [{"name": "m", "max_output_tokens": 100, "default_max_tokens": 16, "max_context_tokens": 200},
                   {"name": "emb", "kind": "embedding"}],
        "nodes": [{"name": "n0", "url": "http://127.0.0.1:1", "models": ["m", "emb"], "kind": "tgi"}],
        "timeouts": {"total_s": 60.0},
    })
    return build_runtime(Settings(), cfg, clock=ManualClock(), seed=1, end=partial(request_end, audit=ended.append))


def start(rt: Runtime, endpoint: str = "chat", model: str = "m", **kw: Any) -> tuple[RequestScope, dict[str, Any]]:
    """A request's scope and start data, as every driver builds them (scope.begin_request)."""
    return begin_request(rt, IncomingRequest(endpoint=endpoint, model=model, body={}, **kw))
