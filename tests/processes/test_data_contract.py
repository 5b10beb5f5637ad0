"""The keys validation checks against are the keys the running system writes.

``SERVICES[op].writes`` and ``REQUEST_START_DATA`` are declarations; these tests hold them to what
really lands in an instance's data: through a real gateway over HTTP (the gateway's own start data
and dispatch outcomes, the in-engine operations), and through the harness for the queue paths.
A key an operation starts writing without declaring it fails here, as does a declared key nothing
writes any more.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from inferlb.simulator.emulator import SimFleet
from inferlb.tasks import REQUEST_START_DATA, SERVICES
from tests.processes.harness import MAIN, run_scenario
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
_BY_VAR = {spec.result: spec for spec in SERVICES.values()}


def _collect(seen: dict[str, set[str]], data: dict[str, Any]) -> None:
    for var, value in data.items():
        if isinstance(value, dict):
            seen[var].update(value)


def _check_declared(seen: dict[str, set[str]]) -> None:
    for var, keys in seen.items():
        if var in REQUEST_START_DATA:
            declared = REQUEST_START_DATA[var]
            if declared is not None:
                assert keys == set(declared), (var, keys ^ set(declared))
            continue
        spec = _BY_VAR[var]
        assert keys <= set(spec.writes), (var, keys - set(spec.writes))


async def test_gateway_data_matches_the_declared_keys(tmp_path: Path) -> None:
    seen: dict[str, set[str]] = defaultdict(set)
    instances: list[Any] = []
    async with SimFleet(fast_specs(3)) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        async with running_gateway(settings_for(tmp_path, fleet_for(urls, profile="round-robin", seed=1))) \
                as (base, app), httpx.AsyncClient(base_url=base, timeout=10) as client:
            executor = app.state.gateway.process.executor
            start = executor.start

            def recording_start(data: dict[str, Any], scope: Any) -> Any:
                inst = start(data, scope)
                instances.append(inst)
                return inst

            executor.start = recording_start
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
            async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
                assert r.status_code == 200
                await r.aread()
            assert (await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})).status_code == 404
            await sim.stop_node("n0")   # round-robin: the next requests meet it, fail over, retry
            for _ in range(3):
                assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert len(instances) == 5   # the unknown model is answered by the API layer: no instance starts
    for inst in instances:
        _collect(seen, inst.data)
    # Every variable of the request path was seen, the retry loop's included.
    assert {"request", "evaluation", "admission", "routing", "outcome", "retry", "waited", "result"} <= set(seen)
    _check_declared(seen)


def test_queue_paths_match_the_declared_keys() -> None:
    seen: dict[str, set[str]] = defaultdict(set)
    for queue in ("grant", "expire"):
        res = run_scenario(MAIN, "compiled", [{"kind": "ok", "status": 200}] if queue == "grant" else [],
                           queue=queue)
        _collect(seen, res.data)
    seen.pop("request")   # the harness builds its own request; the gateway test checks the real one
    assert {"admission", "queued"} <= set(seen)
    _check_declared(seen)
