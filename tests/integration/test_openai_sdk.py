"""The real OpenAI SDK against a real gateway over HTTP, in front of simulated nodes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError

from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, fleet_for, running_gateway, settings_for


async def test_sdk_chat_completions_embeddings_models(tmp_path: Path) -> None:
    async with SimFleet(fast_specs()) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        async with running_gateway(settings_for(tmp_path, fleet_for(urls))) as (base, app):
            client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            chat = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hello there"}], max_tokens=5)
            assert chat.choices[0].message.content
            assert chat.usage is not None and chat.usage.completion_tokens == 5

            comp = await client.completions.create(model="m", prompt="say something", max_tokens=3)
            assert comp.usage is not None and comp.usage.completion_tokens == 3

            pieces, usage = [], None
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "stream please"}], max_tokens=6, stream=True,
                stream_options={"include_usage": True})
            async for chunk in stream:
                if chunk.choices:
                    pieces.append(chunk.choices[0].delta.content or "")
                if chunk.usage is not None:
                    usage = chunk.usage
            assert "".join(pieces).count("tok") == 6
            assert usage is not None and usage.completion_tokens == 6

            # without include_usage the client sees no usage chunk (the gateway asked for it anyway)
            stream = await client.completions.create(model="m", prompt="x", max_tokens=4, stream=True)
            chunks = [c async for c in stream]
            assert all(c.usage is None for c in chunks)
            assert sum(len(c.choices) for c in chunks) >= 4

            emb = await client.embeddings.create(model="emb", input=["a", "b"])
            assert len(emb.data) == 2 and emb.data[0].embedding

            models = await client.models.list()
            assert {m.id for m in models.data} == {"m", "emb"}

            with pytest.raises(NotFoundError) as nf:
                await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
            assert nf.value.code == "model_not_found"
            with pytest.raises(BadRequestError):
                await client.chat.completions.create(model="m", messages=[], max_tokens=1)

            async with httpx.AsyncClient(base_url=base) as http:
                assert (await http.get("/healthz")).status_code == 200
                ready = await http.get("/readyz")
                assert ready.status_code == 200 and ready.json()["engine"] == "compiled"
                pred = await http.post("/v1/predict/m", json={"inputs": [{"name": "x", "shape": [1, 2],
                                                                           "datatype": "FP32", "data": [1, 2]}]})
                assert pred.status_code == 200, pred.text
                fleet = (await http.get("/admin/fleet")).json()
                assert sum(n["requests_total"] for n in fleet["nodes"]) >= 6
            await client.close()
        # the streamed request without include_usage still got its usage recorded
        records = app.state.store.writer.backlog()
        assert records["records_dropped"] == 0
