"""The end of a request, through the real gateway, the shipped process and emulated nodes over real
HTTP on an injected clock: ``app.request_end``'s steps run in their order exactly once per request
(rejections included), and one cost rule makes the audit row, the Prometheus counter, the tenant's
spend and the cost report agree, also for a fleet priced only by GPU label."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from starlette.responses import Response, StreamingResponse

from inferlb.admission.keys import ApiKey
from inferlb.app import request_end
from inferlb.config.settings import FleetConfig, Settings, fleet_from_mapping
from inferlb.cost import node_prices
from inferlb.engine.gateway import Gateway
from inferlb.engine.request_end import RequestEnd
from inferlb.engine.scope import IncomingRequest, Runtime, build_runtime
from inferlb.engine.upstream import Upstream, UpstreamResponse
from inferlb.observability.hub import Observability
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import NodeSpec
from inferlb.store.db import make_engine, upgrade
from inferlb.store.ledger import build_ledger, cost_report
from inferlb.store.records import RequestRecord
from inferlb.store.rows import upsert_records
from inferlb.tasks import REQUIRED_TASKS, SERVICES
from inferlb.types import ManualClock
from inferlb.workflow.definition import load_process

MAIN = Path(__file__).resolve().parents[2] / "processes" / "inference_request.bpmn"
STEPS = ["tenant spend", "admission release", "audit", "metrics", "traces"]


class Ticking(Upstream):
    """The real client; each attempt's first byte comes ``ttfb_s`` later on the injected clock, so
    concurrent attempts overlap on a node for different stretches."""

    def __init__(self, clock: ManualClock, ttfb_s: float = 0.25) -> None:
        super().__init__(limit=32, limit_per_host=16)
        self.clock, self.ttfb_s = clock, ttfb_s

    async def open(self, url: str, body: bytes, **kw: Any) -> UpstreamResponse:
        try:
            return await super().open(url, body, **kw)
        finally:
            self.clock.advance(self.ttfb_s)


@dataclass
class Stack:
    gw: Gateway
    rt: Runtime
    obs: Observability
    cfg: FleetConfig
    records: list[RequestRecord]
    seen: list[tuple[str, str]]            # (step, request id), in the order the steps ran

    async def send(self, *, model: str = "m", stream: bool = False, key: str | None = None) -> Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": stream}
        req = IncomingRequest(endpoint="chat", model=model, body=body, stream=stream, max_tokens=6,
                              prompt_bytes=len(json.dumps(body)), key_id=key)
        resp = await asyncio.wait_for(self.gw.handle(req), 30)
        if isinstance(resp, StreamingResponse):
            async for _ in resp.body_iterator:
                pass
        return resp


def _spy(name: str, step: Callable[[RequestRecord], None], seen: list[tuple[str, str]]
         ) -> Callable[[RequestRecord], None]:
    def run(rec: RequestRecord) -> None:
        seen.append((name, rec.request_id))
        step(rec)
    return run


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    specs = [NodeSpec(name=f"n{i}", models=["m"], base_ttft_s=0.002, tpot_s=0.0005) for i in range(2)]
    async with SimFleet(specs) as sim:
        # Priced ONLY by GPU label: no node has a price_per_hour. 3600/h is 1 per GPU-second.
        cfg = fleet_from_mapping({
            "models": [{"name": "m", "max_output_tokens": 64, "default_max_tokens": 6}],
            "nodes": [{"name": n, "url": node.url, "models": ["m"], "labels": {"gpu": "h100"}}
                      for n, node in sim.nodes.items()],
            "routing": {"profile": "round-robin", "seed": 1},
            "observability": {"finops": {"gpu_prices": {"h100": 3600.0}}},
        })
        clock = ManualClock()
        obs = Observability(cfg, clock=clock, tracer_provider=TracerProvider())
        records: list[RequestRecord] = []
        rt = build_runtime(Settings(), cfg, clock=clock, seed=1,
                           end=partial(request_end, audit=records.append, obs=obs))
        hook = rt.on_request_end
        assert isinstance(hook, RequestEnd) and hook.names == STEPS
        seen: list[tuple[str, str]] = []
        hook.steps = tuple((name, _spy(name, fn, seen)) for name, fn in hook.steps)
        rt.admission.keys.put(ApiKey(id="key_1", tenant="acme", key_hash="h", hint="sk-gw-…"))
        process = load_process(MAIN, SERVICES, engine="compiled", required=REQUIRED_TASKS)
        async with Ticking(clock) as up:
            yield Stack(Gateway(rt, process, up), rt, obs, cfg, records, seen)


async def test_the_end_steps_run_in_order_once_per_request_rejections_included(stack: Stack) -> None:
    held_at_audit: list[bool] = []
    steps = dict(stack.rt.on_request_end.steps)   # type: ignore[attr-defined]
    audit = steps["audit"]

    def audit_checking_release(rec: RequestRecord) -> None:
        held_at_audit.append(rec.request_id in stack.rt.admission.holds)
        audit(rec)

    hook = stack.rt.on_request_end
    assert isinstance(hook, RequestEnd)
    hook.steps = tuple((n, audit_checking_release if n == "audit" else fn) for n, fn in hook.steps)

    assert (await stack.send()).status_code == 200
    assert (await stack.send(stream=True)).status_code == 200
    assert (await stack.send(model="nope")).status_code == 404          # rejected by request/evaluate
    stack.gw.reject("chat", "m", 400, "invalid_value")                  # rejected before the process
    ids = [r.request_id for r in stack.records]
    assert len(ids) == len(set(ids)) == 4
    by_request: dict[str, list[str]] = defaultdict(list)
    for name, rid in stack.seen:
        by_request[rid].append(name)
    assert {rid: by_request[rid] for rid in ids} == {rid: STEPS for rid in ids}
    assert held_at_audit == [False] * 4           # the slot is free before the record is handed on
    assert not stack.rt.admission.holds and hook.errors == {}


async def test_one_cost_rule_for_audit_metric_spend_and_the_cost_report(stack: Stack, tmp_path: Path) -> None:
    await asyncio.gather(*(stack.send(key="key_1", stream=i % 2 == 1) for i in range(6)))
    await stack.send(key="key_1")
    recs = stack.records
    assert len(recs) == 7 and all(r.status == "ok" for r in recs)
    costs = {r.request_id: r.cost_est or 0.0 for r in recs}
    assert all(c > 0 for c in costs.values()), costs
    total = sum(costs.values())
    # the Prometheus counter and the tenant's spend: the audit rows' figures
    metric = sum(s.value for f in stack.obs.registry.collect() if f.name == "inferlb_request_cost"
                 for s in f.samples if s.name == "inferlb_request_cost_total")
    assert metric == pytest.approx(total, rel=1e-9)
    assert stack.rt.admission.spend_pending["key_1"] == pytest.approx(total, rel=1e-9)
    # the cost report over the same rows, with the same prices: per request, the same figure
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            upsert_records(conn, recs)
        prices = node_prices(stack.cfg.nodes, stack.cfg.observability.finops)
        assert prices == {"n0": 3600.0, "n1": 3600.0}
        since = min(r.received_at for r in recs) - 1
        until = max(r.last_byte_at or 0.0 for r in recs) + 1
        ledger = build_ledger(engine, prices=prices, since=since, until=until).ledger.request_costs()
        report = cost_report(engine, prices=prices, since=since, until=until, group_by="tenant")
    finally:
        engine.dispose()
    assert set(ledger) == set(costs)
    for rid, cost in costs.items():
        assert ledger[rid] == pytest.approx(cost, abs=1e-6), rid
    assert report["summary"]["attributed_cost"] == pytest.approx(total, abs=1e-5)
    # attempts overlapped: some were charged less than their whole occupied time
    occupied = {r.request_id: sum((a.ended_at or 0.0) - a.started_at for a in r.attempts) for r in recs}
    assert any(costs[rid] < occupied[rid] - 1e-6 for rid in costs)
