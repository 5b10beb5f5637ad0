"""The prober over real HTTP: a tiny aiohttp server serves exposition fixtures, agent reports and
misbehaviour; every outcome is a Sample, nothing raises."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from inferlb.config.health import HealthConfig
from inferlb.config.settings import fleet_from_mapping
from inferlb.health.probe import Prober, targets_for
from inferlb.types import SystemClock
from tests.support import free_port

FIX = Path(__file__).parent / "fixtures"


class Fake:
    """Per-path behaviour: status, body, or a hang."""

    def __init__(self) -> None:
        self.status: dict[str, int] = {}
        self.body: dict[str, bytes] = {}
        self.hang: set[str] = set()
        self.hits: dict[str, int] = {}
        self.auth: list[str | None] = []
        self.peers: dict[str, set[Any]] = {}     # path -> client (host, port): one per connection

    async def handle(self, request: web.Request) -> web.Response:
        path = request.path
        self.hits[path] = self.hits.get(path, 0) + 1
        self.peers.setdefault(path, set()).add(request.transport.get_extra_info("peername")
                                               if request.transport is not None else None)
        self.auth.append(request.headers.get("authorization"))
        if path in self.hang:
            await asyncio.sleep(30)
        return web.Response(status=self.status.get(path, 200), body=self.body.get(path, b"{}"))


@pytest.fixture
async def server() -> AsyncIterator[tuple[Fake, str]]:
    fake = Fake()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _prober(url: str, kind: str = "vllm", timeout_s: float = 0.5, **node_health: Any) -> Prober:
    cfg = fleet_from_mapping({
        "models": [{"name": "m"}],
        "nodes": [{"name": "a", "url": url, "models": ["m"], "kind": kind, "api_key": "node-secret"}],
        "health": {"probe": {"timeout_s": timeout_s, "max_body_bytes": 100_000}, "nodes": {"a": node_health}},
    })
    return Prober(cfg.nodes, cfg.health, SystemClock())


async def _collect(p: Prober) -> dict[str, Any]:
    try:
        return {s.source: s for s in await p.collect()}
    finally:
        await p.close()


def test_default_targets_follow_the_node_kind() -> None:
    cfg = fleet_from_mapping({"models": [{"name": "m"}], "nodes": [
        {"name": "v", "url": "http://127.0.0.1:1", "models": ["m"], "kind": "vllm"},
        {"name": "o", "url": "http://127.0.0.1:2", "models": ["m"], "kind": "openai"},
        {"name": "t", "url": "http://127.0.0.1:3", "models": ["m"], "kind": "triton"},
    ], "health": {"nodes": {"o": {"probe": False, "agent_url": "http://127.0.0.1:9/gpu"}}}})
    got = [(t.node, t.source, t.url, t.fmt) for t in targets_for(cfg.nodes, cfg.health)]
    assert got == [("v", "probe", "http://127.0.0.1:1/health", None),
                   ("v", "metrics", "http://127.0.0.1:1/metrics", "vllm"),
                   ("o", "agent", "http://127.0.0.1:9/gpu", None),
                   ("t", "probe", "http://127.0.0.1:3/v2/health/ready", None)]


async def test_probe_metrics_agent_and_dcgm_samples(server: tuple[Fake, str]) -> None:
    fake, url = server
    fake.body["/metrics"] = (FIX / "vllm_v1.prom").read_bytes()
    fake.body["/dcgm"] = (FIX / "dcgm.prom").read_bytes()
    fake.body["/gpu"] = json.dumps({"nvml": "unavailable", "reason": "no driver"}).encode()
    s = await _collect(_prober(url, agent_url=url + "/gpu", dcgm_url=url + "/dcgm"))
    assert s["probe"].ok and s["probe"].status == 200 and s["probe"].latency_ms >= 0
    assert s["metrics"].ok and s["metrics"].values == {"format": "vllm", "running": 12, "waiting": 3,
                                                       "kv_usage": 0.6875, "lora": None}
    assert s["agent"].ok and s["agent"].values["nvml"] == "unavailable"
    assert s["dcgm"].ok and len(s["dcgm"].values["gpus"]) == 2
    assert fake.auth[:2] == ["Bearer node-secret"] * 2     # the node's own key (vLLM --api-key), never a client's


async def test_503_is_loading_other_statuses_fail(server: tuple[Fake, str]) -> None:
    fake, url = server
    fake.status["/health"] = 503
    fake.status["/metrics"] = 500
    s = await _collect(_prober(url))
    assert not s["probe"].ok and s["probe"].values == {"loading": True} and s["probe"].status == 503
    assert not s["metrics"].ok and s["metrics"].error == "HTTP 500"


async def test_faults_are_samples_never_exceptions(server: tuple[Fake, str]) -> None:
    fake, url = server
    fake.hang.add("/health")
    fake.body["/metrics"] = b"<html>oops {"
    fake.body["/gpu"] = b"[1, 2]"
    fake.body["/big"] = b"x" * 200_000
    s = await _collect(_prober(url, timeout_s=0.3, agent_url=url + "/gpu", dcgm_url=url + "/big"))
    assert not s["probe"].ok and s["probe"].error == "timeout after 0.3s"
    assert not s["metrics"].ok and "unparsable metrics page" in (s["metrics"].error or "")
    assert not s["agent"].ok and "not a node-agent report" in (s["agent"].error or "")
    assert not s["dcgm"].ok and "body over 100000 bytes" in (s["dcgm"].error or "")


async def test_refused_connection_is_a_failed_sample() -> None:
    s = await _collect(_prober(f"http://127.0.0.1:{free_port()}"))
    assert not s["probe"].ok and "ConnectError" in (s["probe"].error or "")
    assert s["probe"].status is None


async def test_a_probe_never_follows_redirects(server: tuple[Fake, str]) -> None:
    fake, url = server
    fake.status["/health"] = 307
    s = await _collect(_prober(url))
    assert not s["probe"].ok and s["probe"].error == "HTTP 307"
    assert set(fake.hits) == {"/health", "/metrics"}


def test_health_config_rejects_unknown_keys() -> None:
    with pytest.raises(Exception, match=r"unknown key|Extra inputs"):
        fleet_from_mapping({"models": [{"name": "m"}], "nodes": [], "health": {"probe": {"timout_s": 1}}})
    assert HealthConfig().stale_after_s == 15.0


def test_health_nodes_must_name_fleet_nodes() -> None:
    from inferlb.errors import ConfigError
    from inferlb.health.monitor import check_health_config

    cfg = fleet_from_mapping({"models": [{"name": "m"}], "nodes": [{"name": "a", "url": "http://127.0.0.1:1",
                                                                   "models": ["m"]}],
                              "health": {"nodes": {"b": {"probe": False}}}})
    with pytest.raises(ConfigError, match=r"health\.nodes\.b: unknown node 'b'"):
        check_health_config(cfg)


async def test_probes_keep_their_connection_between_rounds(server: tuple[Fake, str]) -> None:
    # A probe reads (and drops) its body so the connection goes back to the pool: a new TCP
    # connect every round was most of an idle gateway's health cost.
    fake, url = server
    fake.body["/health"] = b'{"status": "ok"}'
    p = _prober(url, kind="vllm", metrics="none")
    try:
        for _ in range(3):
            s = {x.source: x for x in await p.collect()}
            assert s["probe"].ok
    finally:
        await p.close()
    assert fake.hits["/health"] == 3 and len(fake.peers["/health"]) == 1


def parse_plain(text: str) -> dict[str, Any]:
    """A metrics format of the operator's own: ``running waiting`` on one line."""
    running, waiting = (int(x) for x in text.split())
    return {"format": "plain", "running": running, "waiting": waiting, "kv_usage": None}


