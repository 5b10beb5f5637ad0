"""``GET /dashboard`` without a browser: the page, its vendored assets, CSP, and the node-state data."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from inferlb.api.dashboard import ASSETS
from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.observability.history import NodeStateHistory
from inferlb.types import ManualClock
from tests.support import fleet_for, running_gateway, settings_for

STATIC = Path(__file__).resolve().parents[2] / "inferlb" / "observability" / "static"


def test_nothing_is_loaded_from_another_origin() -> None:
    for name in ("dashboard.html", "dashboard.js", "dashboard.css"):
        text = (STATIC / name).read_text()
        assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text), name
        assert "fetch(\"http" not in text and "import(" not in text, name
    assert "MIT License" in (STATIC / "vendor" / "uPlot.LICENSE").read_text()


def test_node_state_history_is_a_bounded_ring() -> None:
    clock = ManualClock()
    fleet = Fleet(fleet_for({"a": "http://127.0.0.1:1", "b": "http://127.0.0.1:2"}), clock)
    hist = NodeStateHistory(lambda: fleet, clock, size=3)
    for i in range(5):
        if i == 3:
            fleet.cool_down("b", 5)
        hist.sample()
        clock.advance(1)
    snap = hist.snapshot()
    assert snap["nodes"] == ["a", "b"] and len(snap["samples"]) == 3
    assert [s["states"]["b"] for s in snap["samples"]] == ["healthy", "cooldown", "cooldown"]
    assert snap["samples"][0]["t"] == clock.time() - 3


async def test_page_assets_and_node_states(tmp_path: Path) -> None:
    fleet = fleet_for({"n0": "http://127.0.0.1:9"})
    async with running_gateway(settings_for(tmp_path, fleet)) as (base, _app), \
            httpx.AsyncClient(base_url=base) as http:
        page = await http.get("/dashboard")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
        for src in re.findall(r'(?:src|href)="(/dashboard/assets/[^"]+)"', page.text):
            asset = await http.get(src)
            assert asset.status_code == 200 and asset.content, src
        assert len(re.findall(r"/dashboard/assets/", page.text)) == 4
        for name, (_, media) in ASSETS.items():
            assert (await http.get(f"/dashboard/assets/{name}")).headers["content-type"] == media
        for bad in ("../app.py", "..%2F..%2Fsettings.py", "dashboard.html", "nope.js"):
            resp = await http.get(f"/dashboard/assets/{bad}")
            assert resp.status_code == 404 and "error" in resp.json()
        states = (await http.get("/dashboard/node-states")).json()
        assert states["nodes"] == ["n0"] and states["samples"][0]["states"] == {"n0": "healthy"}


async def test_node_states_name_the_prefill_and_decode_roles(tmp_path: Path) -> None:
    raw = fleet_for({"p0": "http://127.0.0.1:9", "d0": "http://127.0.0.1:10"}).model_dump(mode="json")
    raw["models"] = [{**raw["models"][0], "disaggregation": {"mode": "prefill-decode"}}]
    raw["nodes"] = [{**n, "models": ["m"], "role": "prefill" if n["name"] == "p0" else "decode"}
                    for n in raw["nodes"]]
    async with running_gateway(settings_for(tmp_path, fleet_from_mapping(raw))) as (base, _app), \
            httpx.AsyncClient(base_url=base) as http:
        states = (await http.get("/dashboard/node-states")).json()
        assert states["roles"] == {"p0": "prefill", "d0": "decode"}
        js = (await http.get("/dashboard/assets/dashboard.js")).text
        assert "hist.roles" in js
