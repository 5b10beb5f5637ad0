"""The emulator over HTTP with the vLLM-like engine: metrics names, GPU reading, queueing, OOM crash
and cold start, the newer faults, presets and fleet files. Real sockets, millisecond step times."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from inferlb.errors import PluginError
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.node import SIM_OUTPUT_FIELD, EmulatedNode
from inferlb.simulator.presets import PRESETS, cli_specs, fleet_specs, is_named_fleet, load_sim_fleet, preset_spec
from inferlb.simulator.spec import BatchSpec, FaultSpec, NodeSpec
from inferlb.types import ManualClock

MODEL = "m"


def engine_spec(name: str = "e1", **batch: Any) -> NodeSpec:
    b: dict[str, Any] = {"kv_tokens": 4096, "step_base_s": 0.002, "step_per_seq_s": 0.0, "prefill_s_per_token": 0.0,
                         "watermark": 0.0, "cold_start_s": 0.3}
    b.update(batch)
    return NodeSpec(name=name, models=[MODEL], batching=BatchSpec(**b), default_output_tokens=4)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def body(n: int = 4, prompt_tokens: int = 4, **kw: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "x" * (4 * prompt_tokens)}],
                         "max_tokens": n}
    b.update(kw)
    return b


async def chat(http: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, bytes]:
    async with http.post(url + "/v1/chat/completions", json=body(**kw)) as r:
        return r.status, await r.read()


async def test_batching_node_answers_and_counts_tokens(http: aiohttp.ClientSession) -> None:
    async with SimFleet([engine_spec()]) as fleet:
        url = fleet.url("e1")
        status, raw = await chat(http, url, n=5, prompt_tokens=10)
        assert status == 200
        out = json.loads(raw)
        assert out["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        assert out["system_fingerprint"] == "e1"
        status, raw = await chat(http, url, n=6, stream=True, stream_options={"include_usage": True})
        assert status == 200 and len(re.findall(rb"tok\d+ ", raw)) == 6 and raw.rstrip().endswith(b"data: [DONE]")
        # The emulator-only field stops generation early, as EOS would ("stop", not "length").
        status, raw = await chat(http, url, n=50, **{SIM_OUTPUT_FIELD: 3})
        out = json.loads(raw)
        assert out["usage"]["completion_tokens"] == 3 and out["choices"][0]["finish_reason"] == "stop"
        core = fleet.nodes["e1"].core
        assert core is not None and core.finished_total == 3 and core.used_blocks == 0


async def test_metrics_use_vllm_names(http: aiohttp.ClientSession) -> None:
    async with SimFleet([engine_spec()]) as fleet:
        url = fleet.url("e1")
        await chat(http, url, n=3, prompt_tokens=8, stream=True)
        async with http.get(url + "/metrics") as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await r.text()
    lines = dict(ln.rsplit(" ", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))
    lab = '{model_name="m"}'
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total", "inferlb_sim_oom_crashes_total"):
        assert name + lab in lines, name
    assert float(lines["vllm:prompt_tokens_total" + lab]) == 8
    assert float(lines["vllm:generation_tokens_total" + lab]) == 3
    assert float(lines["vllm:time_to_first_token_seconds_count" + lab]) == 1
    assert float(lines["vllm:e2e_request_latency_seconds_count" + lab]) == 1
    assert 'vllm:request_success_total{model_name="m",finished_reason="length"}' in lines
    assert "# TYPE vllm:time_per_output_token_seconds histogram" in text
    assert "# TYPE vllm:num_preemptions_total counter" in text


async def test_gpu_reading_shape_and_hardware_faults(http: aiohttp.ClientSession) -> None:
    spec = preset_spec("g1", "l4", [MODEL])
    async with SimFleet([spec]) as fleet:
        url = fleet.url("g1")
        async with http.get(url + "/sim/gpu") as r:
            g = await r.json()
        assert g["nvml"] == "ok" and len(g["gpus"]) == 1
        gpu = g["gpus"][0]
        assert gpu["memory_total_mib"] == PRESETS["l4"].gpu.memory_total_mib
        assert 0 < gpu["memory_used_mib"] < gpu["memory_total_mib"]
        for key in ("utilization_gpu_pct", "temperature_c", "power_w", "power_limit_w", "uuid", "name"):
            assert key in gpu
        assert gpu["ecc_errors"] == {"corrected": 0, "uncorrected": 0} and gpu["xid_errors"] == 0
        async with http.post(url + "/sim/faults", json={"gpu_xid_errors": 2, "gpu_ecc_uncorrected": 1,
                                                        "gpu_throttle": True}) as r:
            assert r.status == 200
        async with http.get(url + "/sim/gpu") as r:
            gpu = (await r.json())["gpus"][0]
        assert gpu["xid_errors"] == 2 and gpu["xid_last"] == 79 and gpu["ecc_errors"]["uncorrected"] == 1
        assert gpu["throttle_reasons"] == ["hw_thermal_slowdown"] and gpu["throttle_mask"] == 0x40
        async with http.get(url + "/sim/gpu") as r:
            g = await r.json()
        assert [e["xid"] for e in g["xid_events"]] == [79, 79] and g["boot_id"] == "g1-0"
        # The agent's report shape (inferlb.health.nvml): the same keys per GPU.
        for key in ("lost", "unsupported", "errors", "ecc_errors", "xid_last"):
            assert key in g["gpus"][0]


async def test_kv_limit_queues_requests_and_metrics_show_the_queue(http: aiohttp.ClientSession) -> None:
    # 64 KV tokens: one request of 40 prompt tokens at a time; the other waits in the node's queue.
    spec = engine_spec(kv_tokens=64, step_base_s=0.01)
    async with SimFleet([spec]) as fleet:
        node = fleet.nodes["e1"]
        url = fleet.url("e1")
        first = asyncio.create_task(chat(http, url, n=10, prompt_tokens=40))
        second = asyncio.create_task(chat(http, url, n=2, prompt_tokens=40))
        await node.wait_until(lambda s: s.live == 2)
        for _ in range(200):   # bounded: the engine admits the first within a step
            if node.core is not None and node.core.running:
                break
            await asyncio.sleep(0.005)
        state = node.engine_state()
        assert state["running"] == 1 and state["waiting"] == 1 and state["kv_usage"] > 0.5
        assert (await first)[0] == 200 and (await second)[0] == 200
        assert node.metrics.queue.n == 2 and node.metrics.queue.total > 0.05


async def test_oom_mode_resets_connections_then_cold_starts(http: aiohttp.ClientSession) -> None:
    # Two requests growing past 64 KV tokens: with on_kv_full=oom the node dies instead of preempting.
    spec = engine_spec(kv_tokens=64, on_kv_full="oom", cold_start_s=0.4, step_base_s=0.002)
    async with SimFleet([spec]) as fleet:
        node = fleet.nodes["e1"]
        url = fleet.url("e1")
        results = await asyncio.gather(chat(http, url, n=40, prompt_tokens=15, stream=True),
                                       chat(http, url, n=40, prompt_tokens=15), return_exceptions=True)
        assert all(isinstance(r, aiohttp.ClientError) for r in results), results
        assert node.engine_state()["oom_crashes"] == 1 and node.crashes == 1
        async with http.get(url + "/health") as r:
            assert r.status == 503
        status, _ = await chat(http, url)
        assert status == 503
        await asyncio.sleep(0.45)   # the cold start is real time here: the node runs on the system clock
        async with http.get(url + "/health") as r:
            assert r.status == 200
        assert (await chat(http, url))[0] == 200


async def test_preempt_mode_survives_the_same_load(http: aiohttp.ClientSession) -> None:
    async with SimFleet([engine_spec(kv_tokens=64)]) as fleet:
        url = fleet.url("e1")
        results = await asyncio.gather(chat(http, url, n=40, prompt_tokens=15, stream=True),
                                       chat(http, url, n=40, prompt_tokens=15))
        assert [r[0] for r in results] == [200, 200]
        assert fleet.nodes["e1"].engine_state()["preemptions"] >= 1


async def test_crash_endpoint_and_prompt_too_large(http: aiohttp.ClientSession) -> None:
    async with SimFleet([engine_spec(kv_tokens=256, step_base_s=0.05)]) as fleet:
        url = fleet.url("e1")
        status, raw = await chat(http, url, prompt_tokens=200, n=100)   # prompt + output over the KV cache
        assert status == 400 and json.loads(raw)["error"]["code"] == "context_length_exceeded"
        stream = asyncio.create_task(chat(http, url, n=200, stream=True))
        await fleet.nodes["e1"].wait_until(lambda s: s.live == 1)
        async with http.post(url + "/sim/crash", json={"cold_start_s": 5}) as r:
            assert r.status == 200
        with pytest.raises(aiohttp.ClientError):
            await stream
        async with http.get(url + "/health") as r:
            assert r.status == 503
        async with http.post(url + "/sim/crash", json={"cold_start_s": -1}) as r:
            assert r.status == 400


async def test_error_rates_added_latency_and_retry_after(http: aiohttp.ClientSession) -> None:
    async with SimFleet([engine_spec()], seed=3) as fleet:
        url = fleet.url("e1")
        await fleet.nodes["e1"].set_faults(FaultSpec(error_rates={500: 0.5, 429: 0.5}))
        seen: dict[int, int] = {}
        for _ in range(40):
            async with http.post(url + "/v1/chat/completions", json=body()) as r:
                seen[r.status] = seen.get(r.status, 0) + 1
                if r.status == 429:
                    assert r.headers["Retry-After"] == "1"
        assert set(seen) == {500, 429} and sum(seen.values()) == 40
        await fleet.nodes["e1"].set_faults(FaultSpec(added_latency_s=0.15))
        t0 = time.monotonic()
        assert (await chat(http, url, n=1))[0] == 200
        assert time.monotonic() - t0 >= 0.15
    with pytest.raises(ValueError, match="add up"):
        FaultSpec(error_rates={500: 0.7, 503: 0.7})
    assert FaultSpec.from_mapping({"error_rates": {"503": 0.25}}).error_rates == {503: 0.25}
    with pytest.raises(ValueError, match="status code"):
        FaultSpec.from_mapping({"error_rates": {"x": 0.25}})
    assert FaultSpec(error_rates={503: 0.5}).to_mapping()["error_rates"] == {"503": 0.5}


async def test_slow_start_after_restart_is_injected_clock_driven() -> None:
    clock = ManualClock()
    node = EmulatedNode(engine_spec(), clock=clock)
    node.faults = FaultSpec(slow_start_s=10.0, slow_start_factor=3.0)
    now = clock.monotonic()
    assert node.slow_factor(now) == pytest.approx(3.0)
    assert node.slow_factor(now + 5.0) == pytest.approx(2.0)
    assert node.slow_factor(now + 10.0) == 1.0
    node.crash(cold_start_s=2.0)             # not listening: only the state changes
    assert node.loading and node.crashes == 1
    clock.advance(2.0)
    assert not node.loading and node.slow_factor(clock.monotonic()) == pytest.approx(3.0)


def test_presets_fleets_and_fleet_files(tmp_path: Path) -> None:
    specs = fleet_specs("hetero4")
    assert [s.preset for s in specs] == ["h100", "a100", "l4", "t4"]
    steps = [s.batching.step_base_s for s in specs if s.batching is not None]
    assert steps == sorted(steps) and len(set(steps)) == 4            # slower presets step slower
    kv = [s.batching.kv_tokens for s in specs if s.batching is not None]
    assert kv == sorted(kv, reverse=True)
    assert len(fleet_specs("large16")) == 16 and {s.preset for s in fleet_specs("large16")} == {"a100"}
    f = tmp_path / "fleet.yaml"
    f.write_text("model: my-llm\nnodes:\n  - {name: a, preset: h100, kv_tokens: 1024, on_kv_full: oom}\n"
                 "  - {name: b, base_ttft_s: 0.01, tpot_s: 0.002}\n")
    a, b = load_sim_fleet(f)
    assert a.models == ["my-llm", "sim-embed"] and a.batching is not None and a.batching.kv_tokens == 1024
    assert a.batching.on_kv_full == "oom" and b.batching is None and b.tpot_s == 0.002
    f.write_text("nodes:\n  - {name: a, preset: h100, kv_tokenz: 1}\n")
    with pytest.raises(ValueError, match="kv_tokenz"):
        load_sim_fleet(f)
    with pytest.raises(ValueError, match="unknown preset"):
        preset_spec("x", "b200")
    over = cli_specs("uniform4", on_kv_full="oom", stream_interval=4)
    assert over is not None and all(s.batching is not None and s.batching.on_kv_full == "oom" for s in over)
    assert all(s.stream_interval == 4 for s in over) and cli_specs(None) is None


def two_own_nodes(models: list[str]) -> list[NodeSpec]:
    """A simulated fleet of the operator's own, named ``module:attr``."""
    return [preset_spec(f"own-{i}", "l4", models) for i in range(2)]


def test_a_fleet_of_ones_own_by_module_attr_and_files_still_read(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    own = f"{__name__}:two_own_nodes"
    assert is_named_fleet(own) and is_named_fleet("cache4") and not is_named_fleet("fleet.yaml")
    assert [s.name for s in fleet_specs(own, ["m"])] == ["own-0", "own-1"]
    assert fleet_specs(own, ["m"])[0].models == ["m"]
    with pytest.raises(PluginError, match=r"cannot load simulated fleet 'no_such_mod:fleet'.*known: cache4, "):
        fleet_specs("no_such_mod:fleet")
    with pytest.raises(ValueError, match=r"cannot read .*named fleets: hetero4, cache4, uniform4, large16"):
        fleet_specs(str(tmp_path / "missing.yaml"))
    # a file whose name has the module:attr shape is still read as the file it is
    monkeypatch.chdir(tmp_path)
    Path("mine:x.yaml").write_text("nodes:\n  - {name: a, preset: t4}\n")
    assert not is_named_fleet("mine:x.yaml")
    assert [s.name for s in fleet_specs("mine:x.yaml")] == ["a"]
