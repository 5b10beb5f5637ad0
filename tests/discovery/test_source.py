"""One discovery source (discovery/source.py) driven turn by turn against recorded
EndpointSlice responses served over HTTP to the real ``kubernetes`` client, applied to a real
:class:`~inferlb.fleet.state.Fleet` through live/fleet_admin.py (the path an operator's node
takes): pods join as ``loading`` then slow start after good probes, a terminating pod drains and
goes once drained, ``410 Gone`` relists, and an API server that is away changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from inferlb.config.discovery import KubernetesDiscoveryConfig
from inferlb.config.settings import FleetConfig, fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.health.isolation import isolate, restore
from inferlb.live.fleet_admin import apply_fleet, merge_overrides, settle
from inferlb.store.overrides import NodeOverride
from inferlb.types import ManualClock
from tests.discovery.apiserver import FakeApiServer, Running, serve

Api = tuple[FakeApiServer, str, Running]

kubernetes = pytest.importorskip("kubernetes")

from inferlb.discovery.kubernetes import EndpointSliceClient  # noqa: E402
from inferlb.discovery.source import KubernetesDiscovery  # noqa: E402

A, B, C, D = (f"llm-6f7d8c9b5-{x * 5}" for x in "abcd")


def fleet_cfg() -> FleetConfig:
    return fleet_from_mapping({
        "models": [{"name": "llm"}, {"name": "other"}],
        "nodes": [{"name": "file-0", "url": "http://127.0.0.1:9", "models": ["other"]}],
        "health": {"slow_start": {"window_s": 30}},
        "discovery": [{"namespace": "inference", "service": "llm", "port": "http",
                       "node": {"models": ["llm"], "kind": "vllm", "capacity_tokens": 4096,
                                "labels": {"gpu": "l4"}, "price_per_hour": 0.7},
                       "backoff_s": 0.5, "max_backoff_s": 2}]})


class Harness:
    """The source plus what LiveConfig does with its rows: merge, apply_fleet, settle."""

    def __init__(self, url: str) -> None:
        self.clock = ManualClock()
        self.cfg = fleet_cfg()
        self.fleet = Fleet(self.cfg, self.clock)
        self.applied: list[list[str]] = []
        src_cfg: KubernetesDiscoveryConfig = self.cfg.discovery[0]
        client = EndpointSliceClient(src_cfg, kubernetes.client.ApiClient(kubernetes.client.Configuration(host=url)))
        self.source = KubernetesDiscovery(src_cfg, apply=self.apply, clock=self.clock, client=client,
                                          node_states=lambda: {n: st.state for n, st in self.fleet.nodes.items()})

    async def apply(self, label: str, rows: list[NodeOverride], evidence: Mapping[str, Any]) -> list[str]:
        changes = apply_fleet(self.fleet, merge_overrides(self.cfg, [], discovered=rows), evidence)
        self.applied.append(changes)
        return changes

    def probe_ok(self, *names: str) -> None:
        for _ in range(5):      # bounded: health rounds until the healthy threshold
            isolate(self.fleet, {"nodes": {n: {"probe": "ok"} for n in names}}, outliers=False)
            restore(self.fleet)

    def states(self) -> dict[str, str]:
        return {n: st.state for n, st in self.fleet.nodes.items() if n != "file-0"}


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    fake = FakeApiServer()
    async for url, running in serve(fake):
        yield fake, url, running


@pytest.fixture
async def h(api: Api) -> AsyncIterator[Harness]:
    harness = Harness(api[1])
    yield harness
    await harness.source.close()


async def test_pods_join_probed_then_slow_start_and_a_terminating_pod_drains_then_goes(
        api: Api, h: Harness) -> None:
    fake = api[0]
    assert await h.source.step() == 0.0                                  # the list
    assert fake.requests[0]["labelSelector"] == "kubernetes.io/service-name=llm"
    # ready pods join loading (no traffic until probed); the not-ready pod is not a node
    assert h.states() == {A: "loading", B: "loading"}
    a = h.fleet.nodes[A]
    assert a.cfg.url.startswith("http://10.244.1.17:8000") and a.cfg.capacity_tokens == 4096
    assert a.cfg.labels == {"gpu": "l4"} and a.cfg.kind == "vllm"
    assert not any(v.healthy for v in h.fleet.views() if v.name in (A, B))
    h.probe_ok(A, B)
    assert h.states() == {A: "healthy", B: "healthy"} and h.fleet.nodes[A].slow_start_at is not None
    view = next(v for v in h.fleet.views() if v.name == A)
    assert view.healthy and view.capacity_tokens < 4096                   # slow start: a small share first
    events = [e for e in h.fleet.take_events() if e.node == A]
    assert events[0].to_state == "loading" and events[0].evidence["trigger"] == "discovery"
    assert events[0].evidence["source"] == "kubernetes:inference/llm"

    fake.push("watch_join.jsonl")                                         # a third pod
    await h.source.step()
    assert fake.requests[-1]["watch"] == "true" and fake.requests[-1]["resourceVersion"] == "48211"
    assert h.states()[C] == "loading" and h.source.cache.resource_version == "48230"

    h.fleet.acquire(A, 100)                                              # a request runs on A
    fake.push("watch_terminating.jsonl")                                   # A terminates (scale-down)
    await h.source.step()
    assert h.states()[A] == "draining" and A not in {v.name for v in h.fleet.views() if v.healthy}
    assert h.source.cache.resource_version == "48247"                     # the bookmark moved it
    await h.source.reconcile()
    assert h.states()[A] == "draining"                                    # still a request in flight
    h.fleet.release(A, 100)
    settle(h.fleet)
    assert h.states()[A] == "drained"
    changes = await h.source.reconcile()                                  # drained → removed
    assert [(c.node, c.action) for c in changes] == [(A, "remove")]
    assert A not in h.fleet.nodes and set(h.states()) == {B, C}
    assert [e.to_state for e in h.fleet.take_events() if e.node == A][-2:] == ["draining", "removed"]
    fake.push("watch_deleted.jsonl")                                      # the slice goes: nothing left to do
    await h.source.step()
    assert set(h.states()) == {B, C} and h.source.events == 4


async def test_410_gone_lists_again_and_what_the_list_lacks_is_drained(api: Api,
                                                                        h: Harness) -> None:
    fake = api[0]
    await h.source.step()
    assert set(h.states()) == {A, B}
    fake.slices.pop("llm-q2w7z")                           # while the watch was away, B's slice went
    fake.resource_version = "48990"
    fake.push("watch_expired.jsonl")                       # the ERROR event: 410 Expired
    assert await h.source.step() == 0.0
    assert h.source.relists == 0 and set(h.states()) == {A, B}   # nothing changes on the error itself
    await h.source.step()                                  # the relist
    assert h.source.relists == 1 and h.source.lists == 2 and "watch" not in fake.requests[-1]
    assert h.source.cache.resource_version == "48990"
    assert h.states() == {A: "loading", B: "drained"}      # B had nothing in flight: drained at once
    await h.source.reconcile()
    assert h.states() == {A: "loading"}
    fake.push((410, "status_gone.json"))                   # a watch request refused with 410 itself
    await h.source.step()
    await h.source.step()
    assert h.source.relists == 2 and h.source.errors == 0


async def test_api_server_away_or_refusing_changes_nothing(api: Api, h: Harness) -> None:
    fake, _, running = api
    fake.fail_list = [(403, "status_forbidden.json")]
    assert await h.source.step() == 0.5                    # refused: nothing known yet, nothing applied
    assert not h.source.synced and h.applied == [] and h.states() == {}
    assert h.source.last_error is not None and "403" in h.source.last_error
    assert await h.source.reconcile() == []                # never drains what it has not seen
    await h.source.step()
    h.probe_ok(A, B)
    assert h.states() == {A: "healthy", B: "healthy"} and h.source.last_error is None
    fake.push((500, "status_forbidden.json"))
    waits = [await h.source.step()]
    await running.stop()                                   # the API server is down: refused connections
    waits += [await h.source.step() for _ in range(3)]
    assert waits == [0.5, 1.0, 2.0, 2.0]                   # backoff doubles up to max_backoff_s
    assert h.source.errors == 5 and h.states() == {A: "healthy", B: "healthy"}   # the last known set stays
    assert await h.source.reconcile() == []
