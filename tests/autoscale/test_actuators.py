"""Actuators over real HTTP: kubernetes (the real ``kubernetes`` client against a local server
answering with the API's Scale / Status bodies), webhook (a local receiver), local (emulated nodes
with a real cold start joining a real Fleet); min never violated, failures are results."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from inferlb.autoscale.actuator_dryrun import DryRunActuator
from inferlb.autoscale.actuator_local import LocalActuator
from inferlb.autoscale.actuator_webhook import WebhookActuator
from inferlb.autoscale.actuators import ActuatorContext, build_actuator
from inferlb.autoscale.fleet_port import AdminFleetPort, LocalNodeAdmin
from inferlb.autoscale.planner import Plan, PoolDecision
from inferlb.config.autoscale import AutoscaleConfig
from inferlb.config.settings import fleet_from_mapping
from inferlb.errors import PluginError
from inferlb.fleet.state import Fleet
from inferlb.types import ManualClock

FIX = Path(__file__).parent / "fixtures" / "k8s"


def plan_of(*pools: tuple[str, str, int, int]) -> Plan:
    return Plan(0.0, tuple(PoolDecision(m, g, cur, want, want, 0.0, 100.0, 1.0, "test")
                           for m, g, cur, want in pools), 0.0)


async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


# -- kubernetes -------------------------------------------------------------------------------------


class FakeApiServer:
    """Answers the scale subresource like the API server: GET / merge-PATCH, 404 / 409 / 500."""

    def __init__(self) -> None:
        self.objects = {("deployments", "llm-l4"): json.loads((FIX / "deployment_scale.json").read_text()),
                        ("statefulsets", "llm-h100"): json.loads((FIX / "statefulset_scale.json").read_text())}
        self.fail_next: list[tuple[int, str]] = []
        self.patches: list[tuple[str, str, str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        path = "/apis/apps/v1/namespaces/{ns}/{kind}/{name}/scale"
        app.router.add_get(path, self.handle)
        app.router.add_patch(path, self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        kind, name = request.match_info["kind"], request.match_info["name"]
        if self.fail_next:
            status, fixture = self.fail_next.pop(0)
            return web.Response(status=status, text=(FIX / fixture).read_text() if fixture else "internal error",
                                content_type="application/json")
        obj = self.objects.get((kind, name))
        if obj is None:
            return web.Response(status=404, text=(FIX / "status_not_found.json").read_text(),
                                content_type="application/json")
        if request.method == "PATCH":
            body = await request.json()
            self.patches.append((kind, name, request.content_type, body))
            obj = copy.deepcopy(obj)
            obj["spec"]["replicas"] = body["spec"]["replicas"]
            obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
            self.objects[(kind, name)] = obj
        return web.json_response(obj)


def k8s_cfg(**over: Any) -> AutoscaleConfig:
    return AutoscaleConfig.model_validate({
        "pools": [{"model": "llm", "gpu": "l4", "min": 1, "max": 6, "workload": "deployment/llm-l4",
                   "namespace": "inference"},
                  {"model": "llm", "gpu": "h100", "min": 0, "max": 2, "workload": "statefulset/llm-h100",
                   "namespace": "inference"}],
        "actuator": {"kind": "kubernetes", "timeout_s": 5}, **over})


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[FakeApiServer, str]]:
    fake = FakeApiServer()
    async for url in serve(fake.app()):
        yield fake, url


def k8s_actuator(url: str, cfg: AutoscaleConfig) -> Any:
    kubernetes = pytest.importorskip("kubernetes")
    from inferlb.autoscale.actuator_kubernetes import KubernetesActuator

    conf = kubernetes.client.Configuration(host=url)
    return KubernetesActuator(cfg, kubernetes.client.ApiClient(conf))


async def test_kubernetes_reads_and_patches_the_scale_subresource(apiserver: tuple[FakeApiServer, str]) -> None:
    fake, url = apiserver
    act = k8s_actuator(url, k8s_cfg())
    try:
        assert await act.current() == {("llm", "l4"): 2, ("llm", "h100"): 1}
        results = await act.apply(plan_of(("llm", "l4", 2, 5), ("llm", "h100", 1, 0)))
    finally:
        await act.close()
    assert [(r.model, r.gpu, r.before, r.after, r.ok, r.status) for r in results] == \
        [("llm", "l4", 2, 5, True, "applied"), ("llm", "h100", 1, 0, True, "applied")]
    assert [(k, n, ct, b) for k, n, ct, b in fake.patches] == [
        ("deployments", "llm-l4", "application/merge-patch+json", {"spec": {"replicas": 5}}),
        ("statefulsets", "llm-h100", "application/merge-patch+json", {"spec": {"replicas": 0}})]


async def test_kubernetes_api_errors_are_results_and_min_is_never_asked_below(
        apiserver: tuple[FakeApiServer, str]) -> None:
    fake, url = apiserver
    act = k8s_actuator(url, k8s_cfg())
    try:
        fake.fail_next = [(409, "status_conflict.json")]
        results = await act.apply(plan_of(("llm", "l4", 2, 0), ("llm", "h100", 1, 2)))
        # l4's min is 1: asked 1, not 0; the API answered 409 → a failed result, h100 still applied
        assert [(r.requested, r.ok, r.status) for r in results] == [(1, False, "failed"), (2, True, "applied")]
        assert results[0].error is not None and "409" in results[0].error and "Conflict" in results[0].error
        assert await act.current() == {("llm", "l4"): 2, ("llm", "h100"): 2}   # nothing half-applied on l4
        retry = await act.apply(plan_of(("llm", "l4", 2, 1)))                    # the next round retries
        assert [(r.after, r.ok) for r in retry] == [(1, True)]
        fake.fail_next = [(500, "")]
        await act.current()
        assert act.read_errors and "500" in next(iter(act.read_errors.values()))
    finally:
        await act.close()


async def test_kubernetes_unknown_workload_is_a_failed_result(apiserver: tuple[FakeApiServer, str]) -> None:
    _, url = apiserver
    cfg = k8s_cfg(pools=[{"model": "llm", "gpu": "l4", "workload": "deployment/missing", "namespace": "inference"}])
    act = k8s_actuator(url, cfg)
    try:
        (r,) = await act.apply(plan_of(("llm", "l4", 0, 2)))
    finally:
        await act.close()
    assert not r.ok and r.error is not None and "404" in r.error and "NotFound" in r.error


# -- webhook ----------------------------------------------------------------------------------------


async def test_webhook_posts_the_plan_and_a_refusal_fails_every_change() -> None:
    got: list[dict[str, Any]] = []
    answers = [web.json_response({"replicas": {"llm/l4": 3}}), web.Response(status=503, text="busy")]

    async def receive(request: web.Request) -> web.Response:
        got.append(await request.json())
        return answers.pop(0)

    app = web.Application()
    app.router.add_post("/scale", receive)
    async for url in serve(app):
        cfg = AutoscaleConfig.model_validate({"pools": [{"model": "llm", "gpu": "l4", "min": 1, "max": 5}],
                                              "actuator": {"kind": "webhook", "url": url + "/scale"}})
        act = WebhookActuator(cfg)
        try:
            assert await act.current() == {("llm", "l4"): 1}       # nothing acknowledged yet: min
            (r,) = await act.apply(plan_of(("llm", "l4", 1, 3)))
            assert r.ok and r.after == 3 and await act.current() == {("llm", "l4"): 3}
            (bad,) = await act.apply(plan_of(("llm", "l4", 3, 5)))
            assert not bad.ok and bad.error == "webhook answered 503: busy"
            assert await act.current() == {("llm", "l4"): 3}
        finally:
            await act.close()
    assert got[0]["kind"] == "inferlb.scaling_plan" and got[0]["changes"] == [
        {"model": "llm", "gpu": "l4", "from": 1, "to": 3}]
    assert got[0]["plan"]["pools"][0]["desired"] == 3
    unreachable = WebhookActuator(AutoscaleConfig.model_validate({
        "pools": [{"model": "llm", "gpu": "l4"}], "actuator": {"kind": "webhook", "url": url + "/scale"}}))
    (r,) = await unreachable.apply(plan_of(("llm", "l4", 0, 1)))
    await unreachable.close()
    assert not r.ok and r.error is not None and r.error.startswith("webhook unreachable")


async def test_webhook_results_never_show_the_credentials_in_its_url() -> None:
    """A webhook URL with a password and a query token: the receiver gets both (basic auth, the
    query), while every result (ok, refused, unreachable), which goes to the scaling events and
    the autoscale report, shows the URL redacted."""
    password, token = "CANARYPW-hook-3c9a", "CANARY-token-77e0"
    got: list[tuple[str | None, str]] = []
    answers = [web.json_response({"replicas": {"llm/l4": 3}}), web.Response(status=503, text="busy")]

    async def receive(request: web.Request) -> web.Response:
        got.append((request.headers.get("authorization"), request.query_string))
        return answers.pop(0)

    app = web.Application()
    app.router.add_post("/scale", receive)
    results = []
    async for url in serve(app):
        secret_url = url.replace("http://", f"http://hook:{password}@") + f"/scale?token={token}"
        cfg = AutoscaleConfig.model_validate({"pools": [{"model": "llm", "gpu": "l4", "min": 1, "max": 5}],
                                              "actuator": {"kind": "webhook", "url": secret_url}})
        act = WebhookActuator(cfg)
        try:
            results += await act.apply(plan_of(("llm", "l4", 1, 3)))
            results += await act.apply(plan_of(("llm", "l4", 3, 5)))
        finally:
            await act.close()
    gone = WebhookActuator(cfg)   # the receiver has stopped: connection refused
    results += await gone.apply(plan_of(("llm", "l4", 3, 4)))
    await gone.close()
    assert [r.ok for r in results] == [True, False, False]
    assert len(got) == 2 and got[0][0] is not None and got[0][0].startswith("Basic ") and got[0][1] == f"token={token}"
    shown = json.dumps([r.to_json() for r in results])
    assert password not in shown and token not in shown, shown
    assert "/scale?token=redacted" in shown


# -- local ------------------------------------------------------------------------------------------


class Launcher:
    """Emulated nodes from the simulator with a cold start (``startup_s``)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.nodes: dict[str, Any] = {}
        self.fail_after = fail_after

    async def start(self, name: str, model: str, gpu: str, cold_start_s: float) -> Any:
        from inferlb.cli.autoscale import SimLauncher

        if self.fail_after is not None and len(self.nodes) >= self.fail_after:
            raise RuntimeError("no GPU left on this host")
        inner = SimLauncher()
        launched = await inner.start(name, model, gpu, cold_start_s)
        self.nodes[name] = inner
        return launched

    async def stop(self, name: str) -> None:
        inner = self.nodes.pop(name, None)
        if inner is not None:
            await inner.stop(name)


