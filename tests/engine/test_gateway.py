"""The gateway's request path against emulated nodes over real HTTP, with the shipped process and an
injected clock: the output budget and deadline computed once, every routing decision kept, the
first-byte wait bounded by what a node usually takes, streams stopped at shutdown, tokens counted
when a stream is cut."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from starlette.responses import Response, StreamingResponse

from inferlb.app import request_end
from inferlb.config.settings import Settings, TimeoutConfig, fleet_from_mapping
from inferlb.config.tls import NodeTLS
from inferlb.engine.gateway import Gateway
from inferlb.engine.scope import IncomingRequest, build_runtime
from inferlb.engine.upstream import Upstream, UpstreamResponse
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec, NodeSpec
from inferlb.store.records import RequestRecord
from inferlb.tasks import REQUIRED_TASKS, SERVICES
from inferlb.types import ManualClock
from inferlb.workflow.definition import load_process

MAIN = Path(__file__).resolve().parents[2] / "processes" / "inference_request.bpmn"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Recording(Upstream):
    """The real client, noting each attempt's node, timeouts and the node's in-flight tokens; each
    attempt's first byte comes ``ttfb_s`` later on the injected clock."""

    def __init__(self, gw_clock: ManualClock, ttfb_s: float = 0.05) -> None:
        super().__init__(limit=32, limit_per_host=16)
        self.gw_clock = gw_clock
        self.ttfb_s = ttfb_s
        self.opened: list[tuple[str, TimeoutConfig, int]] = []
        self.fleet: Any = None

    async def open(self, url: str, body: bytes, *, headers: Mapping[str, str], timeouts: TimeoutConfig,
                   node: str, method: str = "POST", tls: NodeTLS | None = None) -> UpstreamResponse:
        self.opened.append((node, timeouts, self.fleet.nodes[node].inflight_tokens))
        try:
            return await super().open(url, body, headers=headers, timeouts=timeouts, node=node, method=method,
                                      tls=tls)
        finally:
            self.gw_clock.advance(self.ttfb_s)


class Rig:
    def __init__(self, gw: Gateway, up: Recording, sim: SimFleet, records: list[RequestRecord]) -> None:
        self.gw, self.up, self.sim, self.records = gw, up, sim, records

    async def send(self, endpoint: str = "chat", **kw: Any) -> Response:
        body = {**CHAT, **kw} if endpoint == "chat" else {"model": "emb", "input": "hello"}
        req = IncomingRequest(endpoint=endpoint, model=body["model"], body=body, stream=bool(kw.get("stream")),
                              max_tokens=kw.get("max_tokens"), prompt_bytes=len(json.dumps(body)))
        return await asyncio.wait_for(self.gw.handle(req), 30)


async def drain(resp: Response) -> bytes:
    assert isinstance(resp, StreamingResponse)
    return b"".join([c if isinstance(c, bytes) else str(c).encode() async for c in resp.body_iterator])


@pytest.fixture
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    opts: dict[str, Any] = getattr(request, "param", {})
    specs = [NodeSpec(name=f"n{i}", models=["m", "emb"], base_ttft_s=0.002, tpot_s=opts.get("tpot_s", 0.0005))
             for i in range(2)]
    async with SimFleet(specs) as sim:
        cfg = fleet_from_mapping({
            "models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8},
                       {"name": "emb", "kind": "embedding", "default_max_tokens": 500}],
            "nodes": [{"name": n, "url": node.url, "models": ["m", "emb"]} for n, node in sim.nodes.items()],
            "routing": {"profile": "round-robin", "seed": 1},
            "timeouts": {"connect_s": 1.0, "first_token_s": 60.0, "idle_s": 10.0, "total_s": 120.0,
                         "per_output_token_s": 0.1},
        })
        clock = ManualClock()
        records: list[RequestRecord] = []
        rt = build_runtime(Settings(), cfg, clock=clock, seed=1, end=partial(request_end, audit=records.append))
        process = load_process(MAIN, SERVICES, engine="compiled", required=REQUIRED_TASKS)
        up = Recording(clock)
        up.fleet = rt.fleet
        async with up:
            yield Rig(Gateway(rt, process, up), up, sim, records)


