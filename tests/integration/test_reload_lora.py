"""A LoRA model added by a live reload: the router becomes lora-affinity, the adapter name reaches
the emulated vLLM-like node, and a bad ``lora`` value is a 400 naming the key path (nothing changed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.lora import LoraSpec
from tests.integration.test_live_reload import live_settings
from tests.support import fast_specs, running_gateway


def doc(urls: dict[str, str], lora: dict[str, Any] | None) -> dict[str, Any]:
    models: list[dict[str, Any]] = [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8}]
    if lora is not None:
        models.append({"name": "sql", "default_max_tokens": 8, "lora": lora})
    return {"models": models, "nodes": [{"name": n, "url": u, "models": [m["name"] for m in models]}
                                        for n, u in urls.items()],
            "routing": {"seed": 1}}


async def test_a_reload_adds_a_lora_model_and_its_profile(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(2, lora=LoraSpec(adapters=("sql-lora",), max_lora=2, load_s=0.0))) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        settings = live_settings(tmp_path, urls)
        (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc(urls, None)))
        async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base, timeout=30) as http:
            assert app.state.gateway.rt.router.name == "token-aware"
            (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc(urls, {"adapter": "sql lora"})))
            r = await http.post("/admin/reload")
            assert r.status_code == 400 and r.json()["error"]["param"] == "models[1].lora.adapter", r.text
            assert app.state.gateway.rt.router.name == "token-aware"
            (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc(urls, {"adapter": "sql-lora"})))
            r = await http.post("/admin/reload")
            assert r.status_code == 200, r.text
            assert app.state.gateway.rt.router.name == "lora-affinity"
            chat = await http.post("/v1/chat/completions", json={"model": "sql", "messages": [
                {"role": "user", "content": "hi"}]})
            assert chat.status_code == 200, chat.text
            loaded = [n for n, node in sim.nodes.items() if node.lora_slots and node.lora_slots.loaded()]
            assert len(loaded) == 1