async def test_a_metrics_format_of_ones_own_by_module_attr(server: tuple[Fake, str]) -> None:
    fake, url = server
    fake.body["/metrics"] = b"4 2\n"
    p = _prober(url, kind="openai", metrics=f"{__name__}:parse_plain")
    assert [t.parse for t in p.targets if t.source == "metrics"] == [parse_plain]   # resolved once, at build
    s = await _collect(p)
    assert s["metrics"].ok and s["metrics"].values == {"format": "plain", "running": 4, "waiting": 2,
                                                       "kv_usage": None}


def test_a_metrics_format_that_does_not_resolve_fails_the_fleet_file() -> None:
    from inferlb.errors import PluginError

    for fmt, why in (("prom", "unknown metrics format 'prom'"),
                     (f"{__name__}:nope", f"cannot load metrics format '{__name__}:nope'"),
                     ("dcgm", "metrics format 'dcgm' is a DCGM exporter's page: give its URL as dcgm_url")):
        with pytest.raises(PluginError) as info:
            _prober("http://127.0.0.1:1", metrics=fmt)
        assert info.value.path == "health.nodes.a.metrics" and info.value.name == fmt
        assert why in str(info.value) and "(known: dcgm, llamacpp, sglang, tgi, vllm;" in str(info.value)
