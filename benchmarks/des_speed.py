"""How fast the discrete-event mode replays: N requests over M nodes, with a baseline in the same run.

``python -m benchmarks.des_speed [--nodes 1000] [--requests 1000000] [--rate 3000]
[--profile token-aware] [--workload chat] [--max-seconds 60] [--json OUT]``

The fleet cycles the ``h100`` / ``a100`` / ``l4`` presets; the plan is the workload's (``chat``:
lognormal prompts and answers) at ``--rate`` (3,000 req/s keeps the 1,000-node fleet's engines
about 75 % busy). Printed: the time to make the plan, the simulation's wall and CPU time, µs per
request, events, and the outcome counts and latency of the run; and, as the baseline measured in
the same process just before, the cost of one decision of the same router over a static
1,000-node view list (the floor the real routing core puts under every request). Bounded: arrivals
stop being fed once the simulation has run ``--max-seconds`` of wall time (the run then drains and
the figure covers the requests fed, said so in the output).

``--count`` runs the simulation alone inside ``functools.reduce`` (the plan and the fleet are
made before) and prints its events and end time, for an instruction count of the simulation on a
busy machine: ``valgrind --tool=callgrind --collect-atstart=no --toggle-collect=functools_reduce
--callgrind-out-file=/dev/null python -m benchmarks.des_speed --count --requests 5000``
(``PYTHONHASHSEED=0``), then "Collected" ÷ the requests. Such a short run is mostly its start and
its drain (a 60 s tail of scrapes over every node); ``--count-skip N`` counts the steady state
instead, as a long run is made of it: the first ``N`` requests are simulated before the counted
call, up to the next arrival, and the counted call takes the next ``--requests`` up to the arrival
after them, without the drain.

``--baseline-tree DIR --rounds R`` compares two trees in the same run instead: an exported copy of
another commit (``git archive <commit> inferlb benchmarks | tar -x -C DIR``: each tree runs its own
``benchmarks/des_speed.py``) and this one, each run in a fresh
subprocess with ``PYTHONPATH`` and the working directory set to it, alternating, ``R`` rounds;
printed: CPU µs per request of each run, the min and median per tree, and whether the two trees'
runs agree (events, outcome counts, latency percentiles: the same seed must give the same
simulation).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from inferlb.bench.loadgen.workload import PlannedRequest, load_workload, plan
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeList, RouteRequest
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.presets import preset_spec
from inferlb.simulator.spec import NodeSpec

__all__ = ["fleet", "main", "router_baseline_us"]

_CYCLE = ("h100", "a100", "l4")


def fleet(nodes: int) -> list[NodeSpec]:
    """``nodes`` preset nodes, ``h100`` / ``a100`` / ``l4`` in turn."""
    return [preset_spec(f"{_CYCLE[i % 3]}-{i:04d}", _CYCLE[i % 3]) for i in range(nodes)]


def router_baseline_us(specs: list[NodeSpec], profile: str, decisions: int = 20_000, seed: int = 1) -> float:
    """µs per ``Router.decide`` over the fleet's idle views (what the simulation builds at start)."""
    sim = Simulation(specs, profile=profile, seed=seed)
    views: NodeList = sim.routing_views()
    router = build_router(profile, seed=seed)
    req = RouteRequest("sim-llm", 400, 120)
    t0 = time.perf_counter()
    for _ in range(decisions):
        router.decide(req, views)
    return (time.perf_counter() - t0) / decisions * 1e6


def _bounded(reqs: list[PlannedRequest], wall_s: float, fed: list[int]) -> Iterator[PlannedRequest]:
    deadline = time.perf_counter() + wall_s
    for i, r in enumerate(reqs):
        if i % 10_000 == 0 and time.perf_counter() > deadline:
            return
        fed[0] = i + 1
        yield r


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    return sorted_values[min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1) + 0.5))]


def run(nodes: int, requests: int, rate: float, profile: str, workload: str, max_seconds: float,
        seed: int = 1) -> dict[str, Any]:
    specs = fleet(nodes)
    base = router_baseline_us(specs, profile)
    w = load_workload(workload)
    t0 = time.perf_counter()
    reqs = plan(w, seed=seed, rate=rate, duration_s=requests / rate * 1.2 + 1, max_requests=requests)
    plan_s = time.perf_counter() - t0
    fed = [0]
    sim = Simulation(specs, profile=profile, seed=seed, timeout_s=w.timeout_s)
    c0, t0 = time.process_time(), time.perf_counter()
    res = sim.run(_bounded(reqs, max_seconds, fed))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = fed[0]
    e2e = sorted(x for x in res.e2e if not math.isnan(x))
    ttft = sorted(x for x in res.ttft if not math.isnan(x))
    busy = sum(r.busy_s for r in res.nodes) / max(1e-9, len(res.nodes) * res.end_s)
    return {
        "nodes": nodes, "requests_planned": len(reqs), "requests_simulated": n, "complete": n == len(reqs),
        "profile": profile, "workload": workload, "rate": rate, "virtual_s": round(res.end_s, 1),
        "plan_s": round(plan_s, 2), "sim_wall_s": round(wall, 2), "sim_cpu_s": round(cpu, 2),
        "us_per_request_wall": round(wall / max(1, n) * 1e6, 1), "us_per_request_cpu": round(cpu / max(1, n) * 1e6, 1),
        "events": sim.events, "router_decide_us_baseline": round(base, 1), "engine_busy_share": round(busy, 3),
        "outcomes": res.counts(), "e2e_p50_s": round(_pct(e2e, 0.5), 3), "e2e_p99_s": round(_pct(e2e, 0.99), 3),
        "ttft_p50_s": round(_pct(ttft, 0.5), 3), "ttft_p99_s": round(_pct(ttft, 0.99), 3),
        "extrapolated_1m_wall_s": round(wall / max(1, n) * 1_000_000, 1),
    }


