"""Node keys over real HTTP (api/nodes.py, live/fleet_admin.py): a node added or patched live
names an environment variable (``api_key_env``); a literal ``api_key`` or an unset variable is a 400
with nothing applied; no key (the file's literal one or a resolved one) appears in ``/admin/fleet``,
the node events, the logs or the ``node_overrides`` table; a second replica that lacks the variable
applies the node and says so in its events and log."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.simulator.emulator import SimFleet
from inferlb.store.schema import NODE_OVERRIDES
from tests.support import fast_specs, running_gateway, settings_for

VAR = "INFERLB_TEST_NODE_KEYS_HTTP"
UNSET = "INFERLB_TEST_NOT_SET_ANYWHERE"
SECRET = "sk-resolved-node-key-9d2b"
LITERAL = "sk-file-literal-key-51aa"


async def test_keys_come_from_the_environment_and_are_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(VAR, SECRET)
    caplog.set_level("DEBUG")
    async with SimFleet(fast_specs(3)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        cfg = fleet_from_mapping({
            "models": [{"name": "m"}],
            "nodes": [{"name": "n0", "url": urls["n0"], "models": ["m"], "api_key": LITERAL},
                      {"name": "n1", "url": urls["n1"], "models": ["m"]}],
        })
        a = settings_for(tmp_path, cfg, overrides_poll_s=3600, journal_dir=tmp_path / "ja")
        b = settings_for(tmp_path, cfg, overrides_poll_s=3600, journal_dir=tmp_path / "jb")
        async with running_gateway(a) as (base, app), httpx.AsyncClient(base_url=base, timeout=30) as http:
            live = app.state.live
            before = (live.revision, app.state.gateway.snapshot)
            new = {"name": "n2", "url": urls["n2"], "models": ["m"]}
            for method, path, body, code in [
                ("post", "/admin/nodes", {**new, "api_key": SECRET}, "literal_api_key"),
                ("post", "/admin/nodes", {**new, "api_key_env": UNSET}, "api_key_env_missing"),
                ("patch", "/admin/nodes/n1", {"api_key": SECRET}, "literal_api_key"),
                ("patch", "/admin/nodes/n1", {"api_key_env": UNSET}, "api_key_env_missing"),
            ]:
                r = await http.request(method, path, json=body)
                assert r.status_code == 400, r.text
                err = r.json()["error"]
                assert err["code"] == code and SECRET not in r.text, err
                assert "api_key_env" in err["message"], err
            assert (live.revision, app.state.gateway.snapshot) == before     # nothing applied
            assert UNSET in err["message"]

            r = await http.post("/admin/nodes", json={**new, "api_key_env": VAR})
            assert r.status_code == 200, r.text
            r = await http.patch("/admin/nodes/n1", json={"api_key_env": VAR})
            assert r.status_code == 200, r.text
            f: Fleet = app.state.gateway.rt.fleet
            assert f.nodes["n2"].cfg.credential() == SECRET and f.nodes["n1"].cfg.credential() == SECRET
            assert f.nodes["n0"].cfg.credential() == LITERAL                  # the file keeps its literal key
            sent = {t.node: t.api_key for t in app.state.monitor.prober.targets if t.source == "probe"}
            assert sent == {"n0": LITERAL, "n1": SECRET, "n2": SECRET}       # what the probes send

            shown = (await http.get("/admin/fleet")).text + \
                (await http.get("/admin/fleet/events", params={"limit": 500})).text
            assert VAR in shown                                               # the variable's name is fine
            with app.state.store.engine.connect() as conn:
                table = repr(conn.execute(select(NODE_OVERRIDES)).all())
            assert VAR in table

            # A second replica on the same database whose environment lacks the variable.
            monkeypatch.delenv(VAR)
            async with running_gateway(b) as (base_b, app_b), httpx.AsyncClient(base_url=base_b, timeout=30) as hb:
                fb: Fleet = app_b.state.gateway.rt.fleet
                assert set(fb.nodes) == {"n0", "n1", "n2"} and fb.nodes["n2"].cfg.credential() is None
                events = (await hb.get("/admin/fleet/events", params={"limit": 500})).json()["events"]
                missing = [e for e in events if "credential missing" in e["reason"]]
                assert {e["node"] for e in missing} == {"n1", "n2"}, events
                assert all(e["evidence"]["api_key_env"] == VAR for e in missing)
                shown += (await hb.get("/admin/fleet")).text + str(events)
            assert "credential missing" in caplog.text and VAR in caplog.text
    for where, text in [("admin API", shown), ("node_overrides", table), ("logs", caplog.text)]:
        assert SECRET not in text and LITERAL not in text, where
