"""The probes the peer routers read from an emulated node: ``/get_load`` (both shapes),
``/get_model_info``, ``/get_server_info``, and the load figures behind them."""

from __future__ import annotations

import dataclasses

import aiohttp
import pytest

from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.node import EmulatedNode
from inferlb.simulator.presets import cli_specs, preset_spec
from inferlb.simulator.spec import NodeSpec
from inferlb.types import ManualClock


async def _get(url: str) -> tuple[int, object]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.json()


def test_load_figures_count_running_kv_and_waiting_prompts() -> None:
    node = EmulatedNode(preset_spec("h", "h100", ["m"]), clock=ManualClock())
    assert node.load_figures() == (0, 0, 0)
    assert node.core is not None
    node.core.submit(prompt_tokens=300, output_tokens=4, now=0.0)
    node.core.submit(prompt_tokens=500, output_tokens=4, now=0.0)
    # Both still queued (no step ran): the load is their prompts.
    assert node.load_figures() == (0, 2, 800)
    node.core.advance(0.0)
    running, waiting, tokens = node.load_figures()
    assert (running, waiting) == (2, 0)
    block = node.core.spec.block_tokens
    assert tokens == node.core.used_blocks * block and tokens >= 800   # KV blocks in use, rounded up to blocks


def test_fixed_speed_node_reports_its_live_requests() -> None:
    node = EmulatedNode(NodeSpec(name="f", models=["m"]))
    node.stats.live = 3
    assert node.load_figures() == (3, 0, 3)


async def test_get_load_in_each_routers_shape_and_the_worker_probes() -> None:
    specs = [preset_spec("sg", "h100", ["m"]), preset_spec("vr", "a100", ["m"], get_load="vllm-router")]
    async with SimFleet(specs) as fleet:
        status, body = await _get(fleet.url("sg") + "/get_load")
        assert status == 200
        assert body == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
        fleet.nodes["vr"].stats.live = 0
        status, body = await _get(fleet.url("vr") + "/get_load")
        assert status == 200 and body == {"load": 0}
        status, info = await _get(fleet.url("sg") + "/get_model_info")
        assert status == 200 and isinstance(info, dict)
        assert info["model_path"] == "m" and info["is_generation"] is True
        status, server = await _get(fleet.url("vr") + "/get_server_info")
        assert status == 200 and isinstance(server, dict)
        assert server["served_model_name"] == "m" and server["max_total_num_tokens"] > 0
        assert server["max_running_requests"] == specs[1].max_concurrency


async def test_get_load_follows_the_engine() -> None:
    spec = preset_spec("vr", "l4", ["m"], get_load="vllm-router")
    async with SimFleet([spec]) as fleet:
        node = fleet.nodes["vr"]
        assert node.core is not None
        node.core.submit(prompt_tokens=1000, output_tokens=4, now=node.clock.monotonic())
        _, body = await _get(fleet.url("vr") + "/get_load")
        assert body == {"load": 1000}


def test_get_load_shape_is_checked_and_overridable() -> None:
    with pytest.raises(ValueError, match="get_load"):
        NodeSpec(name="x", models=["m"], get_load="json")  # type: ignore[arg-type]
    specs = cli_specs("hetero4", get_load="vllm-router")
    assert specs is not None and {s.get_load for s in specs} == {"vllm-router"}
    plain = cli_specs("hetero4")
    assert plain is not None and {s.get_load for s in plain} == {"sglang"}
    assert dataclasses.replace(plain[0], get_load="vllm-router").get_load == "vllm-router"
