"""A LoRA model through the gateway against emulated vLLM-like nodes: the adapter name reaches the
node in ``model``, an adapter that fails to load marks that node for that adapter only (with its
cool-down), the request is retried on another node, and the base model still goes to that node."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
from starlette.responses import Response

from inferlb.app import request_end
from inferlb.config.settings import Settings, fleet_from_mapping
from inferlb.engine.gateway import Gateway
from inferlb.engine.scope import IncomingRequest, Runtime, build_runtime
from inferlb.engine.upstream import Upstream
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.lora import LoraSpec
from inferlb.simulator.spec import FaultSpec, NodeSpec
from inferlb.store.records import RequestRecord
from inferlb.tasks import REQUIRED_TASKS, SERVICES
from inferlb.types import ManualClock
from inferlb.workflow.definition import load_process

MAIN = Path(__file__).resolve().parents[2] / "processes" / "inference_request.bpmn"


class Rig:
    def __init__(self, gw: Gateway, rt: Runtime, sim: SimFleet, records: list[RequestRecord],
                 clock: ManualClock) -> None:
        self.gw, self.rt, self.sim, self.records, self.clock = gw, rt, sim, records, clock

    async def send(self, model: str) -> Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        req = IncomingRequest(endpoint="chat", model=model, body=body, stream=False, max_tokens=None,
                              prompt_bytes=len(json.dumps(body)))
        return await asyncio.wait_for(self.gw.handle(req), 30)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    lora = LoraSpec(adapters=("sql-lora",), max_lora=2, load_s=0.0)
    specs = [NodeSpec(name=f"n{i}", models=["llama"], base_ttft_s=0.001, tpot_s=0.0005, default_output_tokens=2,
                      lora=lora) for i in range(2)]
    async with SimFleet(specs) as sim:
        cfg = fleet_from_mapping({
            "models": [{"name": "sql", "lora": {"adapter": "sql-lora", "base": "llama", "failure_cooldown_s": 20}},
                       {"name": "llama"}],
            "nodes": [{"name": n, "url": node.url, "models": ["sql", "llama"]} for n, node in sim.nodes.items()],
            "routing": {"seed": 1},
        })
        assert cfg.routing.profile == "lora-affinity"
        clock = ManualClock()
        records: list[RequestRecord] = []
        rt = build_runtime(Settings(), cfg, clock=clock, seed=1, end=partial(request_end, audit=records.append))
        process = load_process(MAIN, SERVICES, engine="compiled", required=REQUIRED_TASKS)
        async with Upstream(limit=8, limit_per_host=4) as up:
            yield Rig(Gateway(rt, process, up), rt, sim, records, clock)


async def test_the_adapter_name_reaches_the_node(rig: Rig) -> None:
    r = await rig.send("sql")
    assert r.status_code == 200
    node = rig.records[-1].node
    assert node is not None and rig.sim.nodes[node].lora_slots.loaded() == ["sql-lora"]   # type: ignore[union-attr]
    assert "lora-affinity" in rig.records[-1].decision["scores"][node]                    # type: ignore[index]


async def test_a_failed_adapter_marks_that_node_for_that_adapter_only(rig: Rig) -> None:
    await rig.sim.nodes["n0"].set_faults(FaultSpec(lora_fail=("sql-lora",)))
    for _ in range(4):       # whichever node is picked first, n0 fails the adapter
        r = await rig.send("sql")
        assert r.status_code == 200 and rig.records[-1].node == "n1"
    rec = next(r for r in rig.records if len(r.attempts) == 2)
    assert [a.node for a in rec.attempts] == ["n0", "n1"] and rec.attempts[0].http_status == 404
    v = next(v for v in rig.rt.fleet.views() if v.name == "n0")
    assert v.healthy and v.lora_failed == frozenset({"sql-lora"})
    assert rig.rt.fleet.nodes["n0"].state == "healthy"          # not ejected: only that adapter is out
    later = [r for r in rig.records if len(r.attempts) == 1]
    assert later and all(r.decision["eliminated_counts"].get("lora-available") == 1   # type: ignore[index]
                         for r in later)
    # the base model still goes to n0
    seen = set()
    for _ in range(6):
        assert (await rig.send("llama")).status_code == 200
        seen.add(rig.records[-1].node)
    assert "n0" in seen
    # after the cool-down n0 is offered the adapter again
    await rig.sim.nodes["n0"].set_faults(FaultSpec())
    rig.clock.advance(20.0)
    v = next(v for v in rig.rt.fleet.views() if v.name == "n0")
    assert v.lora_failed == frozenset()
