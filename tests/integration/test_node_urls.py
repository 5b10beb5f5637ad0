"""The network policy over real HTTP: ``POST /admin/nodes`` refuses a hostile node URL with a 400
in the OpenAI envelope (the URL as written, and a host name by what it resolves to at add time),
nothing is added, and nothing secret comes back."""

from __future__ import annotations

from pathlib import Path

import httpx

from inferlb.config.settings import fleet_from_mapping
from tests.support import running_gateway, settings_for


async def test_admin_api_refuses_hostile_node_urls_with_400_envelopes(tmp_path: Path) -> None:
    cfg = fleet_from_mapping({
        "models": [{"name": "m"}],
        "nodes": [{"name": "n0", "url": "http://10.255.0.1:8000", "models": ["m"]}],
        "health": {"nodes": {"n0": {"probe": False}}},
        "network_policy": {"deny": ["127.0.0.0/8", "::1/128"]},
    })
    hostile = ["http://169.254.169.254/latest/meta-data/", "http://user:hunter2@10.0.0.9:8000",
               "http://0xA9FEA9FE/", "http://[::ffff:169.254.169.254]/", "http://metadata.google.internal./",
               "http://127.0.0.1:9000",          # in network_policy.deny
               "http://localhost:9000"]          # a name: refused by what it resolves to (127.0.0.1 / ::1)
    async with running_gateway(settings_for(tmp_path, cfg)) as (base, app), \
            httpx.AsyncClient(base_url=base, timeout=10) as http:
        for i, url in enumerate(hostile):
            r = await http.post("/admin/nodes", json={"name": f"evil{i}", "url": url, "models": ["m"]})
            assert r.status_code == 400, (url, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"}
            assert (err["param"], err["code"]) == ("url", "node_url_refused"), (url, err)
            assert "hunter2" not in r.text
        assert set(app.state.gateway.rt.fleet.nodes) == {"n0"}
        fleet = (await http.get("/admin/fleet")).json()
        assert "evil" not in str(fleet)