def local_setup(fail_after: int | None = None) -> tuple[LocalActuator, Fleet, Launcher, ManualClock]:
    clock = ManualClock()
    cfg = fleet_from_mapping({"models": [{"name": "m"}],
                              "nodes": [{"name": "static-0", "url": "http://127.0.0.1:9", "models": ["m"],
                                         "labels": {"gpu": "l4"}}]})
    fleet = Fleet(cfg, clock)
    auto = AutoscaleConfig.model_validate({"pools": [{"model": "m", "gpu": "l4", "min": 1, "max": 4,
                                                      "cold_start_s": 30}],
                                           "actuator": {"kind": "local", "drain_timeout_s": 0}})
    launcher = Launcher(fail_after)
    port = AdminFleetPort(fleet, LocalNodeAdmin(fleet, cfg), clock)   # the node-admin path, no database
    return LocalActuator(auto, port, launcher, clock=clock), fleet, launcher, clock


async def test_local_starts_nodes_that_join_loading_and_drains_before_removing() -> None:
    import aiohttp

    act, fleet, launcher, _ = local_setup()
    try:
        assert await act.current() == {("m", "l4"): 1}
        (r,) = await act.apply(plan_of(("m", "l4", 1, 3)))
        assert r.ok and r.after == 3 and len(launcher.nodes) == 2
        new = [n for n in fleet.nodes if n.startswith("as-")]
        assert all(fleet.nodes[n].state == "loading" for n in new)      # cold start: no traffic yet
        assert all(not v.healthy for v in fleet.views().by_model["m"] if v.name in new)
        async with aiohttp.ClientSession() as s, s.get(fleet.nodes[new[0]].cfg.url + "/health") as resp:
            assert resp.status == 503                                      # the node really is cold
        # a request in flight on the newest node: scale-down drains it, never removes it under load
        fleet.acquire(new[-1], 10)
        (down,) = await act.apply(plan_of(("m", "l4", 3, 2)))
        assert new[-1] in fleet.nodes and fleet.nodes[new[-1]].state == "draining"
        assert fleet.nodes[new[-1]].held and "still draining" in down.detail           # an admin drain
        assert not any(v.healthy for v in fleet.views().by_model["m"] if v.name == new[-1])
        assert await act.current() == {("m", "l4"): 2}
        fleet.release(new[-1], 10)
        await act.apply(plan_of())                                       # the next round reaps it
        assert new[-1] not in fleet.nodes and new[-1] not in launcher.nodes
        events = [(e.node, e.to_state) for e in fleet.take_events()]
        assert (new[-1], "loading") in events and (new[-1], "draining") in events
        # min 1 and the configured node: asking 0 leaves static-0, and says why
        (floor,) = await act.apply(plan_of(("m", "l4", 2, 0)))
        assert floor.requested == 1 and floor.after == 1 and "static-0" in fleet.nodes and floor.ok
    finally:
        await act.close()
    assert launcher.nodes == {}


