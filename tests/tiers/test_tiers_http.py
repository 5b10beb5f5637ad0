"""A model alias with tiers over real HTTP, with the real OpenAI SDK in front of emulated nodes: an
easy request goes to the cheap tier, a hard one to the strong tier, a client asking for a tier model
directly is served as before; the audit record holds the choice (tier, score, contributions, why)
in ``tags`` and in the routing decision; ``/admin/tiers``, the per-tier SLA and cost reports and
``/metrics`` count each tier; a reload changes the tiers at once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from openai import AsyncOpenAI

from inferlb.config.settings import Settings
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import NodeSpec
from tests.support import audit_of, running_gateway

SERVES = {"s0": "small", "l0": "large"}
HARD = ("Prove the theorem below, then write the integral as code.\n```python\ndef f(x):\n    return x\n```\n"
        + "context " * 1200)


def fleet_doc(urls: dict[str, str], max_score: float = 0.3) -> dict[str, Any]:
    return {
        "models": [
            {"name": "auto", "tiers": {"models": [{"model": "small", "max_score": max_score}, {"model": "large"}],
                                       "guard": {"min_requests": 5}}},
            {"name": "small", "max_output_tokens": 64, "default_max_tokens": 4},
            {"name": "large", "max_output_tokens": 64, "default_max_tokens": 4},
        ],
        "nodes": [{"name": n, "url": u, "models": [SERVES[n]], "price_per_hour": 1.0 if n == "s0" else 8.0}
                  for n, u in urls.items()],
        "routing": {"profile": "round-robin", "seed": 1},
        "slos": [{"model": "*", "e2e_max_s": 30.0}],
        "timeouts": {"connect_s": 1.0, "first_token_s": 5.0, "idle_s": 5.0, "total_s": 20.0},
    }


@contextlib.asynccontextmanager
async def stack(tmp: Path) -> AsyncIterator[tuple[AsyncOpenAI, httpx.AsyncClient, Any, dict[str, str]]]:
    specs = [NodeSpec(name=n, models=[m], base_ttft_s=0.002, tpot_s=0.0005) for n, m in SERVES.items()]
    async with SimFleet(specs) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        (tmp / "fleet.yaml").write_text(yaml.safe_dump(fleet_doc(urls)))
        s = Settings(config=tmp / "fleet.yaml", database_url=f"sqlite:///{tmp / 'audit.db'}",
                     journal_dir=tmp / "journal", audit_flush_interval_s=0.01)
        async with running_gateway(s) as (base, app), httpx.AsyncClient(base_url=base, timeout=10) as http:
            sdk = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, http_client=http)
            yield sdk, http, app, urls



async def test_an_alias_sends_easy_requests_to_the_cheap_tier_and_hard_ones_to_the_strong(tmp_path: Path) -> None:
    async with stack(tmp_path) as (sdk, http, app, _):
        easy = await sdk.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert easy.parse().model == "small"
        hard = await sdk.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": HARD}], max_tokens=4,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
        assert hard.parse().model == "large"
        direct = await sdk.chat.completions.with_raw_response.create(
            model="small", messages=[{"role": "user", "content": HARD}], max_tokens=4)
        assert direct.parse().model == "small"   # a tier model asked for directly: no tiering

        rec = await audit_of(http, app, easy.headers["x-request-id"])
        assert rec["model_requested"] == "auto" and rec["model_served"] == "small" and rec["node"] == "s0"
        tier = rec["tags"]["tier"]
        assert tier["alias"] == "auto" and tier["model"] == "small" and tier["index"] == 0
        assert tier["score"] <= 0.3 and tier["why"].startswith("small: score")
        assert sum(tier["contributions"].values()) == pytest.approx(tier["score"], abs=1e-5)
        assert rec["decisions"][0]["tier"] == tier          # in the routing decision too

        rec = await audit_of(http, app, hard.headers["x-request-id"])
        tier = rec["tags"]["tier"]
        assert rec["model_served"] == "large" and tier["model"] == "large" and tier["score"] > 0.3
        assert "small passed over" in tier["why"]
        assert tier["features"]["tools"] == 1.0 and tier["features"]["code"] == 1.0
        assert tier["features"]["math"] == 1.0 and tier["contributions"]["tools"] > 0
        assert rec["decisions"][0]["tier"]["model"] == "large"

        rec = await audit_of(http, app, direct.headers["x-request-id"])
        assert "tier" not in rec["tags"] and rec["model_served"] == "small"

        admin = (await http.get("/admin/tiers")).json()["data"]
        [alias] = admin
        assert alias["alias"] == "auto"
        assert [(t["model"], t["chosen"], t["requests"], t["errors"]) for t in alias["tiers"]] == [
            ("small", 1, 1, 0), ("large", 1, 1, 0)]
        assert alias["tiers"][0]["guard"]["tripped"] is False

        sla = (await http.get("/reports/sla", params={"group_by": "model,served"})).json()["data"]
        rows = {(r["model"], r["served"]): r for r in sla}
        assert rows[("auto", "small")]["count"] == 1 and rows[("auto", "large")]["count"] == 1
        assert rows[("small", "small")]["count"] == 1
        assert rows[("auto", "small")]["slo_attainment"] == 1.0
        cost = (await http.get("/reports/cost", params={"group_by": "model,served"})).json()["data"]
        assert {(r["model"], r["served"]) for r in cost} >= {("auto", "small"), ("auto", "large")}

        text = (await http.get("/metrics")).text
        assert 'inferlb_tier_chosen_total{alias="auto",tier="small"} 1.0' in text
        assert 'inferlb_tier_guard_tripped{alias="auto",tier="small"} 0.0' in text

        explained = (await http.post("/admin/tiers/explain",
                                     json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})).json()
        assert explained["model"] == "small" and explained["score"] <= 0.3
        bad = await http.post("/admin/tiers/explain", json={"model": "small", "messages": []})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "model_not_tiered"


async def test_a_reload_changes_the_tiers_and_keeps_their_counts(tmp_path: Path) -> None:
    async with stack(tmp_path) as (sdk, http, app, urls):
        first = await sdk.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=4)
        assert first.model == "small"
        (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet_doc(urls, max_score=0.0)))
        r = await http.post("/admin/reload")
        assert r.status_code == 200, r.text
        again = await sdk.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=4)
        assert again.model == "large"             # "hi" scores above 0: the cheap tier takes nothing now
        [alias] = (await http.get("/admin/tiers")).json()["data"]
        assert [(t["model"], t["max_score"], t["chosen"]) for t in alias["tiers"]] == [
            ("small", 0.0, 1), ("large", None, 1)]
        # A reload that names an unknown tier model is refused with the key path; the tiers stay.
        doc = fleet_doc(urls)
        doc["models"][0]["tiers"]["models"][1]["model"] = "huge"
        (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc))
        r = await http.post("/admin/reload")
        assert r.status_code >= 400 and "models[0].tiers.models[1].model" in r.text, r.text
        still = await sdk.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=4)
        assert still.model == "large"
