"""A saved ``GET /audit/requests`` page replays as a trace; what cannot be a trace is an error, never
an empty plan."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from inferlb.bench.loadgen.trace import TraceInfo, load_trace, parse_trace
from inferlb.config.admission import AdmissionSettings
from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

ADMIN = "admin-" + "a" * 32


async def test_a_page_fetched_from_a_running_gateway_replays(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(2)) as sim:
        fleet = fleet_for({n: node.url for n, node in sim.nodes.items()})
        settings = settings_for(tmp_path, fleet, admission=AdmissionSettings(auth=False, admin_key=ADMIN,
                                                                              redis_url=None))
        async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base) as http:
            for i in range(5):
                r = await http.post("/v1/chat/completions", json={
                    "model": "m", "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 4,
                    "stream": i % 2 == 0})
                assert r.status_code == 200, r.text
            page: dict[str, object] = {}
            for _ in range(1000):   # hang guard: the batched writer lands the rows soon after the answers
                await app.state.store.writer.flush_once(force=True)
                page = (await http.get("/audit/requests", params={"limit": 50},
                                       headers={"authorization": f"Bearer {ADMIN}"})).json()
                if len(page.get("data", [])) == 5:  # type: ignore[arg-type]
                    break
    saved = tmp_path / "page.json"
    saved.write_text(json.dumps(page))
    info = TraceInfo()
    reqs = load_trace(saved, info=info)
    assert len(reqs) == 5 and info.rows == 5 and info.skipped == {}
    assert reqs[0].t == 0.0 and all(r.model == "m" for r in reqs)
    assert sorted(r.stream for r in reqs) == [False, False, True, True, True]


@pytest.mark.parametrize(("text", "says"), [
    ('{"items": [{"t": 0, "prompt_tokens": 1, "output_tokens": 1}]}', "without 'data'"),
    ('{"data": {"t": 0}}', "'data' is a JSON dict"),
    ('{"data": [1, 2]}', "row 0: a JSON int"),
    ('"a string"', "a JSON str"),
    ("[1]", "row 0: a JSON int"),
    ('{"t": 0, "prompt_tokens": 1, "output_tokens": 1}\n[1]\n', "line 2: a JSON list"),
    ('{"data": []}', "no request to replay: 0 row(s) read"),
    ('{"data": [{"received_at": 1, "status": "rejected"}]}',
     "no request to replay: 1 row(s) read (no token counts: 1)"),
    ("", "no request to replay"),
])
def test_what_cannot_be_a_trace_is_an_error_not_an_empty_plan(text: str, says: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_trace(text, suffix=".json")
    assert says in str(err.value)
