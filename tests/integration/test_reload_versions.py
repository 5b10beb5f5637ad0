"""A reload that changes models' ``versions`` (live/manager.py with rollout/manager.py), over
real HTTP in front of simulated nodes, with the real OpenAI SDK as load: the version table is
swapped in the same validate-then-swap as the process and the fleet (nothing partial on error),
the config version covers the versions, a running rollout's weights survive a reload that keeps
its versions, and a reload that drops a version under a running rollout is a 409 that names the
rollout and changes nothing. No client request fails through any of it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import select

from inferlb.config.settings import Settings
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import NodeSpec
from inferlb.store.db import make_engine
from inferlb.store.schema import REQUESTS
from tests.integration.load import steady_load
from tests.support import ROOT, running_gateway

PROCESSES = ROOT / "processes"
V1 = {"name": "v1", "weight": 100, "nodes": ["n0", "n1"]}
V2 = {"name": "v2", "weight": 0, "nodes": ["n2"], "upstream_name": "m-v2"}
CRITERIA = {"min_requests": 20, "min_step_s": 0, "window_s": 600, "max_step_s": 3600}


def fleet_doc(urls: dict[str, str], versions: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8, "versions": versions}],
            "nodes": [{"name": n, "url": u, "models": ["m"]} for n, u in urls.items()],
            "routing": {"profile": "least-connections", "seed": 1},
            "timeouts": {"connect_s": 1.0, "first_token_s": 5.0, "idle_s": 5.0, "total_s": 20.0},
            "rollouts": {"interval_s": 3600, "steps": [10, 50, 100], "criteria": CRITERIA}, **extra}


def write(tmp: Path, doc: dict[str, Any]) -> None:
    (tmp / "fleet.yaml").write_text(yaml.safe_dump(doc))


def settings(tmp: Path, doc: dict[str, Any]) -> Settings:
    pdir = tmp / "processes"
    pdir.mkdir(exist_ok=True)
    for f in PROCESSES.glob("*.bpmn"):
        shutil.copy(f, pdir / f.name)
    write(tmp, doc)
    return Settings(config=tmp / "fleet.yaml", processes_dir=pdir, database_url=f"sqlite:///{tmp / 'audit.db'}",
                    journal_dir=tmp / "journal", audit_flush_interval_s=0.01)


def shares(app: Any) -> dict[str, float]:
    mv = app.state.gateway.rt.versions.get("m")
    return mv.shares() if mv is not None else {}


async def test_reloads_swap_versions_keep_a_running_rollout_and_refuse_dropping_its_version(tmp_path: Path) -> None:
    specs = [NodeSpec(name=f"n{i}", models=["m", "m-v2"], base_ttft_s=0.002, tpot_s=0.0005) for i in range(3)]
    async with SimFleet(specs) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        s = settings(tmp_path, fleet_doc(urls, [V1]))
        async with running_gateway(s) as (base, app), httpx.AsyncClient(base_url=base, timeout=30) as http, \
                steady_load(base) as load:
            gw = app.state.gateway
            await load.progress(10)
            assert app.state.gateway.rt.versions.get("m").names == ["v1"]
            # 1. A reload adds v2: swapped with the process and the fleet; a new config version.
            write(tmp_path, fleet_doc(urls, [V1, V2]))
            old_rollout_process = app.state.rollouts.process
            r = await http.post("/admin/reload")
            assert r.status_code == 200, r.text
            doc = r.json()
            assert app.state.rollouts.process is not old_rollout_process      # rollout.bpmn re-read, swapped
            assert doc["config_version"] != doc["previous_config_version"]
            assert doc["config_version"] == gw.snapshot.config_version
            assert [v["name"] for v in doc["versions"][0]["versions"]] == ["v1", "v2"]
            assert doc["rollout_process"]["file"] == "rollout.bpmn"
            await load.progress(5)
            pinned = await http.post("/v1/chat/completions", headers={"x-inferlb-model-version": "v2"},
                                     json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                           "max_tokens": 2})
            assert pinned.status_code == 200, pinned.text
            pinned_id = pinned.headers["x-request-id"]
            # 2. A rollout to v2, then a reload that keeps both versions (and changes v1's file
            #    weight and the timeouts): the rollout's weights survive, the config version moves.
            r = await http.post("/admin/rollouts", json={"model": "m", "from_version": "v1", "to_version": "v2"})
            assert r.status_code == 201, r.text
            rid = r.json()["id"]
            assert shares(app) == {"v1": 0.9, "v2": 0.1}
            write(tmp_path, fleet_doc(urls, [{**V1, "weight": 50}, V2],
                                      timeouts={"connect_s": 1.0, "first_token_s": 5.0, "idle_s": 5.0,
                                                "total_s": 25.0}))
            before = gw.snapshot.config_version
            r = await http.post("/admin/reload")
            assert r.status_code == 200, r.text
            assert r.json()["config_version"] != before
            assert shares(app) == {"v1": 0.9, "v2": 0.1}
            assert app.state.rollouts.get(rid).running
            assert app.state.gateway.rt.versions.file_weights("m") == {"v1": 50.0, "v2": 0.0}
            await load.progress(5)
            # 3. Dropping v2 under the running rollout: 409 naming it; nothing changed.
            snap = gw.snapshot
            for versions in ([V1], [V1, {**V2, "name": "v3"}]):
                write(tmp_path, fleet_doc(urls, versions))
                r = await http.post("/admin/reload")
                assert r.status_code == 409, r.text
                err = r.json()["error"]
                assert err["code"] == "rollout_running" and err["param"] == "models[0].versions"
                assert rid in err["message"] and "'v2'" in err["message"] and "abort" in err["message"]
                assert gw.snapshot is snap and shares(app) == {"v1": 0.9, "v2": 0.1}
                assert app.state.gateway.rt.versions.get("m").names == ["v1", "v2"]
            # 4. A version naming a node that does not exist: 400 with the key path; nothing changed.
            write(tmp_path, fleet_doc(urls, [V1, {**V2, "nodes": ["nope"]}]))
            r = await http.post("/admin/reload")
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "models[0].versions[1].nodes[0]"
            assert gw.snapshot is snap and shares(app) == {"v1": 0.9, "v2": 0.1}
            # 5. After an abort the same reload goes through, and the model is v1 only again.
            assert (await http.post(f"/admin/rollouts/{rid}/abort")).status_code == 200
            write(tmp_path, fleet_doc(urls, [V1]))
            r = await http.post("/admin/reload")
            assert r.status_code == 200, r.text
            assert app.state.gateway.rt.versions.get("m").names == ["v1"] and shares(app) == {"v1": 1.0}
            await load.progress(5)
            fleet = (await http.get("/admin/fleet")).json()
            assert fleet["live"]["reloads"] == 3            # the refused ones are not counted
            await app.state.store.writer.flush_once(force=True)
        assert load.failed == 0, load.errors[:5]
    engine = make_engine(f"sqlite:///{tmp_path / 'audit.db'}")
    try:
        with engine.connect() as conn:
            got = conn.execute(select(REQUESTS.c.request_id, REQUESTS.c.model_version, REQUESTS.c.config_version)
                               .where(REQUESTS.c.request_id == pinned_id)).one()
    finally:
        engine.dispose()
    assert got.model_version == "v2" and got.config_version is not None
