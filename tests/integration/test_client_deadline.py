"""A client's deadline is never a node's fault: attempts cut by ``x-inferlb-deadline-ms`` or by the
client going away count toward no ejection, breaker, latency baseline or learned speed. Real HTTP:
emulated nodes and the gateway on loopback ports, auth on, a tenant key made through the admin API."""

from __future__ import annotations

from pathlib import Path

import httpx

from inferlb.config.admission import AdmissionSettings
from inferlb.fleet.state import Fleet
from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

ADMIN = "sk-admin-deadline-test"
# A long answer: 400 tokens at 10 ms each is 4 s, far past every deadline below.
LONG = {"model": "m", "messages": [{"role": "user", "content": "tell me a long story"}], "max_tokens": 400}


async def test_deadline_cut_and_abandoned_attempts_leave_every_node_healthy(tmp_path: Path) -> None:
    # Two nodes, round robin: 12 cut requests put 6 on each, more than the 5 consecutive failures
    # that eject a node (OutlierConfig.consecutive_failures), so counting any of them would show.
    async with SimFleet(fast_specs(2, tpot_s=0.01)) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        auth = AdmissionSettings(auth=True, admin_key=ADMIN, redis_url=None)
        settings = settings_for(tmp_path, fleet_for(urls, profile="round-robin", seed=1), admission=auth)
        async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base, timeout=10) as http:
            made = await http.post("/admin/keys", json={"tenant": "t"}, headers={"authorization": f"Bearer {ADMIN}"})
            assert made.status_code == 201, made.text
            key = {"authorization": f"Bearer {made.json()['key']}"}
            fleet: Fleet = app.state.gateway.rt.fleet
            statuses: list[tuple[int, bool, int]] = []
            for ms in (5, 8, 300) * 2:
                for stream in (False, True):
                    r = await http.post("/v1/chat/completions", json={**LONG, "stream": stream},
                                        headers={**key, "x-inferlb-deadline-ms": str(ms)})
                    statuses.append((ms, stream, r.status_code))
                    if r.status_code == 504:   # the client's deadline, not a slow node (engine/outcomes.py)
                        assert r.json()["error"]["code"] == "deadline_exceeded", r.text
                    if stream and r.status_code == 200:   # committed, then cut: an error event, no [DONE]
                        assert "[DONE]" not in r.text and '"error"' in r.text
            assert len(statuses) == 12
            assert all(s in (200, 504) for _, stream, s in statuses if stream), statuses
            assert all(s == 504 for _, stream, s in statuses if not stream), statuses
            # Clients that go away before the end: one times out waiting for a non-streamed answer,
            # one closes its stream after the first chunk; the gateway cancels both attempts.
            async with httpx.AsyncClient(base_url=base, timeout=0.2) as quitter:
                try:
                    await quitter.post("/v1/chat/completions", json=LONG, headers=key)
                except httpx.TimeoutException:
                    pass
                else:
                    raise AssertionError("a 4 s answer arrived within the client's 0.2 s read timeout")
                async with quitter.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True},
                                          headers=key) as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_bytes():
                        break
            for node in sim.nodes.values():   # every cut attempt's connection is closed by the gateway
                await node.wait_until(lambda s: s.live == 0, timeout=5)
            # Cut attempts did reach the nodes: the four 300 ms deadlines and the two quitters at least
            # (a 5 or 8 ms deadline may expire before dispatch on a loaded machine).
            assert sum(node.stats.requests_total for node in sim.nodes.values()) >= 6
            ejected = [ev for ev in fleet.queued_events() if ev.to_state == "ejected"]
            assert ejected == []
            for st in fleet.nodes.values():
                assert st.state == "healthy", (st.cfg.name, st.state, st.reason)
                assert st.failures_total == 0 and st.consecutive_failures == 0   # ejection and breaker counts
                assert st.iv_requests == 0                  # the success-rate / failure-percentage rules
                assert st.ttft_ewma is None and st.tokens_per_s is None   # latency baseline, learned speed
            assert app.state.gateway.first_byte.nodes == {}                # the first-byte budget's samples
