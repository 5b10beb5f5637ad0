"""Live node admin over real HTTP (api/nodes.py) in front of simulated nodes, under steady
load through the real OpenAI SDK: drain → drained, removal (drained, forced), add (probed, then
slow start), patch; every refusal in the OpenAI envelope with nothing applied; every change a node
event carrying the admin key's id; a second replica on the same database converges."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx

from inferlb.config.admission import AdmissionSettings
from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.live.fleet_admin import settle
from inferlb.simulator.emulator import SimFleet
from tests.integration.load import Load, steady_load
from tests.support import fast_specs, running_gateway, settings_for

ADMIN = "sk-admin-node-test"
H = {"authorization": f"Bearer {ADMIN}"}
KEY_ID = "admin:" + hashlib.sha256(ADMIN.encode()).hexdigest()[:12]


def fleet(urls: dict[str, str]) -> Any:
    return fleet_from_mapping({
        "models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8}, {"name": "solo"}],
        "nodes": [{"name": n, "url": u, "models": ["m"] + (["solo"] if n == "n0" else [])} for n, u in urls.items()],
        "routing": {"profile": "round-robin", "seed": 1},
        "timeouts": {"connect_s": 1.0, "first_token_s": 5.0, "idle_s": 5.0, "total_s": 20.0},
        "health": {"probe": {"healthy_threshold": 2}, "slow_start": {"window_s": 60}},
    })


async def until_idle(fleet: Fleet, name: str, load: Load) -> None:
    """Wait (bounded by requests, not time) until ``name`` has no request in flight."""
    for _ in range(200):
        if fleet.nodes[name].inflight_requests == 0:
            return
        await load.progress(1)
    raise AssertionError(f"{name} kept requests in flight")


async def test_drain_remove_add_patch_under_load_with_auth(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(4)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        file_urls = {n: u for n, u in urls.items() if n != "n3"}
        auth = AdmissionSettings(auth=True, admin_key=ADMIN, redis_url=None)
        settings = settings_for(tmp_path, fleet(file_urls), admission=auth, overrides_poll_s=3600)
        async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base, timeout=30) as http:
            f: Fleet = app.state.gateway.rt.fleet
            assert (await http.post("/admin/nodes/n1/drain")).status_code == 401
            key = (await http.post("/admin/keys", json={"tenant": "t"}, headers=H)).json()["key"]
            assert (await http.post("/admin/nodes/n1/drain", headers={"authorization": f"Bearer {key}"})
                    ).status_code == 403
            async with steady_load(base, api_key=key) as load:
                await load.progress(10)
                # drain: no new requests, in-flight ones finish, then drained
                r = await http.post("/admin/nodes/n1/drain", headers=H)
                assert r.status_code == 200, r.text
                assert r.json()["node_state"]["state"] in ("draining", "drained")
                served = f.nodes["n1"].requests_total
                await until_idle(f, "n1", load)
                settle(f)
                assert f.nodes["n1"].state == "drained"
                await load.progress(12)
                assert f.nodes["n1"].requests_total == served          # no new request went there
                r = await http.delete("/admin/nodes/n1", headers=H)
                assert r.status_code == 200 and r.json()["node_state"] is None, r.text

                # not drained: 409; forced: removed while requests run, they finish
                r = await http.delete("/admin/nodes/n2", headers=H)
                assert r.status_code == 409 and r.json()["error"]["code"] == "node_not_drained"
                r = await http.delete("/admin/nodes/n2", params={"force": "true"}, headers=H)
                assert r.status_code == 200, r.text
                if "n2" in f.nodes:
                    await until_idle(f, "n2", load)
                settle(f)
                assert "n2" not in f.nodes
                # the last node of a model cannot go, forced or not
                r = await http.delete("/admin/nodes/n0", params={"force": "true"}, headers=H)
                assert r.status_code == 409 and r.json()["error"]["code"] == "last_node_of_model"

                # add: loading until probed, then slow start, then traffic
                r = await http.post("/admin/nodes", headers=H, json={"name": "n3", "url": urls["n3"], "models": ["m"]})
                assert r.status_code == 200, r.text
                assert r.json()["node_state"]["state"] == "loading" and r.json()["node_state"]["source"] == "admin"
                assert f.nodes["n3"].state == "loading"
                for _ in range(5):       # health rounds, driven here instead of waiting for the timer
                    await app.state.monitor.run_once()
                    if f.nodes["n3"].state == "healthy":
                        break
                assert f.nodes["n3"].state == "healthy" and f.nodes["n3"].slow_start_at is not None
                await load.progress(30)
                assert f.nodes["n3"].requests_total > 0

                r = await http.patch("/admin/nodes/n3", headers=H, json={"weight": 2.5, "labels": {"zone": "b"}})
                assert r.status_code == 200 and f.nodes["n3"].cfg.weight == 2.5, r.text
                await load.progress(10)
            assert load.failed == 0, load.errors[:5]

            doc = (await http.get("/admin/fleet", headers=H)).json()
            assert {n["name"]: n["source"] for n in doc["nodes"]} == {"n0": "file", "n3": "admin"}
            events = (await http.get("/admin/fleet/events", params={"limit": 200}, headers=H)).json()["events"]
            admin_events = [e for e in events if e["evidence"].get("by") == "admin"]
            assert {(e["node"], e["to"]) for e in admin_events} >= {("n1", "draining"), ("n2", "draining"),
                                                                   ("n3", "loading")}
            assert all(e["evidence"]["key_id"] == KEY_ID for e in admin_events)
            assert {(e["node"], e["to"]) for e in events} >= {("n1", "drained"), ("n1", "removed"),
                                                             ("n2", "removed")}


async def test_bad_input_is_a_client_error_and_nothing_is_applied(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(2)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        settings = settings_for(tmp_path, fleet(urls), overrides_poll_s=3600)
        async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base, timeout=30) as http:
            live = app.state.live
            before = (live.revision, app.state.gateway.snapshot)
            cases: list[tuple[str, str, Any, int, str]] = [
                ("post", "/admin/nodes/nope/drain", None, 404, "node_not_found"),
                ("patch", "/admin/nodes/nope", {"weight": 2}, 404, "node_not_found"),
                ("delete", "/admin/nodes/nope", None, 404, "node_not_found"),
                ("post", "/admin/nodes", {"name": "n0", "url": "http://127.0.0.1:1", "models": ["m"]}, 400,
                 "duplicate_node"),
                ("post", "/admin/nodes", {"name": "x", "url": "ftp://x", "models": ["m"]}, 400, "invalid_node"),
                ("post", "/admin/nodes", {"name": "x", "url": "http://127.0.0.1:1", "models": ["nope"]}, 400,
                 "invalid_node"),
                ("post", "/admin/nodes", {"name": "x", "url": "http://127.0.0.1:1", "models": ["m"], "bogus": 1},
                 400, "invalid_node"),
                ("post", "/admin/nodes", [1, 2], 400, "invalid_value"),
                ("patch", "/admin/nodes/n1", {"url": "http://127.0.0.1:2"}, 400, "not_patchable"),
                ("patch", "/admin/nodes/n1", {"weight": -1}, 400, "invalid_value"),
                ("patch", "/admin/nodes/n1", {}, 400, "empty_patch"),
                ("delete", "/admin/nodes/n1", None, 409, "node_not_drained"),
            ]
            for method, path, body, status, code in cases:
                r = await http.request(method, path, json=body)
                assert r.status_code == status, (path, body, r.text)
                err = r.json()["error"]
                assert err["code"] == code and err["message"] and "type" in err, (path, body, err)
            assert (live.revision, app.state.gateway.snapshot) == before
            assert set(app.state.gateway.rt.fleet.nodes) == {"n0", "n1"}


async def test_a_second_replica_applies_the_overrides(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(3)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        file_urls = {n: u for n, u in urls.items() if n != "n2"}
        a = settings_for(tmp_path, fleet(file_urls), overrides_poll_s=3600, journal_dir=tmp_path / "ja")
        b = settings_for(tmp_path, fleet(file_urls), overrides_poll_s=3600, journal_dir=tmp_path / "jb")
        async with running_gateway(a) as (base_a, app_a), running_gateway(b) as (base_b, app_b), \
                httpx.AsyncClient(base_url=base_a, timeout=30) as http:
            assert (await http.post("/admin/nodes", json={"name": "n2", "url": urls["n2"], "models": ["m"]})
                    ).status_code == 200
            assert (await http.post("/admin/nodes/n1/drain")).status_code == 200
            assert (await http.patch("/admin/nodes/n0", json={"weight": 3.0})).status_code == 200
            fb: Fleet = app_b.state.gateway.rt.fleet
            assert "n2" not in fb.nodes
            assert await app_b.state.live.sync_once()       # what the 1 s poll does
            assert fb.nodes["n2"].state == "loading" and fb.nodes["n1"].state in ("draining", "drained")
            assert fb.nodes["n0"].cfg.weight == 3.0
            assert app_b.state.gateway.snapshot.config_version == app_a.state.gateway.snapshot.config_version
            assert not await app_b.state.live.sync_once()   # nothing new: one revision read
            async with httpx.AsyncClient(base_url=base_b, timeout=30) as hb:
                doc = (await hb.get("/admin/fleet")).json()
            assert {n["name"]: n["source"] for n in doc["nodes"]} == {"n0": "file", "n1": "file", "n2": "admin"}
            # a restart of a replica starts with the overrides applied
        async with running_gateway(b) as (_base, app_c):
            fc: Fleet = app_c.state.gateway.rt.fleet
            assert set(fc.nodes) == {"n0", "n1", "n2"} and fc.nodes["n1"].held
