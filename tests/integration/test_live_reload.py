"""Reload while serving (live/manager.py), over real HTTP in front of simulated nodes, with the real
OpenAI SDK as the client: 20 reloads alternating two valid processes under steady load fail no
request, each request runs wholly on one definition and its audit row says which; an invalid file
is a 4xx naming file, element / key path and problem, and the old config keeps serving."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import select

from inferlb.config.admission import AdmissionSettings
from inferlb.config.settings import Settings
from inferlb.simulator.emulator import SimFleet
from inferlb.store.db import make_engine
from inferlb.store.schema import REQUESTS
from tests.integration.load import steady_load
from tests.support import ROOT, fast_specs, running_gateway

PROCESSES = ROOT / "processes"
FIXTURES = ROOT / "tests" / "processes" / "fixtures"
ADMIN = "sk-admin-live-test"


def fleet_doc(urls: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8}],
            "nodes": [{"name": n, "url": u, "models": ["m"]} for n, u in urls.items()],
            "routing": {"profile": "token-aware", "seed": 1},
            "timeouts": {"connect_s": 1.0, "first_token_s": 5.0, "idle_s": 5.0, "total_s": 20.0},
            **extra}


def live_settings(tmp: Path, urls: dict[str, str], **over: Any) -> Settings:
    """Settings reading a fleet FILE and a processes DIRECTORY the test can edit."""
    pdir = tmp / "processes"
    pdir.mkdir(exist_ok=True)
    for f in PROCESSES.glob("*.bpmn"):
        shutil.copy(f, pdir / f.name)
    (tmp / "fleet.yaml").write_text(yaml.safe_dump(fleet_doc(urls)))
    base: dict[str, Any] = {"config": tmp / "fleet.yaml", "processes_dir": pdir,
                            "database_url": f"sqlite:///{tmp / 'audit.db'}", "journal_dir": tmp / "journal",
                            "audit_flush_interval_s": 0.01}
    base.update(over)
    return Settings(**base)


def rows(tmp: Path) -> list[Any]:
    eng = make_engine(f"sqlite:///{tmp / 'audit.db'}")
    try:
        with eng.connect() as conn:
            return list(conn.execute(select(REQUESTS.c.request_id, REQUESTS.c.status, REQUESTS.c.process_version,
                                            REQUESTS.c.config_version, REQUESTS.c.tags)).all())
    finally:
        eng.dispose()


async def test_twenty_reloads_under_load_fail_no_request(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(3)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        settings = live_settings(tmp_path, urls)
        target = tmp_path / "processes" / "inference_request.bpmn"
        versions: list[str] = []
        async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base, timeout=30) as http:
            first = app.state.gateway.process.version
            fleet_before = {n: st for n, st in app.state.gateway.rt.fleet.nodes.items()}
            async with steady_load(base) as load:
                await load.progress(10)
                for i in range(20):
                    src = FIXTURES / "inference_request_tagged.bpmn" if i % 2 == 0 else PROCESSES / target.name
                    shutil.copy(src, target)
                    r = await http.post("/admin/reload")
                    assert r.status_code == 200, r.text
                    doc = r.json()
                    versions.append(doc["process"]["version"])
                    assert doc["nodes"] == []            # same fleet file: every node persists
                    await load.progress(5)               # requests flow on the new definition
            assert load.failed == 0, load.errors[:5]
            assert load.ok >= 10 + 20 * 5
            # nodes persisted: the same live state objects, with their counters
            assert all(app.state.gateway.rt.fleet.nodes[n] is st for n, st in fleet_before.items())
            fleet = (await http.get("/admin/fleet")).json()
            assert fleet["live"]["reloads"] == 20
            await app.state.store.writer.flush_once(force=True)
        assert len(set(versions)) == 2 and versions[1] == first and versions[0] != first
        got = rows(tmp_path)
        assert len(got) == load.ok
        assert {r.status for r in got} == {"ok"}
        assert {r.process_version for r in got} == {first, versions[0]}
        # each request ran wholly on one definition: the tagged process tags its record, the shipped one does not
        for r in got:
            assert (r.tags.get("flow") == "tagged") == (r.process_version == versions[0]), r
        assert len({r.config_version for r in got}) == 1


async def test_an_invalid_reload_changes_nothing_and_names_the_problem(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(2)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        settings = live_settings(tmp_path, urls)
        target = tmp_path / "processes" / "inference_request.bpmn"
        async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base, timeout=30) as http:
            before = app.state.gateway.snapshot
            # a typo of a variable in a gateway condition: admision["admitted"]
            shutil.copy(FIXTURES / "typo_variable_name.bpmn", target)
            r = await http.post("/admin/reload")
            assert r.status_code == 400
            err = r.json()["error"]
            assert err["code"] == "invalid_process" and err["param"] == "gw_admitted"
            assert str(target) in err["message"] and "'admision'" in err["message"]
            assert app.state.gateway.snapshot is before
            shutil.copy(PROCESSES / target.name, target)

            # a bad value in the fleet file: file, key path, problem
            doc = fleet_doc(urls)
            doc["nodes"][1]["capacity_tokens"] = -5
            (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc))
            r = await http.post("/admin/reload")
            assert r.status_code == 400
            err = r.json()["error"]
            assert err["code"] == "invalid_config" and err["param"] == "nodes[1].capacity_tokens"
            assert "fleet.yaml" in err["message"]

            # a section a running gateway cannot take: 409, nothing changed
            (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet_doc(urls, admission={"default_class": "batch"})))
            r = await http.post("/admin/reload")
            assert r.status_code == 409 and r.json()["error"]["code"] == "restart_required", r.text
            assert r.json()["error"]["param"] == "admission"
            assert app.state.gateway.snapshot is before

            # the old config kept serving all along
            chat = await http.post("/v1/chat/completions", json={"model": "m", "max_tokens": 2,
                                                                 "messages": [{"role": "user", "content": "hi"}]})
            assert chat.status_code == 200

            # a valid fleet change: one node removed, one weight changed; the other keeps its state
            kept = app.state.gateway.rt.fleet.nodes["n0"]
            doc = fleet_doc({"n0": urls["n0"]})
            doc["nodes"][0]["weight"] = 2.0
            (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc))
            r = await http.post("/admin/reload")
            assert r.status_code == 200, r.text
            assert r.json()["nodes"] == ["changed n0", "removing n1"]
            assert app.state.gateway.rt.fleet.nodes["n0"] is kept and kept.cfg.weight == 2.0
            assert "n1" not in app.state.gateway.rt.fleet.nodes      # nothing in flight: gone at once
            assert r.json()["config_version"] != before.config_version


async def test_reload_needs_the_admin_key_when_auth_is_on(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(2)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        settings = live_settings(tmp_path, urls, admission=AdmissionSettings(auth=True, admin_key=ADMIN,
                                                                             redis_url=None))
        async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base, timeout=30) as http:
            assert (await http.post("/admin/reload")).status_code == 401
            key = (await http.post("/admin/keys", json={"tenant": "t"},
                                   headers={"authorization": f"Bearer {ADMIN}"})).json()["key"]
            r = await http.post("/admin/reload", headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied"
            async with steady_load(base, api_key=key, workers=2) as load:
                await load.progress(4)
                r = await http.post("/admin/reload", headers={"authorization": f"Bearer {ADMIN}"})
                assert r.status_code == 200, r.text
                await load.progress(4)
            assert load.failed == 0, load.errors[:3]


@pytest.mark.parametrize("engine", ["spiff", "compiled"])
async def test_a_reload_keeps_the_configured_executor(tmp_path: Path, engine: str) -> None:
    async with SimFleet(fast_specs(1)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        async with running_gateway(live_settings(tmp_path, urls, engine=engine)) as (base, app), \
                httpx.AsyncClient(base_url=base, timeout=30) as http:
            r = await http.post("/admin/reload")
            assert r.status_code == 200 and r.json()["process"]["engine"] == engine
            assert (await http.get("/readyz")).json()["engine"] == engine


async def test_a_reload_swaps_the_router_but_not_to_a_learned_one(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(2)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        async with running_gateway(live_settings(tmp_path, urls)) as (base, app), \
                httpx.AsyncClient(base_url=base, timeout=30) as http:
            (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet_doc(urls, routing={"profile": "round-robin"})))
            r = await http.post("/admin/reload")
            assert r.status_code == 200, r.text
            assert (await http.get("/admin/fleet")).json()["routing_profile"] == "round-robin"
            before = app.state.gateway.snapshot
            (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet_doc(urls, routing={"profile": "learned"})))
            r = await http.post("/admin/reload")
            assert r.status_code == 409 and r.json()["error"]["param"] == "routing", r.text
            assert app.state.gateway.snapshot is before
