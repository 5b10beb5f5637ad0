"""No request loops (engine/hops.py), over real HTTP: a node whose URL leads back to the gateway
itself (through a route the gateway cannot recognise as its own listener: here its configured
port differs from the one it serves on, as behind a Service) costs one attempt and one audit row
per client request, answered 508 at once; every request to a node carries the hop marker and Via."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from inferlb.config.settings import FleetConfig, fleet_from_mapping
from tests.support import free_port, running_gateway, settings_for

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def one_node(url: str) -> FleetConfig:
    return fleet_from_mapping({
        "models": [{"name": "m", "default_max_tokens": 4}],
        "nodes": [{"name": "n0", "url": url, "models": ["m"]}],
        "routing": {"profile": "round-robin", "seed": 1},
        "timeouts": {"connect_s": 1.0, "first_token_s": 5.0, "idle_s": 5.0, "total_s": 30.0},
        "health": {"nodes": {"n0": {"probe": False}}},
    })


def audit_rows(tmp: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(tmp / "audit.db") as db:
        return db.execute("SELECT request_id, status, http_status, attempt_count FROM requests").fetchall()


async def test_a_node_pointing_at_the_gateway_itself_is_one_508_and_one_audit_row_per_request(tmp_path: Path
                                                                                              ) -> None:
    port = free_port()
    settings = settings_for(tmp_path, one_node(f"http://127.0.0.1:{port}"))   # INFERLB_PORT stays 8080
    async with running_gateway(settings, port=port) as (base, _app), \
            httpx.AsyncClient(base_url=base, timeout=10) as client:
        answers = [await client.post("/v1/chat/completions", json=CHAT) for _ in range(3)]
    for r in answers:
        assert r.status_code == 508, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == "loop_detected"
    rows = audit_rows(tmp_path)
    assert len(rows) == 3, rows                                   # was 177 before the hop marker
    assert {r[0] for r in rows} == {a.headers["x-request-id"] for a in answers}
    assert all(r[1] == "loop_detected" and r[2] == 508 and r[3] == 1 for r in rows), rows


class EchoNode:
    """A model server that answers chat and keeps the headers it was sent."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    async def chat(self, request: web.Request) -> web.Response:
        self.seen.append({k.lower(): v for k, v in request.headers.items()})
        return web.json_response({"id": "c", "object": "chat.completion", "model": "m", "created": 0,
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": "ok"}}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


@pytest.fixture
async def echo() -> AsyncIterator[tuple[EchoNode, str]]:
    node = EchoNode()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", node.chat)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield node, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_hop_marker_sent_and_arrivals_judged(tmp_path: Path, echo: tuple[EchoNode, str]) -> None:
    node, url = echo
    settings = settings_for(tmp_path, one_node(url), max_hops=3)
    async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base, timeout=10) as client:
        me = app.state.gateway.hop_id
        ok = await client.post("/v1/chat/completions", json=CHAT, headers={"x-inferlb-hop": "edge-1"})
        assert ok.status_code == 200, ok.text
        assert node.seen[-1]["x-inferlb-hop"] == f"edge-1, {me}"
        assert node.seen[-1]["via"] == f"1.1 edge-1, 1.1 {me}"
        # this gateway's own marker: refused, not audited (the request that looped is audited upstream)
        own = await client.post("/v1/chat/completions", json=CHAT, headers={"x-inferlb-hop": f"edge-1, {me}"})
        assert own.status_code == 508 and own.json()["error"]["code"] == "loop_detected"
        # as many hops as INFERLB_MAX_HOPS: refused and audited here, once
        far = await client.post("/v1/predict/m", json={"inputs": []}, headers={"x-inferlb-hop": "a, b, c"})
        assert far.status_code == 508 and far.json()["error"]["param"] == "x-inferlb-hop"
    assert len(node.seen) == 1                  # neither refused request reached the node
    rows = {r[0]: r for r in audit_rows(tmp_path)}
    assert set(rows) == {ok.headers["x-request-id"], far.headers["x-request-id"]}
    assert rows[far.headers["x-request-id"]][2] == 508
