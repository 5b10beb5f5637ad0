"""The discrete-event mode against the real-time simulator on one small case.

Same nodes (two continuous-batching engines, one 2.5× faster), same seeded plan, same routing
profile (token-aware, seed 1) and the gateway's default admission policy. Real time: the nodes are
:class:`~inferlb.simulator.emulator.SimFleet` HTTP servers driven by their step loop, the gateway is the real
app (the request process, routing over its fleet snapshots, health scrapes), the client is
``run_plan``, the load generator of ``bench run``. Virtual time: :class:`Simulation`.

Tolerances, and why. Real time adds what virtual time leaves out: the gateway's own work and two
HTTP hops per request (milliseconds each, tens of milliseconds on a loaded 2-core machine), and
event-loop lateness of the node's step loop (a late step runs late, the rest of its schedule
with it). Routing reads in-flight counts at slightly different instants in the two runs, so a few
requests land on the other node, which moves their latency by the node's speed ratio. So the test
compares distributions, not requests: mean and median e2e no more than 25 % + 0.1 s above the
real-time figure (a request here takes 0.3–1.5 s); mean and median TTFT no more than 50 % + 0.1 s
above (TTFT is tens of milliseconds, where the gateway's overhead is the largest share); the fast
node's share of requests above one half in both, and within 0.2 of each other when the real-time
run kept the DES's pace (a real-time run stretched by load routes on other in-flight counts).
The latency checks are one-sided because a loaded machine only ever makes the real-time side
slower; the other side, the node model's own timing, is held exactly by
tests/simulator/des/test_engine.py. The real-time run is bounded by the plan (~8 s of arrivals)
and the workload's timeout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlb.bench.des_admission import GatewayAdmission
from inferlb.bench.des_report import des_summary
from inferlb.bench.loadgen.results import summarize
from inferlb.bench.loadgen.runner import run_plan
from inferlb.bench.loadgen.stack import gateway_fleet
from inferlb.bench.loadgen.workload import Workload, plan
from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import BatchSpec, NodeSpec
from tests.support import running_gateway, settings_for

WORKLOAD = Workload(model="m", duration_s=8.0, arrival={"kind": "poisson", "rate": 6},
                    prompt_tokens={"dist": "lognormal", "median": 100, "sigma": 0.5, "max": 800},
                    output_tokens={"dist": "lognormal", "median": 15, "sigma": 0.5, "min": 2, "max": 40},
                    stream=1.0, slo={"ttft_s": 30.0, "e2e_s": 30.0}, timeout_s=30.0)


def _specs() -> list[NodeSpec]:
    def node(name: str, step: float) -> NodeSpec:
        return NodeSpec(name=name, models=["m"], max_concurrency=64, batching=BatchSpec(
            kv_tokens=65_536, step_base_s=step, step_per_seq_s=0.0005, prefill_s_per_token=0.0001))
    return [node("fast", 0.02), node("slow", 0.05)]


async def test_des_agrees_with_the_real_time_simulator(tmp_path: Path) -> None:
    reqs = plan(WORKLOAD, seed=2)
    assert 30 <= len(reqs) <= 80
    specs = _specs()
    async with SimFleet(specs) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        fleet = fleet_from_mapping(gateway_fleet(specs, urls, "token-aware", WORKLOAD, 1))
        async with running_gateway(settings_for(tmp_path, fleet)) as (base, _app):
            data = await run_plan(reqs, WORKLOAD, [base], label="rt", nodes=urls, sample_s=0.5)
    rt = summarize(data, WORKLOAD)
    res = Simulation(specs, profile="token-aware", seed=1, model="m", admission=GatewayAdmission(),
                     timeout_s=WORKLOAD.timeout_s).run(reqs)
    des = des_summary(res, WORKLOAD, duration_s=WORKLOAD.duration_s)
    assert rt["ok"] == rt["sent"] == len(reqs), rt["errors"]
    assert des["outcomes"]["ok"] == len(reqs)
    report = {k: (rt[k], des[k]) for k in ("e2e_s", "ttft_s", "share")}
    for key, rel in (("e2e_s", 0.25), ("ttft_s", 0.5)):
        for stat in ("mean", "p50"):
            # One-sided: real time adds the gateway, two HTTP hops and step-loop lateness, which a
            # loaded machine stretches without bound, so only "the DES is not slower" is load-safe;
            # the lower side (the node model itself) is held exactly in virtual time by
            # tests/simulator/des/test_engine.py, side by side with the emulator's engine.
            assert des[key][stat] <= rt[key][stat] * (1 + rel) + 0.1, (key, stat, report)
            assert des[key][stat] > 0, (key, stat, report)
    # Both send the fast node most of the work, whatever the machine's load.
    assert des["share"]["fast"] > 0.5, report
    assert rt["share"]["fast"] > 0.5, report
    # The shares agree within 0.2 when the real-time run kept the DES's pace (its mean e2e at most
    # 25 % + 0.1 s above the DES's, the mirror of the latency tolerance above): routing reads
    # in-flight counts and learned speeds, so a real-time run stretched by a loaded machine (at a
    # load average of 13 on 2 cores one missed by more than 0.2) routes on other numbers.
    kept_pace = rt["e2e_s"]["mean"] <= des["e2e_s"]["mean"] * 1.25 + 0.1
    if kept_pace:
        assert des["share"]["fast"] == pytest.approx(rt["share"]["fast"], abs=0.2), report
