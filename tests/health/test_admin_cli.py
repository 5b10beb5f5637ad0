"""What operators see: ``GET /admin/fleet`` (state, since, why, last samples, events) and
``inferlb fleet --url`` (the same as a table) against a running gateway on loopback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from inferlb.cli.main import main
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec
from tests.health.chaos_support import chaos_stack, node_events
from tests.support import free_port


async def _loading(sim: SimFleet) -> None:
    await sim.nodes["n1"].set_faults(FaultSpec(loading=True))


async def test_admin_fleet_shows_state_since_why_samples_and_events(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    async with chaos_stack(tmp_path, before_start=_loading) as (sim, client, app):
        await node_events(app)                      # the monitor recorded the change
        doc = (await client.get("/admin/fleet")).json()
        nodes = {n["name"]: n for n in doc["nodes"]}
        n1 = nodes["n1"]
        assert n1["state"] == "loading" and not n1["healthy"] and "loading" in n1["why"]
        assert n1["since"] > 1e9 and n1["for_s"] >= 0
        assert n1["samples"]["probe"]["ok"] is False and n1["samples"]["probe"]["status"] == 503
        assert 0 <= n1["samples"]["probe"]["age_s"] < 5
        assert nodes["n0"]["state"] == "healthy" and nodes["n0"]["samples"]["probe"]["ok"] is True
        assert doc["health"]["engine"] == "spiff" and doc["health"]["rounds"] >= 1
        assert doc["panic_models"] == []
        assert [(e["node"], e["from"], e["to"]) for e in doc["events"]] == [("n1", "healthy", "loading")]
        only = (await client.get("/admin/fleet/events", params={"node": "n0"})).json()
        assert only == {"events": []}

        base = str(client.base_url)
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["fleet", "--url", base]) == 0
        out = capsys.readouterr().out
        assert "n1" in out and "loading" in out and "healthy" in out and "recent node events" in out
        assert await asyncio.to_thread(main, ["fleet", "--url", base, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["nodes"][1]["state"] == "loading"


def test_fleet_command_against_nothing_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "--url", f"http://127.0.0.1:{free_port()}"]) == 2
    assert "cannot reach the gateway" in capsys.readouterr().err
