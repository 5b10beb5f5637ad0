"""LoRA adapters on emulated nodes: the slot model (pure, times passed in) and the emulator's
/metrics, load wait, LRU eviction and failed adapter, read with the gateway's own vLLM parser."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from inferlb.health.prometheus import parse_vllm
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.lora import AdapterSlots, LoraSpec
from inferlb.simulator.spec import FaultSpec, NodeSpec


def test_a_cold_adapter_costs_its_load_time_once_then_hits() -> None:
    s = AdapterSlots(LoraSpec(adapters=("a", "b"), max_lora=2, load_s=0.5))
    assert s.acquire("a", 10.0) == 10.5                    # cold: ready after the load
    assert s.acquire("a", 10.2) == 10.5                    # a second request waits for the same load
    assert s.report(10.2) == ([], ["a"])                   # loading: vLLM shows it waiting
    assert s.report(10.5) == (["a"], [])
    s.release("a")
    s.release("a")
    assert s.report(11.0) == ([], []) and s.loaded() == ["a"]   # loaded but idle: in neither list
    assert s.acquire("a", 11.0) == 11.0                    # warm: no load
    assert (s.loads, s.hits, s.evictions) == (1, 2, 0)


def test_lru_eviction_spares_held_adapters_and_a_full_node_makes_the_request_wait() -> None:
    s = AdapterSlots(LoraSpec(adapters=("a", "b", "c"), max_lora=2, load_s=0.0))
    s.acquire("a", 0.0)
    s.acquire("b", 0.0)
    assert s.acquire("c", 1.0) is None                      # both slots held: no load possible
    s.block("c")
    assert s.report(1.0) == (["a", "b"], ["c"])
    s.release("a")
    assert s.acquire("c", 2.0) == 2.0 and s.loaded() == ["b", "c"] and s.evictions == 1
    s.block("c", -1)
    s.release("b")
    s.release("c")
    s.acquire("c", 3.0)                                     # c used last: b is the LRU
    s.release("c")
    s.acquire("a", 4.0)
    assert s.loaded() == ["c", "a"]


def test_a_spec_is_checked() -> None:
    with pytest.raises(ValueError):
        LoraSpec(adapters=(), max_lora=1)
    with pytest.raises(ValueError):
        LoraSpec(adapters=("a",), max_lora=0)
    with pytest.raises(ValueError):
        FaultSpec.from_mapping({"lora_fail": "a"})
    assert FaultSpec.from_mapping({"lora_fail": ["a"]}).lora_fail == ("a",)


@pytest.fixture
async def node() -> AsyncIterator[tuple[SimFleet, aiohttp.ClientSession]]:
    spec = NodeSpec(name="n1", models=["base"], base_ttft_s=0.001, tpot_s=0.0005, default_output_tokens=2,
                    lora=LoraSpec(adapters=("a", "b", "slow"), max_lora=1, load_s=0.0, fail=("b",)))
    async with SimFleet([spec]) as f, aiohttp.ClientSession() as http:
        yield f, http


async def _chat(http: aiohttp.ClientSession, url: str, model: str) -> tuple[int, dict[str, object]]:
    async with http.post(url + "/v1/chat/completions",
                         json={"model": model, "messages": [{"role": "user", "content": "hi"}]}) as r:
        return r.status, await r.json()


async def test_the_emulator_serves_adapters_reports_them_and_evicts_the_lru(
        node: tuple[SimFleet, aiohttp.ClientSession]) -> None:
    fleet, http = node
    url, emu = fleet.url("n1"), fleet.nodes["n1"]
    slots = emu.lora_slots
    assert slots is not None
    assert (await _chat(http, url, "a"))[0] == 200
    assert (await _chat(http, url, "a"))[0] == 200
    assert (await _chat(http, url, "base"))[0] == 200        # the base model needs no slot
    assert (slots.loads, slots.hits) == (1, 1)
    async with http.get(url + "/v1/models") as r:
        assert {m["id"] for m in (await r.json())["data"]} == {"base", "a", "b", "slow"}
    async with http.get(url + "/metrics") as r:
        lora = parse_vllm(await r.text())["lora"]
    assert lora == {"running": [], "waiting": [], "max_lora": 1}
    status, body = await _chat(http, url, "b")                # its load fails: vLLM's 404
    assert status == 404 and body["error"]["message"] == "The model `b` does not exist."  # type: ignore[index]
    assert body["error"]["type"] == "NotFoundError"          # type: ignore[index]
    await emu.set_faults(FaultSpec(lora_fail=("a",)))
    assert (await _chat(http, url, "a"))[0] == 404
    await emu.set_faults(FaultSpec())
    assert (await _chat(http, url, "slow"))[0] == 200         # one slot: a is evicted for it
    assert slots.loaded() == ["slow"] and slots.evictions == 1


async def test_a_request_for_a_cold_adapter_waits_for_its_load_and_shows_as_waiting(
        node: tuple[SimFleet, aiohttp.ClientSession]) -> None:
    fleet, http = node
    emu = fleet.nodes["n1"]
    assert emu.lora_slots is not None
    emu.lora_slots = AdapterSlots(LoraSpec(adapters=("a", "b", "slow"), max_lora=1, load_s=600.0))
    task = asyncio.create_task(_chat(http, fleet.url("n1"), "slow"))
    await emu.wait_until(lambda st: st.live == 1)
    for _ in range(50):                                       # until the handler holds the slot
        if emu.lora_slots.loads:
            break
        await asyncio.sleep(0)
    async with http.get(fleet.url("n1") + "/metrics") as r:
        text = await r.text()
    assert parse_vllm(text)["lora"] == {"running": [], "waiting": ["slow"], "max_lora": 1}
    assert 'vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters="slow"}' in text
    assert emu.stats.completed == 0                          # nothing generated during the load
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