async def test_local_launch_failure_is_a_partial_result() -> None:
    act, fleet, launcher, _ = local_setup(fail_after=1)
    try:
        (r,) = await act.apply(plan_of(("m", "l4", 1, 4)))
    finally:
        await act.close()
    assert not r.ok and r.status == "partial" and r.after == 2
    assert r.error is not None and "no GPU left" in r.error


# -- the kinds: one table, a factory of your own by module:attr --------------------------------------


class OwnActuator(DryRunActuator):
    """An actuator of the operator's own: what its factory was handed is kept to be looked at."""

    name = "own"

    def __init__(self, cfg: AutoscaleConfig, ctx: ActuatorContext) -> None:
        super().__init__(cfg)
        self.ctx = ctx


def test_the_builtin_kinds_build_as_before() -> None:
    clock = ManualClock()
    assert isinstance(build_actuator(AutoscaleConfig(), clock=clock), DryRunActuator)
    hook = AutoscaleConfig.model_validate({"actuator": {"kind": "webhook", "url": "http://127.0.0.1:1/scale"}})
    assert isinstance(build_actuator(hook, clock=clock), WebhookActuator)
    local = AutoscaleConfig.model_validate({"actuator": {"kind": "local"}})
    with pytest.raises(ValueError, match="needs a node launcher"):
        build_actuator(local, clock=clock)


