"""Session and prefix affinity through a real gateway over HTTP, with the real OpenAI SDK in front
of simulated nodes: a conversation stays on one node, and the audit says why."""

from __future__ import annotations

import collections
from pathlib import Path

import httpx
from openai import AsyncOpenAI, BadRequestError

from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

SYSTEM = "You answer questions about the inferlb load balancer, briefly and exactly. " * 20


async def test_session_affine_requests_land_on_one_node(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(4)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        fleet = fleet_for(urls, profile="prefix-affinity", seed=1)
        async with running_gateway(settings_for(tmp_path, fleet)) as (base, app):
            client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            by_session: dict[str, set[str]] = collections.defaultdict(set)
            ids: list[str] = []
            for turn in range(6):
                for who in ("alice", "bob", "carol"):
                    history = [{"role": "user", "content": f"question {k} from {who}"} for k in range(turn + 1)]
                    raw = await client.chat.completions.with_raw_response.create(
                        model="m", messages=[{"role": "system", "content": f"{who}: short"}, *history],
                        max_tokens=3, extra_headers={"x-session-id": f"session-{who}"})
                    chat = raw.parse()
                    by_session[who].add(chat.system_fingerprint or "?")   # the emulator names itself here
                    ids.append(raw.headers["x-request-id"])
            assert all(len(nodes) == 1 for nodes in by_session.values()), by_session

            # the body's `user` field is the session when no header is sent
            users = set()
            for k in range(5):
                chat = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"hello {k}"}], max_tokens=2, user="dora")
                users.add(chat.system_fingerprint)
            assert len(users) == 1

            # no session: a long shared system prompt keys the requests (prefix affinity), streamed too
            prefix_nodes = set()
            for k in range(5):
                stream = await client.chat.completions.create(
                    model="m", messages=[{"role": "system", "content": SYSTEM},
                                         {"role": "user", "content": f"question {k}"}],
                    max_tokens=2, stream=True)
                async for chunk in stream:
                    prefix_nodes.add(chunk.system_fingerprint)
            assert len(prefix_nodes) == 1

            # a bad session header is a 400 in the OpenAI envelope, never a 500
            try:
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1,
                    extra_headers={"x-session-id": "x" * 300})
                raise AssertionError("an over-long x-session-id was accepted")
            except BadRequestError as err:
                assert err.param == "x-session-id"
            await client.close()

            await app.state.store.writer.flush_once(force=True)   # the audit rows are written now
            async with httpx.AsyncClient(base_url=base) as http:
                r = await http.get(f"/audit/requests/{ids[-1]}")
                assert r.status_code == 200, r.text
                decision = r.json()["decision"]
            detail = decision["pick_detail"]
            assert decision["profile"] == "prefix-affinity" and decision["picker"] == "affinity"
            assert detail["affinity"] == "session" and detail["hrw_first"] == decision["pick"]
            assert "carol" not in str(detail)

