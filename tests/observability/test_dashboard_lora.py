"""``GET /dashboard/lora``: the LoRA adapters panel's data, pure and through a running gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from inferlb.config.settings import fleet_from_mapping
from inferlb.observability.lora_panel import LORA_OFF_REASON, lora_panel
from tests.support import running_gateway, settings_for

FLEET = {
    "models": [{"name": "sql", "lora": {"adapter": "sql-lora", "base": "llama"}},
               {"name": "bot", "lora": {}, "versions": [{"name": "v1", "upstream_name": "bot-v1"},
                                                        {"name": "v2", "weight": 0}]},
               {"name": "llama"}],
    "nodes": [{"name": "a", "url": "http://10.0.0.1:8000", "models": ["sql", "bot", "llama"]}],
}


def test_the_panel_lists_each_lora_models_adapters_and_each_nodes_state() -> None:
    cfg = fleet_from_mapping(FLEET)
    nodes: list[dict[str, Any]] = [{"name": "a", "lora": {"running": ["sql-lora"], "waiting": ["bot-v1"], "max_lora": 4,
                                    "failed": ["bot"]}}, {"name": "b"}]
    out = lora_panel(cfg.models, nodes)
    assert out["enabled"] is True
    assert out["models"] == [
        {"model": "sql", "adapters": ["sql-lora"], "base": "llama", "failure_cooldown_s": 30.0},
        {"model": "bot", "adapters": ["bot", "bot-v1"], "base": None, "failure_cooldown_s": 30.0}]
    assert out["nodes"] == [
        {"node": "a", "running": ["sql-lora"], "waiting": ["bot-v1"], "max_lora": 4, "failed": ["bot"]},
        {"node": "b", "running": [], "waiting": [], "max_lora": None, "failed": []}]


def test_no_lora_model_says_so() -> None:
    cfg = fleet_from_mapping({"models": [{"name": "m"}], "nodes": [{"name": "a", "url": "http://x", "models": ["m"]}]})
    assert lora_panel(cfg.models, []) == {"enabled": False, "reason": LORA_OFF_REASON, "models": [], "nodes": []}


async def test_the_route_serves_the_live_fleet(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, fleet_from_mapping(FLEET))
    async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base) as http:
        app.state.gateway.rt.fleet.adapter_failed("a", "sql-lora", 60.0)
        r = await http.get("/dashboard/lora")
        assert r.status_code == 200
        body = r.json()
        assert body["enabled"] and body["nodes"] == [{"node": "a", "running": [], "waiting": [], "max_lora": None,
                                                      "failed": ["sql-lora"]}]