async def test_embeddings_use_the_evaluated_budget_and_the_deadline_is_recorded(rig: Rig) -> None:
    r = await rig.send("embeddings")
    assert r.status_code == 200
    rec = rig.records[-1]
    node, timeouts, inflight = rig.up.opened[-1]
    # evaluate gives embeddings no output budget: no generation time, no output tokens on the node
    # (the model's default_max_tokens of 500 would add 50 s and 500 tokens).
    assert timeouts.first_token_s == 60.0
    assert inflight == rec.prompt_tokens_est
    assert rec.deadline_at == pytest.approx(rec.received_at + 120.0)


async def test_every_routing_decision_is_kept_with_its_attempt(rig: Rig) -> None:
    await rig.sim.stop_node("n0")
    for _ in range(2):   # round robin: one of the two requests tries n0 first
        assert (await rig.send()).status_code == 200
    rec = next(r for r in rig.records if len(r.attempts) == 2)
    assert [a.node for a in rec.attempts] == ["n0", "n1"]
    assert [(d["attempt"], d["pick"], d["model"]) for d in rec.decisions] == [(1, "n0", "m"), (2, "n1", "m")]
    assert any(e["node"] == "n0" for e in rec.decisions[1]["eliminated"])   # the retry excluded n0
    assert rec.decision is not None and rec.decision["pick"] == "n1"


async def test_a_hung_node_costs_its_usual_first_byte_time_not_first_token_s(rig: Rig) -> None:
    for _ in range(40):   # round robin: 20 successes per node, each 50 ms to the first byte
        assert (await rig.send(max_tokens=4)).status_code == 200
    for _ in range(40):
        assert b"[DONE]" in await drain(await rig.send(max_tokens=4, stream=True))
    await rig.sim.nodes["n0"].set_faults(FaultSpec(hang_before_headers=True))
    for stream in (False, True):
        for _ in range(2):   # round robin: one of the two goes to n0 first
            r = await rig.send(max_tokens=4, stream=stream)
            assert r.status_code == 200
            if stream:
                assert b"[DONE]" in await drain(r)
        rec = next(r for r in reversed(rig.records) if len(r.attempts) == 2)
        assert rec.attempts[0].node == "n0" and rec.attempts[0].error_class == "timeout_first_token"
        assert rec.status == "ok" and rec.stream is stream
        waits = [t.first_token_s for n, t, _ in rig.up.opened[-3:] if n == "n0"]
        # k × p99 of 50 ms (non-stream: per token × 4 tokens) is under the 1 s floor: 1 s, not 60 s.
        assert waits == [1.0]


@pytest.mark.parametrize("rig", [{"tpot_s": 0.02}], indirect=True)
async def test_stop_streams_ends_each_stream_with_one_error_event_and_audits_the_tokens(rig: Rig) -> None:
    resp = await rig.send(max_tokens=500, stream=True)
    assert isinstance(resp, StreamingResponse)
    it = resp.body_iterator
    got = [await it.__anext__()]
    while b"tok1 " not in b"".join(x if isinstance(x, bytes) else b"" for x in got):
        got.append(await it.__anext__())
    assert rig.gw.stop_streams() == 1
    got += [c async for c in it]
    text = b"".join(x if isinstance(x, bytes) else str(x).encode() for x in got).decode()
    events = [e[len("data: "):] for e in text.split("\n\n") if e.startswith("data: ")]
    assert "[DONE]" not in events
    assert json.loads(events[-1])["error"]["code"] == "server_shutting_down"
    assert sum('"error"' in e for e in events) == 1
    sent = sum("tok" in e for e in events)
    rec = rig.records[-1]
    assert rec.status == "server_shutting_down" and rec.error_class == "server_shutting_down"
    assert rec.completion_tokens == sent and 2 <= sent < 500
    assert rig.gw.stop_streams() == 0


async def test_a_stream_cut_mid_way_records_the_tokens_sent(rig: Rig) -> None:
    for node in rig.sim.nodes.values():
        await node.set_faults(FaultSpec(drop_after_tokens=5))
    text = (await drain(await rig.send(max_tokens=50, stream=True))).decode()
    events = [e[len("data: "):] for e in text.split("\n\n") if e.startswith("data: ")]
    assert "[DONE]" not in events and json.loads(events[-1])["error"]["code"] == "upstream_error"
    rec = rig.records[-1]
    assert rec.status == "upstream_error_midstream"
    assert rec.error_class == "midstream_connect_error"
    assert rec.completion_tokens == sum("tok" in e for e in events) == 5
