"""Fallbacks people expect, over real HTTP with the real OpenAI SDK in front of emulated nodes: a
prompt over the model's context window goes to the first ``context_window_fallbacks`` model whose
context fits; a model none of whose nodes can serve falls back to its ``fallbacks``; the audit row
says which model served and why."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError

from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import NodeSpec
from tests.support import audit_of, running_gateway, settings_for

# Node → the model it serves. "m" has a small context; "tiny" is no larger (skipped); "long" fits.
SERVES = {"n0": "m", "n1": "m", "n2": "backup", "n3": "long", "n4": "tiny"}
LONG_PROMPT = "word " * 1000   # about 1,250 tokens by the byte estimate: over 256, under 100,000


def fleet(urls: dict[str, str]) -> Any:
    return fleet_from_mapping({
        "models": [
            {"name": "m", "max_context_tokens": 256, "max_output_tokens": 64, "default_max_tokens": 8,
             "fallbacks": ["backup"], "context_window_fallbacks": ["tiny", "long"]},
            {"name": "backup", "max_context_tokens": 256, "max_output_tokens": 64, "default_max_tokens": 8},
            {"name": "tiny", "max_context_tokens": 256, "max_output_tokens": 64, "default_max_tokens": 8},
            {"name": "long", "max_context_tokens": 100_000, "max_output_tokens": 64, "default_max_tokens": 8},
        ],
        "nodes": [{"name": n, "url": u, "models": [SERVES[n]]} for n, u in urls.items()],
        "routing": {"profile": "round-robin", "seed": 1},
        "timeouts": {"connect_s": 1.0, "first_token_s": 2.0, "idle_s": 2.0, "total_s": 10.0},
    })


@contextlib.asynccontextmanager
async def stack(tmp: Path) -> AsyncIterator[tuple[SimFleet, AsyncOpenAI, httpx.AsyncClient, Any]]:
    specs = [NodeSpec(name=n, models=[m], base_ttft_s=0.002, tpot_s=0.0005) for n, m in SERVES.items()]
    async with SimFleet(specs) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        async with running_gateway(settings_for(tmp, fleet(urls))) as (base, app), \
                httpx.AsyncClient(base_url=base, timeout=10) as http:
            sdk = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, http_client=http)
            yield sim, sdk, http, app



async def test_a_prompt_over_the_context_window_goes_to_the_first_fallback_that_fits(tmp_path: Path) -> None:
    async with stack(tmp_path) as (sim, sdk, http, app):
        plain = await sdk.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=4)
        chat = plain.parse()
        assert chat.model == "long" and chat.usage is not None and chat.usage.completion_tokens == 4
        streamed = await sdk.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=4, stream=True)
        assert {c.model async for c in streamed.parse()} == {"long"}
        for rid in (plain.headers["x-request-id"], streamed.headers["x-request-id"]):
            rec = await audit_of(http, app, rid)
            assert rec["model_requested"] == "m" and rec["model_served"] == "long" and rec["node"] == "n3"
            [move] = rec["tags"]["model_fallback"]
            assert move["from"] == "m" and move["to"] == "long" and move["reason"] == "context_window"
            assert move["prompt_tokens_est"] > move["context_tokens"] == 256
            assert [a["model"] for a in rec["attempts"]] == ["long"]
        assert sim.nodes["n4"].stats.requests_total == 0   # "tiny" was listed first but cannot hold it
        # A short prompt stays on its model; a model with no fallback that fits refuses in the envelope.
        chat = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4)
        assert chat.model == "m"
        with pytest.raises(BadRequestError) as err:
            await sdk.chat.completions.create(model="backup", messages=[{"role": "user", "content": LONG_PROMPT}],
                                              max_tokens=4)
        assert err.value.code == "context_length_exceeded"


async def test_a_model_no_node_can_serve_falls_back_to_its_fallback_model(tmp_path: Path) -> None:
    async with stack(tmp_path) as (sim, sdk, http, app):
        await sim.stop_node("n0")
        await sim.stop_node("n1")
        raw = await sdk.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        chat = raw.parse()
        assert chat.model == "backup" and chat.choices[0].message.content
        rec = await audit_of(http, app, raw.headers["x-request-id"])
        assert rec["status"] == "ok" and rec["model_served"] == "backup" and rec["node"] == "n2"
        assert [(a["model"], a["outcome"]) for a in rec["attempts"]] == [
            ("m", "retryable"), ("m", "retryable"), ("backup", "ok")]
        [move] = rec["tags"]["model_fallback"]
        assert move == {"from": "m", "to": "backup", "reason": "failed: connect_error"}
        assert sim.nodes["n3"].stats.requests_total == 0 and sim.nodes["n4"].stats.requests_total == 0
