"""The learned profile's reward bandit (routing/reward.py) through a real gateway: real HTTP to
emulated nodes, streamed and not, with authentication on; every answer and every failed attempt
reaches the bandit, the audit decision names the arm, /metrics counts each arm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from inferlb.config.admission import AdmissionSettings
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec
from tests.support import audit_of, fast_specs, fleet_for, running_gateway, settings_for

ADMIN = "admin-secret-key-for-tests"


def _arms_metric(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("inferlb_routing_reward_pulls_total{"):
            arm = line.split('arm="', 1)[1].split('"', 1)[0]
            out[arm] = float(line.rsplit(" ", 1)[1])
    return out


async def test_the_bandit_learns_from_every_answer_and_failure_and_says_which_arm_routed(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(3)) as sim:
        fleet = fleet_for({n: node.url for n, node in sim.nodes.items()}, profile="learned", seed=3,
                          # never drifts: every decision is the bandit's (a drifted predictor hands
                          # routing to the guard's fallback, which is no arm)
                          predictor={"min_samples": 0, "drift_mape": 1000, "recover_mape": 999},
                          reward={"enabled": True, "arms": ["learned", "token-aware"], "min_pulls": 2})
        settings = settings_for(tmp_path, fleet,
                                admission=AdmissionSettings(auth=True, admin_key=ADMIN, redis_url=None))
        await sim.nodes["n2"].set_faults(FaultSpec(status=503))   # its attempts fail: failure cost
        async with running_gateway(settings) as (base, app):
            async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                r = await http.post("/admin/keys", json={"tenant": "t1"},
                                    headers={"authorization": f"Bearer {ADMIN}"})
                assert r.status_code == 201, r.text
                key = r.json()["key"]
            bandit = app.state.gateway.rt.router.reward
            assert bandit is not None
            ids: list[str] = []
            async with httpx.AsyncClient(base_url=base, timeout=10,
                                         headers={"authorization": f"Bearer {key}"}) as c:
                for i in range(24):
                    body: dict[str, Any] = {"model": "m", "max_tokens": 4, "stream": i % 2 == 1,
                                            "messages": [{"role": "user", "content": f"q{i}"}]}
                    r = await c.post("/v1/chat/completions", json=body)
                    assert r.status_code == 200, r.text
                    ids.append(r.headers["x-request-id"])
                assert (await c.get("/metrics")).status_code == 403   # not for a tenant key
            async with httpx.AsyncClient(base_url=base, timeout=10,
                                         headers={"authorization": f"Bearer {ADMIN}"}) as admin:
                metrics = _arms_metric((await admin.get("/metrics")).text)
                arms = [(await audit_of(admin, app, rid))["decision"]["learned"]["arm"] for rid in ids]
    st = bandit.status()["arms"]
    pulls = {a["arm"]: a["pulls"] for a in st}
    observed = sum(a["observed"] for a in st)
    assert set(arms) == {"learned", "token-aware"}               # both arms routed, each recorded
    assert metrics == {k: float(v) for k, v in pulls.items()} and sum(pulls.values()) >= 24
    # every request's answer was observed, plus each attempt that failed on n2 before its retry
    assert observed >= 24 and observed == sum(pulls.values())
