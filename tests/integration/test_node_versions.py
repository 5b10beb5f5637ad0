"""Live node changes next to model versions that list their nodes by name (api/nodes.py,
live/fleet_admin.py): adding a node that no version of its model takes in answers a warning
(in ``warnings``, in the log, and printed by ``inferlb fleet add``), since routing then gives it
none of that model's traffic; removing a node a version names is a 409 that names the key
(``models[m].versions[v2].nodes``), forced or not, and ``inferlb fleet remove`` prints it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferlb.cli.main import main
from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, running_gateway, settings_for


def fleet(urls: dict[str, str]) -> Any:
    return fleet_from_mapping({
        "models": [{"name": "m", "versions": [{"name": "v1", "weight": 90, "nodes": ["n0"]},
                                              {"name": "v2", "weight": 10, "nodes": ["n1"]}]},
                   {"name": "plain"}],
        "nodes": [{"name": n, "url": urls[n], "models": ["m", "plain"]} for n in ("n0", "n1")],
        "health": {"interval_s": 3600},
    })


async def test_a_node_no_version_lists_is_warned_and_a_named_one_cannot_be_removed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    async with SimFleet(fast_specs(4)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        settings = settings_for(tmp_path, fleet(urls), overrides_poll_s=3600)
        async with running_gateway(settings) as (base, _app), httpx.AsyncClient(base_url=base, timeout=30) as http:
            with caplog.at_level(logging.WARNING, "inferlb.live"):
                r = await http.post("/admin/nodes", json={"name": "n2", "url": urls["n2"], "models": ["m", "plain"]})
            assert r.status_code == 200, r.text
            warnings = r.json()["warnings"]
            assert len(warnings) == 1, warnings
            assert "'m'" in warnings[0] and "models[m].versions[v1].nodes lists n0" in warnings[0]
            assert "no traffic for 'm'" in warnings[0] and "plain" not in warnings[0]
            assert any("n2" in rec.getMessage() and "no traffic" in rec.getMessage() for rec in caplog.records)

            r = await http.post("/admin/nodes", json={"name": "n3", "url": urls["n3"], "models": ["plain"]})
            assert r.status_code == 200 and r.json()["warnings"] == [], r.text

            for force in ("false", "true"):
                r = await http.delete("/admin/nodes/n1", params={"force": force})
                assert r.status_code == 409, r.text
                err = r.json()["error"]
                assert err["code"] == "node_in_version" and err["param"] == "models[m].versions[v2].nodes"
                assert "models[m].versions[v2].nodes" in err["message"]

            # The CLI says the same (the HTTP call blocks: off the loop the gateway runs on).
            capsys.readouterr()
            await http.delete("/admin/nodes/n3", params={"force": "true"})
            rc = await asyncio.to_thread(main, ["fleet", "add", "n3", "--node-url", urls["n3"], "--models", "m",
                                                "--url", base])
            out = capsys.readouterr()
            assert rc == 0 and "inferlb: warning: node 'n3' serves model 'm'" in out.err, out
            rc = await asyncio.to_thread(main, ["fleet", "remove", "n0", "--force", "--url", base])
            out = capsys.readouterr()
            assert rc == 1 and "models[m].versions[v1].nodes" in out.err, out
