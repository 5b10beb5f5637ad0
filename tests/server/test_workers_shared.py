"""``inferlb serve --workers 2`` answers as one gateway for what used to be per worker: one
``/metrics`` for the port (server/worker_metrics.py) and one learned state: the latency predictor
(learned/share.py), the output-length predictor (learned/share_length.py) and the reward bandit
(learned/share_reward.py), between real processes, with no Redis server (the local coordinator).

Checked in one start-up of the supervisor:

1. requests on fresh connections reach both workers; ``/metrics`` over the port, asked several
   times (whichever worker answers), counts exactly the requests sent, and lists both workers up;
2. the predictor every worker runs has learned every answer, those the other worker served
   included (one trainer, snapshots installed by the other); so has every worker's output-length
   predictor, and every worker's reward bandit has learned the outcome of every decision an arm
   made, on either worker (``inferlb_routing_reward_pulls_total``, summed over the workers);
3. a worker SIGKILLed: every scrape meanwhile is a 200 (the dead one reported down, not an error),
   the replacement comes back up in ``/metrics`` and, having seen no request, starts from the
   cluster's newest predictor, output-length predictor and reward bandit.

Every wait is a poll for a condition with a bound (a hang guard), never a sleep for time to pass.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import NodeSpec
from tests.server.test_workers import ADMIN, Gateway, _children, _started_in, _until, supervisor


def _fleet_file(tmp: Path, urls: dict[str, str]) -> Path:
    fleet = {
        "models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8}],
        "nodes": [{"name": n, "url": u, "models": ["m"], "labels": {"gpu": "l4"}} for n, u in urls.items()],
        "routing": {"profile": "learned", "seed": 1,
                    "predictor": {"min_samples": 10, "retrain_interval_s": 0, "train_interval_s": 0.1},
                    "reward": {"enabled": True, "min_pulls": 2}},
        "timeouts": {"connect_s": 2.0, "first_token_s": 10.0, "idle_s": 10.0, "total_s": 60.0},
        "health": {"interval_s": 30},
    }
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    return path


async def _scrape(gw: Gateway) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``/metrics`` on a fresh connection (either worker answers): sample name -> labels -> value."""
    async with httpx.AsyncClient(timeout=10, headers={"authorization": f"Bearer {ADMIN}"}) as c:
        r = await c.get(gw.base + "/metrics")
    assert r.status_code == 200, r.text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _requests(m: dict[str, dict[tuple[tuple[str, str], ...], float]]) -> float:
    return sum(m.get("inferlb_requests_total", {}).values())


def _per_worker(m: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str) -> dict[str, float]:
    return {dict(k)["worker"]: v for k, v in m.get(name, {}).items()}


async def test_metrics_and_the_learned_state_are_one_for_the_port(tmp_path: Path) -> None:
    specs = [NodeSpec(name=f"n{i}", models=["m"], base_ttft_s=0.002 * (i + 1), tpot_s=0.001 * (i + 1),
                      max_concurrency=64) for i in range(2)]
    async with SimFleet(specs) as sim:
        fleet = _fleet_file(tmp_path, {n: node.url for n, node in sim.nodes.items()})
        async with supervisor(tmp_path, fleet) as gw:
            journal = tmp_path / "journal"
            sent = 0
            for _ in range(10):           # waves of 10 on fresh connections, until both workers took some
                statuses = await asyncio.gather(*(gw.chat() for _ in range(10)))
                assert statuses == [200] * 10, statuses
                sent += 10
                if sent >= 20 and all(n > 0 for n in _started_in(journal).values()):
                    break
            else:
                raise AssertionError(f"the requests never reached both workers: {_started_in(journal)}")

            async def counted() -> bool:
                return _requests(await _scrape(gw)) == sent

            await _until(f"/metrics counting the {sent} requests", counted, 30.0)
            whole = 0
            for _ in range(30):           # whichever worker answers, the same sum
                m = await _scrape(gw)
                up = _per_worker(m, "inferlb_workers_up")
                if up == {"w0": 1.0, "w1": 1.0}:
                    assert _requests(m) == sent, m.get("inferlb_requests_total")
                    whole += 1
                    if whole == 6:
                        break
                else:    # a sibling slower than the scrape's 2 s on a loaded machine: reported, left out
                    assert sorted(up.values()) == [0.0, 1.0] and _requests(m) < sent, (up, _requests(m))
            assert whole == 6, whole

            async def both_learned_all() -> bool:
                learned = _per_worker(await _scrape(gw), "inferlb_routing_predictor_learned")
                return learned == {"w0": float(sent), "w1": float(sent)}

            await _until(f"both workers' predictor learned all {sent} answers", both_learned_all, 30.0)
            m = await _scrape(gw)
            assert len(set(_per_worker(m, "inferlb_routing_predictor_version").values())) == 1
            assert _per_worker(m, "inferlb_routing_predictor_state") is not None
            # Now that both run an active predictor, the reward bandit's arms decide: one more wave.
            statuses = await asyncio.gather(*(gw.chat() for _ in range(20)))
            assert statuses == [200] * 20, statuses
            sent += 20
            decided: list[float] = []

            async def both_share_lengths_and_rewards() -> bool:
                m = await _scrape(gw)
                lengths = _per_worker(m, "inferlb_routing_output_length_learned")
                rewards = _per_worker(m, "inferlb_routing_reward_learned")
                pulls = sum(m.get("inferlb_routing_reward_pulls_total", {}).values())
                decided[:] = [pulls]
                return (lengths == {"w0": float(sent), "w1": float(sent)} and pulls > 0
                        and rewards == {"w0": pulls, "w1": pulls})

            await _until(f"both workers' output-length predictor learned all {sent} answers and their reward "
                         "bandit every arm's outcome", both_share_lengths_and_rewards, 30.0)
            outcomes = decided[0]

            victim = sorted(_children(gw.proc.pid))[0]
            os.kill(victim, signal.SIGKILL)
            seen_down = False

            async def replaced_and_up() -> bool:
                nonlocal seen_down
                try:
                    m = await _scrape(gw)    # a 200 every time it answers, whoever is gone
                except httpx.TransportError:
                    # a connection the kernel queued at the dead worker's socket is reset
                    # (docs/replicas.md, "A worker that dies"): not an answer of /metrics
                    return False
                up = _per_worker(m, "inferlb_workers_up")
                seen_down = seen_down or 0.0 in up.values()
                kids = _children(gw.proc.pid)
                return victim not in kids and len(kids) == 2 and up == {"w0": 1.0, "w1": 1.0}

            await _until("the killed worker replaced and back in /metrics", replaced_and_up, 60.0)
            assert seen_down      # while it was being replaced, the survivor reported it down (it takes seconds)

            async def replacement_has_the_model() -> bool:
                learned = _per_worker(await _scrape(gw), "inferlb_routing_predictor_learned")
                return set(learned.values()) == {float(sent)}

            await _until("the replacement runs the cluster's predictor", replacement_has_the_model, 30.0)

            async def replacement_has_lengths_and_rewards() -> bool:
                m = await _scrape(gw)
                return (set(_per_worker(m, "inferlb_routing_output_length_learned").values()) == {float(sent)}
                        and set(_per_worker(m, "inferlb_routing_reward_learned").values()) == {outcomes})

            await _until("the replacement runs the cluster's output-length predictor and reward bandit",
                         replacement_has_lengths_and_rewards, 30.0)
            # the dead worker's counts went with it: the sum covers the living workers only
            assert _requests(await _scrape(gw)) <= sent
