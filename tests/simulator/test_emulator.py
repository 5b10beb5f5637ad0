"""The node emulator: wire formats (checked with the real openai SDK), timing model, faults, stats."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from inferlb.simulator.emulator import SimFleet, serve_sim
from inferlb.simulator.latency import LatencyModel, TokenSchedule, estimate_tokens
from inferlb.simulator.node import EmulatedNode
from inferlb.simulator.spec import FaultSpec, NodeSpec, demo_specs
from inferlb.types import ManualClock

MODEL = "m1"


def fast_spec(name: str = "n1", **changes: Any) -> NodeSpec:
    spec = NodeSpec(name=name, models=[MODEL, "emb"], base_ttft_s=0.002, tpot_s=0.001, default_output_tokens=4)
    return replace(spec, **changes)


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet([fast_spec("n1"), fast_spec("n2", max_concurrency=1)]) as f:
        yield f


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def client(fleet: SimFleet) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=fleet.url("n1") + "/v1", api_key="client-secret", max_retries=0) as c:
        yield c


def sse_payloads(raw: bytes) -> list[bytes]:
    return [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]


def chat_body(**kw: object) -> dict[str, object]:
    body: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
    body.update(kw)
    return body


# -- timing model (pure, injected clock, no sleeps) ---------------------------------------------


def test_latency_model_formulas() -> None:
    m = LatencyModel(base_ttft_s=0.1, prefill_s_per_token=0.001, tpot_s=0.02)
    assert m.ttft_s(0) == pytest.approx(0.1)
    assert m.ttft_s(100) == pytest.approx(0.2)
    assert m.token_offset_s(100, 0) == pytest.approx(0.2)
    assert m.token_offset_s(100, 5) == pytest.approx(0.3)
    assert m.e2e_s(100, 6) == pytest.approx(0.3)
    assert m.e2e_s(100, 0) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="tpot_s"):
        LatencyModel(base_ttft_s=0.1, prefill_s_per_token=0.0, tpot_s=-1.0)
    with pytest.raises(ValueError, match="base_ttft_s"):
        LatencyModel(base_ttft_s=math.inf, prefill_s_per_token=0.0, tpot_s=0.0)


def test_token_schedule_is_deadline_based() -> None:
    clock = ManualClock()
    m = LatencyModel(base_ttft_s=0.1, prefill_s_per_token=0.0, tpot_s=0.01)
    sched = TokenSchedule(m, clock, prompt_tokens=10, output_tokens=5)
    assert sched.deadline(0) == pytest.approx(clock.monotonic() + 0.1)
    assert sched.delay_s(0) == pytest.approx(0.1)
    assert sched.tokens_due() == 0
    clock.advance(0.1)
    assert sched.tokens_due() == 1
    assert sched.delay_s(0) == 0.0
    assert sched.delay_s(3) == pytest.approx(0.03)
    # A loop that overslept catches up: the delay is measured against the deadline, not the last write.
    clock.advance(0.035)
    assert sched.tokens_due() == 4
    assert sched.delay_s(1) == 0.0 and sched.delay_s(3) == 0.0
    assert sched.delay_s(4) == pytest.approx(0.005)
    assert sched.delay_until_done_s() == pytest.approx(0.005)
    clock.advance(10)
    assert sched.tokens_due() == 5
    assert sched.delay_until_done_s() == 0.0


def test_estimate_tokens_and_specs() -> None:
    assert [estimate_tokens(n) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
    specs = demo_specs()
    assert len(specs) == 3 and len({s.name for s in specs}) == 3
    assert all(set(s.models) == {"demo-llm", "demo-llm-v2", "demo-embed"} for s in specs)
    assert len({s.tpot_s for s in specs}) == 3
    with pytest.raises(ValueError, match="unknown fault key"):
        FaultSpec.from_mapping({"stauts": 500})
    with pytest.raises(ValueError, match="integer"):
        FaultSpec.from_mapping({"drop_after_tokens": True})
    assert FaultSpec.from_mapping({"status": 503, "retry_after_s": 2}).retry_after_s == 2.0


# -- OpenAI formats, parsed by the real SDK ----------------------------------------------------


async def test_chat_non_stream(client: AsyncOpenAI) -> None:
    r = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello world!"}], max_tokens=3)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.content == "tok0 tok1 tok2 "
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (3, 3, 6)
    # Without a limit the node's default length is used and the reason is "stop".
    r = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert r.usage is not None and r.usage.completion_tokens == 4
    assert r.choices[0].finish_reason == "stop"


async def test_chat_stream_with_usage(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_completion_tokens=5, stream=True,
        stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(f"tok{i} " for i in range(5))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (2, 5)
    assert all(c.usage is None for c in chunks[:-1])


async def test_completions_stream_and_non_stream(client: AsyncOpenAI) -> None:
    r = await client.completions.create(model=MODEL, prompt="abcdefgh", max_tokens=2)
    assert r.object == "text_completion" and r.choices[0].text == "tok0 tok1 "
    assert r.usage is not None and r.usage.prompt_tokens == 2
    stream = await client.completions.create(model=MODEL, prompt="abc", max_tokens=3, stream=True)
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks) == "tok0 tok1 tok2 "
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_embeddings_are_deterministic(client: AsyncOpenAI) -> None:
    r1 = await client.embeddings.create(model="emb", input=["hello", "world"])  # SDK asks base64
    r2 = await client.embeddings.create(model="emb", input="hello", encoding_format="float")
    assert len(r1.data) == 2 and len(r1.data[0].embedding) == 32
    assert r1.data[0].embedding == pytest.approx(r2.data[0].embedding, abs=1e-6)
    assert r1.data[0].embedding != r1.data[1].embedding
    assert sum(v * v for v in r2.data[0].embedding) == pytest.approx(1.0, abs=1e-5)
    assert r1.usage.prompt_tokens == 4 and r2.usage.total_tokens == 2


async def test_models_health_and_v2_infer(fleet: SimFleet, client: AsyncOpenAI,
                                         http: aiohttp.ClientSession) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL, "emb"]
    base = fleet.url("n1")
    async with http.get(base + "/health") as resp:
        assert resp.status == 200
    await fleet.nodes["n1"].set_faults(FaultSpec(loading=True))
    async with http.get(base + "/health") as resp:
        assert resp.status == 503
    async with http.post(base + "/v1/completions", json={"model": MODEL, "prompt": "x"}) as resp:
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
    await fleet.nodes["n1"].set_faults(FaultSpec())
    body = {"id": "r1", "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    async with http.post(base + f"/v2/models/{MODEL}/infer", json=body) as resp:
        assert resp.status == 200
        out = await resp.json()
    assert out["model_name"] == MODEL and out["id"] == "r1"
    assert out["outputs"] == body["inputs"]
    async with http.post(base + "/v2/models/nope/infer", json=body) as resp:
        assert resp.status == 404


async def test_startup_loading_window() -> None:
    clock = ManualClock()
    node = EmulatedNode(fast_spec(startup_s=30.0), clock=clock)
    await node.start()
    try:
        assert node.loading
        clock.advance(31)
        assert not node.loading
    finally:
        await node.stop()


async def test_bad_requests(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                             max_tokens=0)
    with pytest.raises(openai.BadRequestError):
        await client.completions.create(model=MODEL, prompt="x", max_tokens=10**9)


# -- faults ------------------------------------------------------------------------------------


async def test_status_fault_with_retry_after(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    node = fleet.nodes["n1"]
    await node.set_faults(FaultSpec(status=503, retry_after_s=1.5))
    async with http.post(fleet.url("n1") + "/v1/chat/completions", json=chat_body()) as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "2"
        assert (await resp.json())["error"]["type"] == "server_error"
    await node.set_faults(FaultSpec(status=500, error_rate=0.0))
    async with http.post(fleet.url("n1") + "/v1/chat/completions", json=chat_body()) as resp:
        assert resp.status == 200
    assert node.stats.statuses[503] == 1 and node.stats.faults_injected == 1


async def test_max_concurrency_gives_429(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    url = fleet.url("n2") + "/v1/chat/completions"
    await fleet.nodes["n2"].set_faults(FaultSpec(stall_after_tokens=0))
    async with http.post(url, json=chat_body(stream=True)) as first:
        assert first.status == 200  # stream headers are sent at once; the request stays live
        async with http.post(url, json=chat_body()) as second:
            assert second.status == 429 and second.headers["Retry-After"] == "1"
    await fleet.nodes["n2"].wait_until(lambda s: s.live == 0)
    assert fleet.nodes["n2"].stats.rejected == 1


async def test_hang_before_headers_and_disconnect(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    node = fleet.nodes["n1"]
    await node.set_faults(FaultSpec(hang_before_headers=True))
    with pytest.raises(TimeoutError):
        async with http.post(fleet.url("n1") + "/v1/completions", json={"model": MODEL, "prompt": "x"},
                             timeout=aiohttp.ClientTimeout(total=0.2)):
            pass
    await node.wait_until(lambda s: s.live == 0)
    assert node.stats.disconnects == 1 and node.stats.max_live == 1


async def test_drop_mid_stream(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    await fleet.nodes["n1"].set_faults(FaultSpec(drop_after_tokens=3))
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(fleet.url("n1") + "/v1/chat/completions",
                             json=chat_body(stream=True, max_tokens=10)) as resp:
            async for chunk in resp.content.iter_any():
                received += chunk
    payloads = sse_payloads(received)
    assert len(payloads) == 4  # the role chunk and 3 tokens, then the cut
    assert b"[DONE]" not in received
    await fleet.nodes["n1"].wait_until(lambda s: s.live == 0)


async def test_malformed_sse_and_error_event(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    await fleet.nodes["n1"].set_faults(FaultSpec(malformed_sse_at=2))
    async with http.post(fleet.url("n1") + "/v1/completions",
                         json={"model": MODEL, "prompt": "x", "max_tokens": 4, "stream": True}) as resp:
        payloads = sse_payloads(await resp.read())
    broken = []
    for p in payloads[:-1]:
        try:
            json.loads(p)
        except ValueError:
            broken.append(p)
    assert len(broken) == 1 and payloads[-1] == b"[DONE]"
    await fleet.nodes["n1"].set_faults(FaultSpec(error_event_at=1))
    async with http.post(fleet.url("n1") + "/v1/completions",
                         json={"model": MODEL, "prompt": "x", "max_tokens": 4, "stream": True}) as resp:
        payloads = sse_payloads(await resp.read())  # a complete body: no cut
    assert len(payloads) == 2  # one token, then the error event and no [DONE]
    assert json.loads(payloads[-1])["error"]["code"] == "internal_error"


# -- stats and control endpoints -----------------------------------------------------------------


async def test_stats_count_attempts_and_headers(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    base = fleet.url("n1")
    for _ in range(2):
        async with http.post(base + "/v1/chat/completions", json=chat_body(),
                             headers={"x-request-id": "req-1", "x-custom": "v"}) as resp:
            assert resp.status == 200
    async with http.get(base + "/health"):
        pass
    async with http.get(base + "/sim/stats") as resp:
        stats = await resp.json()
    assert stats["requests_total"] == 2 and stats["attempts"] == {"req-1": 2}
    assert stats["live"] == 0 and stats["max_live"] == 1 and stats["completed"] == 2
    assert stats["last_headers"]["x-custom"] == "v"
    async with http.post(base + "/sim/faults", json={"status": 429, "retry_after_s": 7}) as resp:
        assert resp.status == 200
    assert fleet.nodes["n1"].faults.status == 429
    async with http.post(base + "/sim/faults", json={"oops": 1}) as resp:
        assert resp.status == 400
    async with http.post(base + "/sim/reset") as resp:
        assert resp.status == 200
    assert fleet.nodes["n1"].stats.requests_total == 0 and fleet.nodes["n1"].faults == FaultSpec()


async def test_client_disconnect_cancels_generation(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    node = fleet.nodes["n1"]
    await node.set_faults(FaultSpec(stall_after_tokens=2))
    resp = await http.post(fleet.url("n1") + "/v1/chat/completions", json=chat_body(stream=True))
    assert resp.status == 200
    await resp.content.readany()
    assert node.stats.live == 1
    resp.close()  # drop the TCP connection, as a gateway does when its client goes away
    await node.wait_until(lambda s: s.live == 0)
    assert node.stats.disconnects == 1 and node.stats.completed == 0


async def test_stop_and_restart_same_port(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    url = fleet.url("n1")
    await fleet.stop_node("n1")
    with pytest.raises(aiohttp.ClientConnectorError):
        async with http.get(url + "/health"):
            pass
    await fleet.start_node("n1")
    assert fleet.url("n1") == url
    async with http.get(url + "/health") as resp:
        assert resp.status == 200
    # refuse through the control endpoint: answered, then the port closes.
    async with http.post(url + "/sim/faults", json={"refuse": True}) as resp:
        assert resp.status == 200
    await asyncio.wait_for(_until_refused(http, url), 2.0)
    await fleet.start_node("n1")
    assert not fleet.nodes["n1"].faults.refuse


async def _until_refused(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(100):  # bounded; the stop task runs within an event-loop turn or two
        try:
            async with http.get(url + "/health", headers={"Connection": "close"}):
                pass
        except aiohttp.ClientConnectionError:
            return
        await asyncio.sleep(0)
    raise AssertionError("the node kept accepting connections")


async def test_stop_cuts_inflight_requests(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    node = fleet.nodes["n1"]
    await node.set_faults(FaultSpec(stall_after_tokens=1))
    resp = await http.post(fleet.url("n1") + "/v1/chat/completions", json=chat_body(stream=True))
    await resp.content.readany()
    await fleet.stop_node("n1")
    assert node.stats.live == 0
    with pytest.raises(aiohttp.ClientPayloadError):
        await resp.read()
    resp.close()


async def test_serve_sim_runs_until_cancelled(http: aiohttp.ClientSession) -> None:
    ready: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve_sim([fast_spec("a"), fast_spec("b")], "127.0.0.1", [0, 0],
                                         on_ready=ready.set_result))
    urls = await asyncio.wait_for(ready, 5.0)
    assert sorted(urls) == ["a", "b"]
    async with http.get(urls["b"] + "/health") as resp:
        assert resp.status == 200
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(aiohttp.ClientConnectionError):
        async with http.get(urls["a"] + "/health", headers={"Connection": "close"}):
            pass
