"""The output-length predictor live: trained from each finished request's completion tokens,
reported in /admin/fleet (inferlb/routing/length.py, inferlb/engine/gateway.py ``_learn``)."""

from __future__ import annotations

from pathlib import Path

import httpx

from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, fleet_for, running_gateway, settings_for


async def test_the_predictor_learns_from_completions_and_reports_its_calibration(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(1)) as sim:
        fleet = fleet_for({n: node.url for n, node in sim.nodes.items()})
        async with running_gateway(settings_for(tmp_path, fleet)) as (base, app), \
                httpx.AsyncClient(base_url=base) as http:
            before = (await http.get("/admin/fleet")).json()["output_length"]
            assert before["n"] == 0 and before["budget"] == "mean"
            for _ in range(30):
                r = await http.post("/v1/chat/completions",
                                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                          "max_tokens": 3})
                assert r.status_code == 200, r.text
            got = (await http.get("/admin/fleet")).json()["output_length"]
            # 30 scored; the first 20 estimates were the declared 3 (no data yet), the rest learned
            assert got["n"] == 30 and got["learned"] == 10 and got["keys"] == 3
            assert got["mae_p50"] == 0.0 and got["cover_p90"] == 1.0
            lengths = app.state.gateway.rt.lengths
            est = lengths.estimate("m", prompt_tokens=1, declared=None, default=8)
            assert est.level in ("band", "tenant", "model") and est.budget == 3   # not the default 8


async def test_disabled_it_is_not_there(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(1)) as sim:
        fleet = fleet_for({n: node.url for n, node in sim.nodes.items()}, profile="token-aware",
                          output_length={"enabled": False})
        async with running_gateway(settings_for(tmp_path, fleet)) as (base, _), \
                httpx.AsyncClient(base_url=base) as http:
            assert (await http.get("/admin/fleet")).json()["output_length"] is None
