"""The gateway end to end with emulated nodes that publish KV events: the subscriptions start with
the app, routing sends a prompt to the node whose engine holds its prefix (said in the audit
decision), the dashboard panel and /metrics show the index, and a reload that drops a node's
events makes its decisions fall back, saying why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import NodeSpec
from tests.support import running_gateway, settings_for

SYSTEM = "You answer questions about the municipal library's opening hours and loans. " * 16


def _fleet(sim: SimFleet, *, silent: str | None = None) -> dict[str, Any]:
    nodes = []
    for name, node in sim.nodes.items():
        pub = node.kv_publisher
        assert pub is not None
        n: dict[str, Any] = {"name": name, "url": node.url, "models": ["m"]}
        if name != silent:
            n["kv_events"] = {"endpoint": pub.endpoint, "replay_endpoint": pub.replay_endpoint}
        nodes.append(n)
    return {
        "models": [{"name": "m", "max_output_tokens": 256, "default_max_tokens": 4,
                    "kv_events": {"tokenizer": "emulator"}}],
        "nodes": nodes,
        "routing": {"profile": "prefix-affinity", "seed": 1},
        "timeouts": {"connect_s": 1.0, "first_token_s": 2.0, "idle_s": 2.0, "total_s": 10.0},
    }


async def _audit(http: httpx.AsyncClient, app: Any, rid: str) -> dict[str, Any]:
    for _ in range(1000):   # hang guard: the batched writer lands the row soon after the answer
        await app.state.store.writer.flush_once(force=True)
        r = await http.get(f"/audit/requests/{rid}")
        if r.status_code == 200:
            out: dict[str, Any] = r.json()
            return out
    raise AssertionError("no audit row")


def _detail(rec: dict[str, Any]) -> dict[str, Any]:
    d: dict[str, Any] = rec["decision"]["pick_detail"]
    return d


async def test_routing_follows_the_engines_kv_events_and_falls_back_when_they_go(tmp_path: Path) -> None:
    specs = [NodeSpec(name=f"n{i}", models=["m"], base_ttft_s=0.001, tpot_s=0.0001, prefix_cache=True,
                      prefix_cache_tokens=16_384, kv_events_port=0) for i in range(3)]
    async with SimFleet(specs) as sim:
        path = tmp_path / "fleet.yaml"
        path.write_text(yaml.safe_dump(_fleet(sim)))
        settings = settings_for(tmp_path, fleet_from_mapping(_fleet(sim))).model_copy(
            update={"fleet": None, "config": path})
        async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base) as http:
            async def chat(question: str, user: str) -> tuple[str, dict[str, Any]]:
                body = {"model": "m", "max_tokens": 4, "user": user,
                        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
                r = await http.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                rec = await _audit(http, app, r.headers["x-request-id"])
                return rec["attempts"][-1]["node"], rec

            first, _ = await chat("When do you open on Sundays?", "alice")
            service = app.state.kv_events.service
            for i in range(200):          # until the index heard the first node (the SUB may join late)
                if service.index.blocks(first) > 0:
                    break
                await chat(f"warm-up question number {i} " * 8, f"warm-{i}")
            assert service.index.blocks(first) > 0
            # Other users (other session keys, other HRW nodes): the index sends them where SYSTEM is cached.
            for user in ("bob", "carol", "dave", "erin"):
                node, rec = await chat("Can I renew a loan online?", user)
                detail = _detail(rec)
                assert detail["affinity"] == "kv-index" and detail["kv_index"]["used"] is True, detail
                held = detail["kv_index"]["held"]
                assert node == max(held, key=held.get) and held[node] >= len(SYSTEM) // 64
            panel = (await http.get("/dashboard/kv-events")).json()
            assert panel["enabled"] is True and panel["nodes"][first]["blocks"] > 0
            assert panel["models"]["m"]["used"] >= 4
            metrics = (await http.get("/metrics")).text
            assert 'inferlb_kv_index_decisions_total{model="m",outcome="used"}' in metrics
            # A reload whose node n0 no longer publishes: the decisions fall back to the hash, saying why.
            path.write_text(yaml.safe_dump(_fleet(sim, silent="n0")))
            await app.state.live.reload(trigger="test")
            await app.state.kv_events.settled()
            assert "n0" not in app.state.kv_events.subs.subs
            _, rec = await chat("Do you lend e-books?", "frank")
            assert _detail(rec)["kv_index"] == {"used": False, "fallback": "n0: no events"}
            metrics = (await http.get("/metrics")).text
            assert 'inferlb_kv_index_fallbacks_total{model="m",reason="no events"} 1.0' in metrics
