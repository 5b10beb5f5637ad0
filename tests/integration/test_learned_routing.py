"""The learned profile through the gateway: real HTTP, the OpenAI SDK, simulated nodes, SQLite audit.

Warm-up requests are routed by the token-aware fallback (the audit says so and why); once the
predictor has learned from the gateway's own timings, decisions carry propensities and
predictions, ``GET /audit/requests/{id}`` explains them, the metrics show the predictor, the
scheduled retrain reads the audit trail, and ``inferlb routing evaluate`` estimates a candidate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from inferlb.cli.routing import routing_command
from inferlb.learned.loop import EVENT_NODE
from inferlb.simulator.emulator import SimFleet
from inferlb.store.db import make_engine
from inferlb.store.events import recent_events
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

pytestmark = pytest.mark.asyncio


async def test_learned_profile_logs_propensities_and_explains_its_picks(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    async with SimFleet(fast_specs(3)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        fleet = fleet_for(urls, profile="learned", seed=1,
                          predictor={"min_samples": 6, "train_interval_s": 60, "retrain_interval_s": 0,
                                     "retrain_min_rows": 20,
                                     # millisecond answers on a shared machine: relative jitter is
                                     # large; this test is about the flow, tests/engine about accuracy
                                     "drift_mape": 5.0, "recover_mape": 4.0},
                          params={"softmax-bandit": {"epsilon": 0.5}})
        settings = settings_for(tmp_path, fleet)
        async with running_gateway(settings) as (base, app):
            client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            loop = app.state.learned_loop
            lc = app.state.gateway.rt.learner
            assert loop is not None and lc.state == "warming"

            async def ask(stream: bool, priority: str | None = None) -> str:
                headers = {"x-inferlb-priority": priority} if priority else {}
                if stream:
                    s = await client.chat.completions.with_raw_response.create(
                        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=12, stream=True,
                        extra_headers=headers)
                    rid = s.headers["x-request-id"]
                    async for _ in s.parse():
                        pass
                    return rid
                r = await client.chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=12, extra_headers=headers)
                return r.headers["x-request-id"]

            warm = [await ask(stream=i % 2 == 0) for i in range(12)]
            loop.turn()   # the background loop's training turn, run now rather than waited for
            assert lc.state == "active", lc.status()
            learned_ids = [await ask(stream=i % 2 == 0) for i in range(30)]
            critical = await ask(stream=True, priority="critical")
            await app.state.store.writer.flush_once(force=True)
            async with httpx.AsyncClient(base_url=base) as http:
                first = (await http.get(f"/audit/requests/{warm[0]}")).json()
                wl = first["decision"]["learned"]
                assert wl["fallback"] == "token-aware" and "warming" in wl["reason"] and wl["propensity"] is None
                recs = [(await http.get(f"/audit/requests/{rid}")).json() for rid in learned_ids]
                crit = (await http.get(f"/audit/requests/{critical}")).json()["decision"]["learned"]
                metrics = (await http.get("/metrics")).text
            explored = 0
            for rec in recs:
                lj = rec["decision"]["learned"]
                assert lj["version"] == 1 and lj["state"] == "active" and "fallback" not in lj
                assert 0 < lj["propensity"] <= 1 and lj["pick"]["node"] == rec["node"]
                assert lj["pick"]["ttft_s"] > 0 and lj["pick"]["tpot_s"] > 0 and rec["node"] in lj["why"]
                assert rec["decisions"][0]["learned"]["propensity"] == lj["propensity"]
                explored += lj["explored"]
            assert explored > 0   # ε = 0.5 over three nodes
            assert crit["epsilon"] == 0.0 and crit["explored"] is False
            assert 'inferlb_routing_predictor_state{state="active"} 1.0' in metrics
            assert "inferlb_routing_predictor_mape" in metrics and "inferlb_routing_explored_total" in metrics

            # the scheduled retrain reads the audit trail; every answer came after its held-out
            # window opened (at start), so there is nothing older to train a candidate on: refused,
            # saying so, and the window moves to now (tests/learned/test_retrain.py: the comparison)
            out = await loop.retrain()
            assert out["outcome"] == "refused" and out["why"] == "too_few_rows", out
            assert out["held_out"] >= 30 and out["trained_on"] == 0 and lc.version == 1
            async with httpx.AsyncClient(base_url=base) as http:
                metrics = (await http.get("/metrics")).text
            assert 'inferlb_routing_predictor_retrains_total{outcome="refused"} 1.0' in metrics

        engine = make_engine(settings.database_url)
        try:   # the state change is in node_events (written when the gateway stopped, at the latest)
            events = recent_events(engine, node=EVENT_NODE)
        finally:
            engine.dispose()
        assert ("warming", "active") in [(e["from"], e["to"]) for e in events]
        assert "retrain_refused" in [e["to"] for e in events]

        args = argparse.Namespace(since=None, until=None, limit=1000, metric="e2e", failure_cost_s=30.0,
                                  bootstrap=50, seed=0, json=True, policy="token-aware")
        assert routing_command(args, settings.database_url) == 0
        report = json.loads(capsys.readouterr().out)
        # a few dozen decisions: below the default effective sample size the estimate is refused
        assert ("refused" in report) == (report["ess"] < report["min_ess"])
        if "refused" in report:
            assert "snips" not in report and report["refused"].startswith("insufficient overlap")
        args.min_ess = 0.0    # asked for explicitly: the numbers
        assert routing_command(args, settings.database_url) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["n"] >= 30 and report["decisions_read"] >= 42
        assert report["skipped"].get("no propensity (a fallback profile decided)", 0) >= 8
        for k in ("ips", "snips", "dr"):
            assert report[k]["value"] > 0 and report[k]["ci_low"] <= report[k]["value"] <= report[k]["ci_high"]