def count(nodes: int, requests: int, rate: float, profile: str, workload: str, seed: int = 1,
          skip: int = 0) -> int:
    """The ``--count`` run (see the module docstring)."""
    import functools

    w = load_workload(workload)
    total = skip + requests + (1 if skip else 0)
    reqs = plan(w, seed=seed, rate=rate, duration_s=total / rate * 1.2 + 1, max_requests=total)
    sim = Simulation(fleet(nodes), profile=profile, seed=seed, timeout_s=w.timeout_s)
    if skip:
        # The steady state: the first ``skip`` requests outside the counted call, up to the next
        # arrival; then ``requests`` more up to the arrival after them, with no drain.
        sim.run(reqs[:skip], until=reqs[skip].t)
        e0 = sim.events
        res = functools.reduce(lambda acc, _: sim.run(reqs[skip:skip + requests], until=reqs[skip + requests].t),
                               [0], None)
        assert res is not None
        print(f"events {sim.events - e0} (of {sim.events}) end {res.end_s}")
        return 0
    res = functools.reduce(lambda acc, _: sim.run(reqs), [0], None)
    assert res is not None
    print(f"events {sim.events} end {res.end_s}")
    return 0


_SAME = ("requests_simulated", "events", "outcomes", "e2e_p50_s", "e2e_p99_s", "ttft_p50_s", "ttft_p99_s")


def compare(a: argparse.Namespace) -> int:
    """Alternate runs of the baseline tree and this one (see the module docstring)."""
    this = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the tree holding benchmarks/
    trees = {"baseline": os.path.abspath(a.baseline_tree), "this": this}
    args = ["--nodes", str(a.nodes), "--requests", str(a.requests), "--rate", str(a.rate), "--profile", a.profile,
            "--workload", a.workload, "--max-seconds", str(a.max_seconds), "--seed", str(a.seed)]
    cpu: dict[str, list[float]] = {k: [] for k in trees}
    seen: dict[str, list[Any]] = {k: [] for k in trees}
    load0 = os.getloadavg()
    for r in range(a.rounds):
        for label, tree in trees.items():
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "out.json")
                subprocess.run([sys.executable, "-m", "benchmarks.des_speed", *args, "--json", path],
                               env={**os.environ, "PYTHONPATH": tree}, cwd=tree,   # -m imports from the cwd first
                               capture_output=True, check=True, timeout=600)
                with open(path) as fh:
                    res = json.load(fh)
            cpu[label].append(res["us_per_request_cpu"])
            seen[label].append([res[k] for k in _SAME])
            print(f"round {r + 1} {label:8} cpu µs/request {res['us_per_request_cpu']:7.1f}  wall "
                  f"{res['us_per_request_wall']:7.1f}  requests {res['requests_simulated']}", flush=True)
    load1 = os.getloadavg()
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f} "
          f"{load1[2]:.2f}")
    for label, v in cpu.items():
        print(f"{label:8} cpu µs/request: min {min(v):.1f}, median {statistics.median(v):.1f}")
    same = all(x == seen["baseline"][0] for runs in seen.values() for x in runs)
    print("same simulation in both trees (events, outcomes, latency percentiles):", "yes" if same else "NO")
    return 0 if same else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float, default=3000.0)
    ap.add_argument("--profile", default="token-aware")
    ap.add_argument("--workload", default="chat")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="stop feeding arrivals after this wall time")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--baseline-tree", default=None, help="compare with another tree's inferlb/ (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="with --baseline-tree: runs per tree")
    ap.add_argument("--count", action="store_true", help="the simulation alone in functools.reduce (see above)")
    ap.add_argument("--count-skip", type=int, default=0,
                    help="with --count: simulate this many requests first, outside the count (see above)")
    a = ap.parse_args(argv)
    if a.baseline_tree:
        return compare(a)
    if a.count:
        return count(a.nodes, a.requests, a.rate, a.profile, a.workload, a.seed, a.count_skip)
    out = run(a.nodes, a.requests, a.rate, a.profile, a.workload, a.max_seconds, a.seed)
    for k, v in out.items():
        print(f"{k:28} {v}")
    if not out["complete"]:
        print(f"NOTE: stopped feeding after {a.max_seconds:g} s of wall time: {out['requests_simulated']} of "
              f"{out['requests_planned']} requests simulated")
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
