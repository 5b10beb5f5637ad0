"""What the gateway teaches the fleet from real answers (issue 13 items 10-11): real HTTP between
the gateway and a simulated node, the real OpenAI SDK as client. The node decodes at 100 tokens/s
(10 ms per token); the bound asserted is 10 × that, so a loaded machine's timing jitter cannot fail
the test while the old measure (first byte to last byte of a non-streamed answer: ~0 s) does."""

from __future__ import annotations

from pathlib import Path

from openai import AsyncOpenAI

from inferlb.simulator import SimFleet

from ..support import fast_specs, fleet_for, running_gateway, settings_for


async def test_the_gateway_teaches_decode_speed_and_latency_like_with_like(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(1, base_ttft_s=0.005, tpot_s=0.01)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        async with running_gateway(settings_for(tmp_path, fleet_for(urls))) as (base, app):
            client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            st = app.state.gateway.rt.fleet.nodes["n0"]
            for _ in range(3):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=20)
            # Non-streamed: first byte == last byte. The speed was ~infinite (decode time ~0) before.
            assert st.tokens_per_s is not None and 0 < st.tokens_per_s < 1000, st.tokens_per_s
            assert len(st.iv_tpot) == 3 and st.iv_ttft == []       # judged per output token, not by TTFT
            for _ in range(2):
                stream = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=20, stream=True)
                async for _ in stream:
                    pass
            assert len(st.iv_ttft) == 2 and len(st.iv_tpot) == 3
            assert st.ttft_ewma is not None and 0 < st.tokens_per_s < 1000, st.tokens_per_s
