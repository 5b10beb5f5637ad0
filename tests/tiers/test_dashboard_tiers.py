"""The dashboard's cost-tiers panel: the page has it and its script reads ``/admin/tiers`` and the
per-tier SLA report; ``/admin/tiers`` follows the admin rule (401 without the key, an empty list
on a fleet with no alias). The panel's drawing runs in the browser test (tests/observability)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import httpx

from inferlb.config.admission import AdmissionSettings
from inferlb.store.db import upgrade
from tests.observability import seed
from tests.support import running_gateway, settings_for


def test_the_page_has_the_panel_and_its_script_reads_the_tier_routes() -> None:
    static = resources.files("inferlb.observability") / "static"
    html = (static / "dashboard.html").read_text(encoding="utf-8")
    js = (static / "dashboard.js").read_text(encoding="utf-8")
    assert '<div id="tiers"></div>' in html and "<code>/admin/tiers</code>" in html
    assert 'getJSON("/admin/tiers")' in js and 'group_by: "model,served"' in js
    assert "tiersPanel(tierState, slaTiers);" in js and "dash.tiers = {" in js


async def test_admin_tiers_wants_the_admin_key_and_lists_no_alias_on_a_fleet_without_one(tmp_path: Path) -> None:
    admin = "admin-" + "t" * 32
    db = f"sqlite:///{tmp_path / 'plain.db'}"
    upgrade(db)
    settings = settings_for(tmp_path, seed.fleet(), database_url=db,
                            admission=AdmissionSettings(auth=True, admin_key=admin, redis_url=None))
    async with running_gateway(settings) as (base, _app), httpx.AsyncClient(base_url=base) as http:
        refused = await http.get("/admin/tiers")
        listed = await http.get("/admin/tiers", headers={"authorization": f"Bearer {admin}"})
    assert refused.status_code == 401 and "error" in refused.json()
    assert listed.status_code == 200 and listed.json() == {"object": "list", "data": []}
