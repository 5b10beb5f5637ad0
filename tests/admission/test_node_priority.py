"""The priority class travels to nodes that schedule by priority (vLLM ``--scheduling-policy priority``)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from inferlb.app import request_end
from inferlb.config.settings import Settings, fleet_from_mapping
from inferlb.engine.gateway import Gateway
from inferlb.engine.scope import IncomingRequest, RequestScope, build_runtime
from inferlb.store.records import RequestRecord
from inferlb.types import ManualClock


def _body(priority: str | None, labels: dict[str, str], client_field: Any = None) -> dict[str, Any]:
    cfg = fleet_from_mapping({"models": [{"name": "m"}],
                              "nodes": [{"name": "a", "url": "http://127.0.0.1:1", "models": ["m"], "kind": "vllm",
                                         "labels": labels}]})
    rt = build_runtime(Settings(), cfg, clock=ManualClock(), end=partial(request_end, audit=lambda r: None))
    gw = Gateway(rt, process=None, upstream=None)  # type: ignore[arg-type]   # only the body is built
    rec = RequestRecord(request_id="r", received_at=0.0, endpoint="chat", model_requested="m", priority=priority)
    scope = RequestScope(rt=rt, record=rec, received_mono=0.0)
    body = {"model": "m", "messages": []}
    if client_field is not None:
        body["priority"] = client_field
    req = IncomingRequest(endpoint="chat", model="m", body=body)
    out: dict[str, Any] = json.loads(gw._upstream_body(scope, req, cfg.nodes[0]))
    return out


def test_priority_scheduling_nodes_get_the_class_rank() -> None:
    labels = {"scheduling-policy": "priority"}
    assert _body("critical", labels)["priority"] == 0
    assert _body("batch", labels)["priority"] == 3
    assert _body("batch", labels, client_field=-100)["priority"] == 3     # a tenant cannot raise its own


def test_other_nodes_get_no_priority_field() -> None:
    # vLLM without priority scheduling rejects any priority other than 0: send nothing
    assert "priority" not in _body("critical", {})
