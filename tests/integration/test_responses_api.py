"""``POST /v1/responses`` (the OpenAI Responses API) through the gateway with the real OpenAI SDK:
forwarded like chat to the nodes whose kind serves it, streamed and not, audited; a clear error
where no node of the model serves it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError, InternalServerError

from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import NodeSpec
from tests.support import running_gateway, settings_for


def _fleet(urls: dict[str, str]) -> object:
    return fleet_from_mapping({
        "models": [{"name": "m", "max_output_tokens": 256, "default_max_tokens": 8},
                   {"name": "t", "max_output_tokens": 256}],
        # "tgi" serves m too, but is never sent a Responses request; "t" only has a TGI node.
        "nodes": [{"name": "v", "url": urls["v"], "models": ["m"], "kind": "vllm"},
                  {"name": "g", "url": urls["g"], "models": ["m", "t"], "kind": "tgi"}],
        "routing": {"profile": "round-robin", "seed": 1},
        "timeouts": {"connect_s": 1.0, "first_token_s": 5.0, "idle_s": 5.0, "total_s": 10.0},
    })


async def test_responses_api_streamed_and_not_only_on_nodes_that_serve_it(tmp_path: Path) -> None:
    specs = [NodeSpec(name=n, models=["m", "t"], base_ttft_s=0.002, tpot_s=0.0005) for n in ("v", "g")]
    async with SimFleet(specs) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        async with running_gateway(settings_for(tmp_path, _fleet(urls))) as (base, app):  # type: ignore[arg-type]
            client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            ids = []
            for _ in range(3):
                resp = await client.responses.create(model="m", input="hello there", max_output_tokens=5)
                assert resp.output_text == "tok0 tok1 tok2 tok3 tok4 "
                assert resp.usage is not None and resp.usage.output_tokens == 5

            deltas: list[str] = []
            completed = None
            async with httpx.AsyncClient(base_url=base) as http:
                stream = await client.responses.create(model="m", input=[{"role": "user", "content": "hi"}],
                                                       max_output_tokens=4, stream=True)
                async for event in stream:
                    if event.type == "response.output_text.delta":
                        deltas.append(event.delta)
                    elif event.type == "response.completed":
                        completed = event.response
                assert "".join(deltas) == "tok0 tok1 tok2 tok3 "
                assert completed is not None and completed.usage is not None

                assert sim.nodes["g"].stats.requests_total == 0   # the TGI node never saw one
                assert sim.nodes["v"].stats.requests_total == 4

                await app.state.store.writer.flush_once(force=True)
                rows = (await http.get("/audit/requests", params={"limit": 10})).json()
                items = rows["data"]
                got = [r for r in items if r["endpoint"] == "responses"]
                ids = [r["request_id"] for r in got]
                assert len(got) == 4 and all(r["status"] == "ok" and r["node"] == "v" for r in got)
                streamed = next(r for r in got if r["stream"])
                assert streamed["completion_tokens"] == 4 and streamed["prompt_tokens"] is not None

                # no node of "t" serves the Responses API: a clear error in the OpenAI envelope
                with pytest.raises(InternalServerError) as e501:
                    await client.responses.create(model="t", input="x")
                assert e501.value.status_code == 501 and e501.value.code == "unsupported_endpoint"
                assert "tgi" in str(e501.value.message)
                with pytest.raises(BadRequestError) as bad:
                    await client.responses.create(model="m", input="")
                assert bad.value.param == "input"
                r = await http.post("/v1/responses", json={"input": "x"})
                assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert len(set(ids)) == 4
