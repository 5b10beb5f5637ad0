"""Every answer carries an ``x-request-id``: refusals (401, 404, 400, 405) too, and an answered
request keeps the id of its audit record."""

from __future__ import annotations

from pathlib import Path

import httpx

from inferlb.config.admission import AdmissionSettings
from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

ADMIN = "admin-" + "d" * 32


async def test_every_answer_carries_a_request_id(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(1)) as sim:
        fleet = fleet_for({n: node.url for n, node in sim.nodes.items()})
        settings = settings_for(tmp_path, fleet, admission=AdmissionSettings(auth=True, admin_key=ADMIN,
                                                                              redis_url=None))
        async with running_gateway(settings, public=True) as (base, app), httpx.AsyncClient(base_url=base) as http:
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            answers = {
                "unknown path (404)": await http.get("/no/such/route"),
                "no key (401)": await http.post("/v1/chat/completions", json=chat),
                "admin route without its key (401)": await http.get("/admin/fleet"),
                "wrong method (405)": await http.delete("/v1/models"),
                "liveness (200)": await http.get("/healthz"),
            }
            ids = {what: r.headers.get("x-request-id") for what, r in answers.items()}
            assert all(ids.values()), {w: (answers[w].status_code, i) for w, i in ids.items()}
            assert len(set(ids.values())) == len(ids), "each answer has its own id"
            assert answers["no key (401)"].status_code == 401 and answers["unknown path (404)"].status_code == 404
            key = (await http.post("/admin/keys", json={"tenant": "t"},
                                   headers={"authorization": f"Bearer {ADMIN}"})).json()["key"]
            ok = await http.post("/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {key}"})
            assert ok.status_code == 200, ok.text
            rid = ok.headers["x-request-id"]
            assert ok.headers.get_list("x-request-id") == [rid], "the gateway's own id, not a second one"
            audit = await http.get(f"/audit/requests/{rid}", headers={"authorization": f"Bearer {ADMIN}"})
            for _ in range(1000):   # hang guard: the batched writer lands the row soon after the answer
                if audit.status_code == 200:
                    break
                await app.state.store.writer.flush_once(force=True)
                audit = await http.get(f"/audit/requests/{rid}", headers={"authorization": f"Bearer {ADMIN}"})
            assert audit.status_code == 200 and audit.json()["request_id"] == rid