def test_an_actuator_of_ones_own_by_module_attr() -> None:
    cfg = AutoscaleConfig.model_validate({"pools": [{"model": "m", "gpu": "l4", "min": 1}],
                                          "actuator": {"kind": f"{__name__}:OwnActuator"}})
    clock = ManualClock()
    act = build_actuator(cfg, clock=clock, gpu_label="accel", gpu_prices={"l4": 0.8})
    assert isinstance(act, OwnActuator)
    assert act.ctx.clock is clock and act.ctx.gpu_label == "accel" and act.ctx.gpu_prices == {"l4": 0.8}


def test_an_actuator_kind_that_does_not_resolve_fails_the_fleet_file() -> None:
    base = {"models": [{"name": "m"}], "nodes": [{"name": "n", "url": "http://127.0.0.1:1", "models": ["m"]}]}
    for kind, why in (("k8s", "unknown actuator 'k8s'"),
                      (f"{__name__}:Nope", f"cannot load actuator '{__name__}:Nope'")):
        with pytest.raises(PluginError) as info:
            fleet_from_mapping({**base, "autoscale": {"actuator": {"kind": kind}}}, source="fleet.yaml")
        err = info.value
        assert (err.source, err.path, err.point, err.name) == ("fleet.yaml", "autoscale.actuator.kind", "actuator",
                                                               kind)
        assert why in str(err)
        assert "(known: dry-run, kubernetes, local, webhook; or module:attr of your own)" in str(err)
