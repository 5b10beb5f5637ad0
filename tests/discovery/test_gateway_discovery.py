"""Kubernetes discovery in a running gateway (create_app): the real ``kubernetes`` client, configured
from a kubeconfig file, watches recorded EndpointSlices served over HTTP; the pods are simulated
model servers. Pods join through probes and slow start and serve requests sent with the real
OpenAI SDK; a terminating pod is drained, then removed; node events, /admin/fleet and /metrics
show it; operators cannot patch a discovered node."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.simulator.emulator import SimFleet
from tests.discovery.apiserver import FakeApiServer, Running
from tests.support import fast_specs, running_gateway, settings_for

pytest.importorskip("kubernetes")

A, B, C = (f"llm-6f7d8c9b5-{x * 5}" for x in "abc")


def kubeconfig(tmp: Path, server: str) -> Path:
    path = tmp / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: test, cluster: {{server: "{server}"}}}}]
users: [{{name: gateway, user: {{token: test-token}}}}]
contexts: [{{name: test, context: {{cluster: test, user: gateway, namespace: inference}}}}]
current-context: test
""")
    return path


async def until(cond: Callable[[], bool], what: str) -> None:
    """Wait for work the gateway does in the background (bounded in turns, not a timed assert)."""
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def test_pods_join_serve_and_leave_through_discovery(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(3)) as sim:
        ports = [int(node.url.rsplit(":", 1)[1]) for node in sim.nodes.values()]
        fake = FakeApiServer(rewrite=dict(zip(("10.244.1.17", "10.244.2.31", "10.244.3.9"), ports, strict=True)))
        running = Running(fake)
        api_url = await running.start()
        try:
            fleet = fleet_from_mapping({
                "models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8}],
                "nodes": [],
                "routing": {"profile": "round-robin", "seed": 1},
                "timeouts": {"connect_s": 1.0, "first_token_s": 2.0, "idle_s": 2.0, "total_s": 10.0},
                "health": {"slow_start": {"window_s": 60}},
                "discovery": [{"namespace": "inference", "service": "llm", "port": "http",
                               "kubeconfig": str(kubeconfig(tmp_path, api_url)), "settle_s": 0.05,
                               "node": {"models": ["m"], "kind": "sim", "labels": {"gpu": "l4"}}}]})
            settings = settings_for(tmp_path, fleet, overrides_poll_s=3600)
            async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base, timeout=30) as http:
                f: Fleet = app.state.gateway.rt.fleet
                (source,) = app.state.discovery
                await until(lambda: {A, B} <= set(f.nodes), "the listed pods joined")
                assert fake.auth[0] == "Bearer test-token"
                assert f.nodes[A].state == "loading" and f.nodes[B].state == "loading"
                for _ in range(5):         # health rounds, driven here instead of waiting for the timer
                    await app.state.monitor.run_once()
                    if f.nodes[A].state == f.nodes[B].state == "healthy":
                        break
                assert f.nodes[A].state == "healthy" and f.nodes[A].slow_start_at is not None

                client = AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
                for i in range(6):
                    r = await client.chat.completions.create(model="m", max_tokens=4,
                                                             messages=[{"role": "user", "content": f"hi {i}"}])
                    assert r.choices[0].message.content
                assert f.nodes[A].requests_total > 0 and f.nodes[B].requests_total > 0

                doc = (await http.get("/admin/fleet")).json()
                assert {n["name"]: n["source"] for n in doc["nodes"]} == {A: "discovery", B: "discovery"}
                r = await http.patch(f"/admin/nodes/{A}", json={"weight": 2})
                assert r.status_code == 409 and r.json()["error"]["code"] == "discovered_node", r.text

                fake.push("watch_join.jsonl")
                await until(lambda: C in f.nodes, "a new pod joined from the watch")
                assert f.nodes[C].state == "loading"
                fake.push("watch_terminating.jsonl")
                await until(lambda: A not in f.nodes, "the terminating pod was drained, then removed")
                r = await client.chat.completions.create(model="m", max_tokens=4,
                                                         messages=[{"role": "user", "content": "after"}])
                assert r.choices[0].message.content
                await client.close()

                events = (await http.get("/admin/fleet/events", params={"limit": 200})).json()["events"]
                mine = [(e["to"], e["evidence"].get("trigger")) for e in events if e["node"] == A]
                assert ("loading", "discovery") in mine and ("draining", "discovery") in mine
                assert {e["to"] for e in events if e["node"] == A} >= {"loading", "healthy", "draining", "removed"}
                metrics = (await http.get("/metrics")).text
                assert 'inferlb_discovery_synced{source="kubernetes:inference/llm"} 1.0' in metrics
                assert 'inferlb_discovery_nodes{source="kubernetes:inference/llm",state="serving"} 2.0' in metrics
                assert source.status()["nodes"] == {B: "serving", C: "serving"}
        finally:
            await running.stop()
