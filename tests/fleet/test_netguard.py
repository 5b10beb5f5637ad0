"""The network policy at connection time (fleet/netguard.py), over real HTTP on loopback: the
data-path client (engine/upstream.py) and the prober (health/probe.py) resolve node host names
through the guard, so a name that resolves to a refused address (DNS rebinding onto the metadata
service or onto the gateway itself) is a connect error and nothing reaches the address; a node
answering 3xx is never followed, by either; the fleet file's host names are resolved at start-up."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from inferlb.config.health import HealthConfig
from inferlb.config.netpolicy import Listener, NetworkPolicy
from inferlb.config.settings import FleetConfig, NodeConfig, TimeoutConfig, fleet_from_mapping
from inferlb.engine.upstream import Upstream
from inferlb.errors import ConfigError, UpstreamConnectError, UpstreamStatusError
from inferlb.fleet.netguard import GuardedResolver, check_fleet_names
from inferlb.health.probe import Prober
from inferlb.types import SystemClock
from tests.support import free_port


class MapResolver(AbstractResolver):
    """A DNS that answers from a table the test changes (what a rebinding attacker controls)."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        ip = self.table[host]
        return [ResolveResult(hostname=host, host=ip, port=port, family=socket.AF_INET, proto=0,
                              flags=socket.AI_NUMERICHOST)]

    async def close(self) -> None:
        return None


class Node:
    """A real HTTP server counting hits per path; ``/moved`` answers 302 to ``target``."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.target = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.hits[request.path] = self.hits.get(request.path, 0) + 1
        if request.path == "/moved":
            return web.Response(status=302, headers={"location": self.target})
        return web.Response(status=200, body=b'{"ok": true}', content_type="application/json")


@pytest.fixture
async def node() -> AsyncIterator[tuple[Node, int]]:
    n = Node()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", n.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield n, port
    finally:
        await runner.cleanup()


TIMEOUTS = TimeoutConfig(connect_s=1.0, first_token_s=2.0, idle_s=2.0, total_s=5.0)


async def test_the_data_path_client_refuses_a_name_resolving_to_a_refused_address(node: tuple[Node, int]) -> None:
    srv, port = node
    dns = MapResolver({"gpu.test": "127.0.0.1", "rebound.test": "127.0.0.1"})
    policy: tuple[NetworkPolicy, tuple[Listener, ...]] = (NetworkPolicy(), ())
    async with Upstream(guard=lambda: policy, resolver=dns) as up:
        resp = await up.open(f"http://gpu.test:{port}/ok", b"{}", headers={}, timeouts=TIMEOUTS, node="n")
        await resp.aclose()
        assert srv.hits == {"/ok": 1}
        # now the gateway listens on that port: a name resolving to loopback there is the gateway itself
        policy = (NetworkPolicy(), (Listener("0.0.0.0", port),))
        with pytest.raises(UpstreamConnectError, match="network policy"):
            await up.open(f"http://rebound.test:{port}/self", b"{}", headers={}, timeouts=TIMEOUTS, node="n")
        policy = (NetworkPolicy(deny=[ipaddress.ip_network("127.0.0.0/8")]), ())
        with pytest.raises(UpstreamConnectError, match=r"network_policy\.deny"):
            await up.open(f"http://rebound.test:{port}/denied", b"{}", headers={}, timeouts=TIMEOUTS, node="n")
    assert srv.hits == {"/ok": 1}     # nothing reached the refused addresses


async def test_the_guard_drops_refused_addresses_and_keeps_the_rest() -> None:
    class Two(MapResolver):
        async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                          ) -> list[ResolveResult]:
            return [ResolveResult(hostname=host, host=ip, port=port, family=socket.AF_INET, proto=0, flags=0)
                    for ip in ("169.254.169.254", "10.0.0.7")]

    guard = GuardedResolver(lambda: (NetworkPolicy(), ()), Two({}))
    got = await guard.resolve("mixed.test", 80)
    assert [r["host"] for r in got] == ["10.0.0.7"]


async def test_the_prober_refuses_a_rebound_name_and_records_a_failed_sample(node: tuple[Node, int]) -> None:
    srv, port = node
    dns = MapResolver({"meta.test": "127.0.0.1"})
    cfg = HealthConfig()
    nodes = [NodeConfig(name="a", url=f"http://meta.test:{port}", models=["m"])]
    prober = Prober(nodes, cfg, SystemClock(), guard=lambda: (NetworkPolicy(), (Listener("127.0.0.1", port),)),
                    resolver=dns)
    try:
        samples = await prober.collect()
    finally:
        await prober.close()
    assert [s.ok for s in samples] == [False]
    assert "network policy" in (samples[0].error or "")
    assert srv.hits == {}


async def test_a_3xx_from_a_node_is_not_followed(node: tuple[Node, int]) -> None:
    srv, port = node
    srv.target = f"http://127.0.0.1:{port}/stolen"
    async with Upstream() as up:
        with pytest.raises(UpstreamStatusError) as ei:
            await up.open(f"http://127.0.0.1:{port}/moved", b"{}", headers={}, timeouts=TIMEOUTS, node="n")
    assert ei.value.status == 302
    nodes = [NodeConfig(name="a", url=f"http://127.0.0.1:{port}", models=["m"])]
    cfg = HealthConfig.model_validate({"nodes": {"a": {"probe_path": "/moved"}}})
    prober = Prober(nodes, cfg, SystemClock())
    try:
        samples = await prober.collect()
    finally:
        await prober.close()
    assert [(s.ok, s.status) for s in samples] == [(False, 302)]
    assert srv.hits == {"/moved": 2}      # the redirect target was never fetched


async def test_the_fleet_files_host_names_are_resolved_at_start_up() -> None:
    table = {"gpu.test": "10.0.0.7", "meta.test": "169.254.169.254"}

    async def dns(host: str, port: int, **_: object) -> list[tuple[int, int, int, str, tuple[str, int]]]:
        return [(2, 1, 6, "", (table[host], port))]

    def fleet(*urls: str) -> FleetConfig:
        return fleet_from_mapping({"models": [{"name": "m"}],
                                   "nodes": [{"name": f"n{i}", "url": u, "models": ["m"]} for i, u in enumerate(urls)]})

    ok = fleet("http://gpu.test:8000", "http://10.0.0.8:8000")
    await check_fleet_names(ok, resolve=dns)
    bad = fleet("http://gpu.test:8000", "http://meta.test/")
    with pytest.raises(ConfigError) as ei:
        await check_fleet_names(bad, resolve=dns, source="fleet.yaml")
    assert ei.value.path == "nodes[1].url" and "169.254.169.254" in ei.value.message

    never = asyncio.Event()

    async def hung(host: str, port: int, **_: object) -> list[object]:
        await never.wait()
        return []

    # a name that does not resolve within the bound is let through (each connection checks it again)
    await check_fleet_names(bad, resolve=hung, timeout_s=0)
