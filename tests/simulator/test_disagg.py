"""The emulator's prefill/decode legs (simulator/disagg.py): vLLM's kv_transfer_params over real HTTP."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from inferlb.simulator.disagg import KVTransferSpec, kv_leg, prefill_answer_params
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import NodeSpec

MODEL = "m1"
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


def _spec(name: str) -> NodeSpec:
    return NodeSpec(name=name, models=[MODEL], base_ttft_s=0.001, tpot_s=0.0005, default_output_tokens=4)


def _chat(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "x" * 400}], **kw}


def test_transfer_cost_is_tokens_times_bytes_over_bandwidth_plus_latency() -> None:
    spec = KVTransferSpec(bytes_per_token=1000, link_bytes_per_s=1e6, latency_s=0.01)
    assert spec.transfer_s(0) == pytest.approx(0.01)
    assert spec.transfer_s(500) == pytest.approx(0.51)
    with pytest.raises(ValueError, match="link_bytes_per_s"):
        KVTransferSpec(link_bytes_per_s=0)


def test_kv_leg_reads_the_flags_and_refuses_what_vllm_refuses() -> None:
    assert kv_leg({}) is None
    assert kv_leg({"kv_transfer_params": PREFILL_PARAMS}) == "prefill"
    good = prefill_answer_params(engine_id="p0", host="127.0.0.1", port=1, request_id="r", prompt_tokens=40)
    assert good["remote_block_ids"] == [0, 1, 2] and good["do_remote_prefill"] is True
    assert kv_leg({"kv_transfer_params": good}) == "decode"
    for bad in ("x", {"do_remote_decode": True, "do_remote_prefill": True},
                {"do_remote_prefill": True, "remote_block_ids": []}):
        with pytest.raises(ValueError):
            kv_leg({"kv_transfer_params": bad})


async def test_prefill_then_decode_over_http() -> None:
    async with SimFleet([_spec("p0"), _spec("d0")]) as fleet, aiohttp.ClientSession() as http:
        p, d = fleet.nodes["p0"], fleet.nodes["d0"]
        async with http.post(p.url + "/v1/chat/completions",
                             json=_chat(max_tokens=1, stream=False, kv_transfer_params=PREFILL_PARAMS)) as r:
            assert r.status == 200
            answer = await r.json()
        kv = answer["kv_transfer_params"]
        assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
        assert kv["remote_engine_id"] == "p0" and kv["remote_port"] == p.port
        assert len(kv["remote_block_ids"]) == 7            # 100 prompt tokens in blocks of 16
        assert answer["usage"]["completion_tokens"] == 1
        async with http.post(d.url + "/v1/chat/completions",
                             json=_chat(max_tokens=5, stream=True, kv_transfer_params=kv)) as r:
            assert r.status == 200
            body = await r.read()
        assert body.rstrip().endswith(b"data: [DONE]")
        assert (p.stats.prefill_legs, p.stats.decode_legs) == (1, 0)
        assert (d.stats.prefill_legs, d.stats.decode_legs) == (0, 1)
        # A whole request is neither leg and carries no kv_transfer_params back.
        async with http.post(d.url + "/v1/chat/completions", json=_chat(max_tokens=2)) as r:
            assert "kv_transfer_params" not in await r.json()
        assert d.stats.decode_legs == 1


async def test_bad_kv_transfer_params_are_a_400() -> None:
    async with SimFleet([_spec("d0")]) as fleet, aiohttp.ClientSession() as http:
        url = fleet.nodes["d0"].url + "/v1/chat/completions"
        async with http.post(url, json=_chat(kv_transfer_params={"do_remote_prefill": True})) as r:
            assert r.status == 400
            assert (await r.json())["error"]["param"] == "kv_transfer_params"
        async with http.post(url, json=_chat(stream=True, kv_transfer_params=PREFILL_PARAMS)) as r:
            assert r.status == 400


def test_a_sim_fleet_file_sets_the_kv_transfer_cost() -> None:
    from inferlb.simulator.presets import spec_from_mapping

    spec = spec_from_mapping({"name": "d0", "preset": "a100", "kv_transfer": {"bytes_per_token": 2048,
                                                                             "link_bytes_per_s": 1e9}})
    assert spec.kv_transfer == KVTransferSpec(bytes_per_token=2048, link_bytes_per_s=1e9)
    with pytest.raises(ValueError, match="d0"):
        spec_from_mapping({"name": "d0", "kv_transfer": {"bandwidth": 1}})
