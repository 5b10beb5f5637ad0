"""Drive a real BPMN process with the real service table and a scripted dispatch (no HTTP).

``run_scenario(path, engine, outcomes)`` plays ``outcomes`` (one per dispatch) and returns the
final data, the visited path and the submitted audit records. With ``queue="grant"`` the model
pool is saturated first, so admission queues the request; the scripted ``admission/wait``
performer then ends one of the requests holding a slot (50 ms later), whose slot goes to the
queued request. ``queue="expire"`` lets the wait run out instead (3 s later).

The request goes through the gateway's own code for everything but the HTTP call: the start data
and the scope come from :func:`~inferlb.engine.scope.begin_request`, each dispatch starts with
:meth:`~inferlb.engine.scope.RequestScope.begin_attempt` (the node the last routing decision
picked, as in the gateway).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from inferlb.app import request_end
from inferlb.config.settings import Settings, fleet_from_mapping
from inferlb.engine.scope import IncomingRequest, RequestScope, begin_request, build_runtime
from inferlb.store.records import RequestRecord
from inferlb.tasks import REQUIRED_TASKS, SERVICES
from inferlb.types import ManualClock
from inferlb.workflow.definition import load_process
from inferlb.workflow.spiff import TIMER_OPERATION

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "processes" / "inference_request.bpmn"
FIXTURES = Path(__file__).parent / "fixtures"

FLEET = {
    "models": [
        {"name": "m", "fallbacks": ["m-small"], "max_output_tokens": 512},
        {"name": "m-small"},
    ],
    "nodes": [
        {"name": "a", "url": "http://127.0.0.1:1", "models": ["m"]},
        {"name": "b", "url": "http://127.0.0.1:2", "models": ["m"]},
        {"name": "c", "url": "http://127.0.0.1:3", "models": ["m"]},
        {"name": "s", "url": "http://127.0.0.1:4", "models": ["m-small"]},
    ],
}


@dataclass
class Result:
    data: dict[str, Any]
    path: list[str]
    records: list[RequestRecord] = field(default_factory=list)
    dispatched: list[str] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    queue_waits: int = 0


def make_request(model: str = "m", **over: Any) -> IncomingRequest:
    fields: dict[str, Any] = {"request_id": "req-1", "endpoint": "chat", "model": model, "body": {},
                              "max_tokens": 16, "prompt_bytes": 400}
    fields.update(over)
    return IncomingRequest(**fields)


def run_scenario(path: Path | str, engine: str, outcomes: list[dict[str, Any]], *,
                 request: IncomingRequest | None = None, fleet: dict[str, Any] | None = None,
                 max_inflight: int = 1000, queue: str | None = None) -> Result:
    clock = ManualClock()
    records: list[RequestRecord] = []
    settings = Settings(max_inflight=max_inflight)
    fleet_cfg = fleet_from_mapping(fleet or FLEET)
    rt = build_runtime(settings, fleet_cfg, clock=clock, seed=7, end=partial(request_end, audit=records.append))
    definition = load_process(path, SERVICES, engine=engine, required=REQUIRED_TASKS)
    assert definition.mode == engine
    req = request or make_request()
    scope, start = begin_request(rt, req, engine=definition.mode)
    rec = scope.record
    fillers = _saturate(rt, clock, req.model) if queue else []
    inst = definition.executor.start(start, scope)
    rec.workflow_path = inst.path
    res = Result(data={}, path=inst.path, records=records)
    plays = list(outcomes)
    call = inst.advance()
    while call is not None:
        if call.operation == "upstream/dispatch":
            attempt = scope.begin_attempt()
            node = attempt.node
            res.dispatched.append(node)
            out = dict(plays.pop(0))
            out.setdefault("node", node)
            out["tried"] = list(scope.tried)
            attempt.outcome, attempt.error_class = out["kind"], out.get("error_class")
            inst.complete(out)
        elif call.operation == "admission/wait":
            res.queue_waits += 1
            if queue == "grant":
                clock.advance(0.05)
                rt.admission.finished(fillers.pop())   # a request ends: its slot goes to the queue
            else:
                clock.advance(3.0)
                rt.admission.tick()                    # the wait ran out
            inst.complete(rt.admission.wait_result(scope))
        elif call.operation in ("clock/wait", TIMER_OPERATION):
            res.waits.append(float(call.params["seconds"]))
            clock.advance(float(call.params["seconds"]))
            inst.complete({"seconds": call.params["seconds"]})
        else:
            raise AssertionError(f"unexpected external call {call}")
        call = inst.advance()
    assert not plays, f"unused outcomes: {plays}"
    res.data = inst.data
    return res


def _saturate(rt: Any, clock: ManualClock, model: str) -> list[RequestRecord]:
    """Admit filler requests into ``model``'s pool until it is full; returns their records."""
    fillers: list[RequestRecord] = []
    ev = {"model": model, "priority": "standard", "prompt_tokens_est": 1, "output_budget": 1}
    for i in range(10_000):
        rec = RequestRecord(request_id=f"filler-{i}", received_at=clock.time(), endpoint="chat",
                            model_requested=model)
        scope = RequestScope(rt=rt, record=rec, received_mono=clock.monotonic(),
                             deadline_at=clock.monotonic() + 600, model=model)
        adm = rt.admission.admit(scope, ev, None)
        if not adm["admitted"]:
            assert adm["queue"], adm
            rt.admission.finished(rec)               # the one that queued: withdraw it
            return fillers
        fillers.append(rec)
    raise AssertionError("the pool never saturated")
