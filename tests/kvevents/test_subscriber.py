"""The subscriber over real ZeroMQ sockets, against the emulator's publisher (inferlb/simulator/
kv_publisher.py): an emulated node's prefix cache reaches the gateway's index, keyed so that the
gateway's own chain of a request's prompt finds it; a lost message is replayed; a publisher
without a buffer leaves the node stale. Waits are on events with a bound, never on time passing."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp

from inferlb.api.validation import validate_chat
from inferlb.config.settings import fleet_from_mapping
from inferlb.kvevents.service import KVEventsService
from inferlb.kvevents.subscriber import Subscriptions
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.kv_publisher import KVPublisher
from inferlb.simulator.prefix_cache import PrefixCache
from inferlb.simulator.spec import NodeSpec
from inferlb.types import SystemClock

SYSTEM = "You are the support assistant of a bicycle shop; answer briefly. " * 12


def _service(endpoints: dict[str, tuple[str, str | None]]) -> KVEventsService:
    nodes = [{"name": n, "url": f"http://127.0.0.1:{9000 + i}", "models": ["m"],
              "kv_events": {"endpoint": ep, **({"replay_endpoint": rp} if rp else {})}}
             for i, (n, (ep, rp)) in enumerate(endpoints.items())]
    cfg = fleet_from_mapping({"models": [{"name": "m", "kv_events": {"tokenizer": "emulator"}}], "nodes": nodes})
    return KVEventsService(cfg, clock=SystemClock())


class _Watch:
    """Sets an event each time the service applied a batch or closed a gap."""

    def __init__(self, s: KVEventsService) -> None:
        self.changed = asyncio.Event()
        apply, close = s.apply, s.close_gap

        def applied(*a: Any) -> Any:
            out = apply(*a)
            self.changed.set()
            return out

        def closed(*a: Any) -> Any:
            out = close(*a)
            self.changed.set()
            return out

        s.apply = applied  # type: ignore[method-assign,assignment]
        s.close_gap = closed  # type: ignore[method-assign,assignment]

    async def until(self, cond: Any, poke: Any = None, tries: int = 50) -> None:
        for _ in range(tries):
            if cond():
                return
            if poke is not None:
                await poke()
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.2)
        assert cond()


async def test_an_emulated_nodes_cache_reaches_the_index_under_the_gateways_own_keys() -> None:
    spec = NodeSpec(name="e", models=["m"], base_ttft_s=0.001, tpot_s=0.0001, prefix_cache=True,
                    prefix_cache_tokens=8192, kv_events_port=0)
    async with SimFleet([spec]) as sim, aiohttp.ClientSession() as http:
        pub = sim.nodes["e"].kv_publisher
        assert pub is not None and pub.running
        s = _service({"e": (pub.endpoint, pub.replay_endpoint)})
        watch = _Watch(s)
        subs = Subscriptions(s)
        await subs.reconcile(["e"], [])
        body: dict[str, Any] = {"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": SYSTEM},
                                                            {"role": "user", "content": "Do you fix tyres?"}]}
        text = validate_chat(body, want_text=True).prompt_text       # the gateway's join of the prompt
        assert text is not None
        turns = iter(range(1000))

        async def send() -> None:     # until the SUB has joined: what it missed comes from the replay
            b = {**body, "messages": [*body["messages"], {"role": "user", "content": f"turn {next(turns)} " * 30}]}
            async with http.post(sim.url("e") + "/v1/chat/completions", json=b) as r:
                assert r.status == 200

        async with http.post(sim.url("e") + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
        try:
            full = len(text) // 64
            await watch.until(lambda: (s.route_inputs("m", text, ["e"])[0] or (("e", 0),))[0][1] == full, send)
            hits, blocks, why = s.route_inputs("m", text, ["e"])
            assert why is None and blocks == full and dict(hits or ()) == {"e": full}
            assert s.index.nodes["e"].orphans == 0
        finally:
            await subs.close()


async def test_lost_messages_are_replayed_and_without_a_buffer_the_node_goes_stale() -> None:
    pub = KVPublisher()
    await pub.start()
    cache = PrefixCache(1024, sink=pub.sink)
    s = _service({"p": (pub.endpoint, pub.replay_endpoint)})
    watch = _Watch(s)
    subs = Subscriptions(s)
    await subs.reconcile(["p"], [])
    try:
        n = iter(range(1000))

        async def publish() -> None:
            cache.lookup(f"warm-up {next(n)} " * 20)
            await asyncio.sleep(0)        # one loop turn: the pending events go out as one batch

        await watch.until(lambda: s.batches.get("p", 0) > 0, publish)
        replayed = s.gaps.get(("p", "replayed"), 0)     # the SUB may have joined late: a replay already
        text = SYSTEM + "\nfirst question"
        pub.drop_next(2)                  # the next two batches are lost on the wire (kept for replay)
        cache.lookup(text)
        await asyncio.sleep(0)
        cache.lookup(text + "\nsecond question, which stores a block more" * 2)
        await asyncio.sleep(0)
        cache.lookup("and a third prompt, sent normally " * 3)
        await asyncio.sleep(0)
        await watch.until(lambda: s.gaps.get(("p", "replayed"), 0) == replayed + 1)
        assert dict(s.route_inputs("m", text, ["p"])[0] or ()) == {"p": len(text) // 64}
        pub.replay_enabled = False
        pub.drop_next(1)
        cache.lookup("a prompt whose batch is lost for good " * 3)
        await asyncio.sleep(0)
        cache.lookup("one more prompt, sent " * 5)
        await asyncio.sleep(0)
        await watch.until(lambda: s.gaps.get(("p", "lost"), 0) >= 1)
        assert s.route_inputs("m", text, ["p"])[2] == "p: gap" and s.index.blocks("p") < 40
    finally:
        await subs.close()
        await pub.stop()
