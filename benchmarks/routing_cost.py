"""CPU time of one routing decision at fleet scale, this tree against a baseline tree in the same run.

``python -m benchmarks.routing_cost [--sizes 10,100,1000] [--profiles token-aware] [--iters 20000]
[--rounds 3] [--baseline-tree DIR] [--gc on|off]``

The workload is the peer bench's routing_bench.py (docs/benchmarks.md, "Routing decision cost at
fleet scale"): every node serves
``m0``, a third also ``m1``, 5 % ejected, capacities 16k-128k tokens, random in-flight counts and
learned speeds; the request is 400 + 256 tokens for ``m0``. Two measurements per (profile, size):

* ``decide``: ``Router.decide`` over prebuilt views (8 snapshots cycled);
* ``select``: what ``routing/select`` does per request apart from the request scope:
  ``Fleet.views()`` + ``decide`` + ``Decision.to_json()``, with one node's load changed before
  each decision (``Fleet.acquire`` / ``release``).

Each decision is timed with ``time.thread_time_ns`` (CPU time of this thread: time the process
spends descheduled on a busy machine is left out) and, for reference, ``perf_counter_ns``.
A profile named ``learned+active`` is ``learned`` with its predictor usable from the first
decision (``routing.predictor.min_samples`` 0: every decision predicts its 16 candidates, runs the
bandit and explains itself); plain ``learned`` is what a fresh gateway runs until the predictor
has learned: the ``token-aware`` fallback plus the pick's prediction.
Percentiles in µs.

``--count KIND --decisions N`` (KIND ``select``, ``decide`` or ``fleet``) makes N decisions of
one profile at ``--sizes`` nodes inside ``functools.reduce`` and prints nothing else, for an
instruction count of that loop alone (the setup and warm-up are left out) on a busy machine:
``valgrind --tool=callgrind --collect-atstart=no --toggle-collect=functools_reduce
--callgrind-out-file=/dev/null python -m benchmarks.routing_cost --count select --decisions 200
--profiles round-robin --sizes 1000`` (``PYTHONHASHSEED=0``), then "Collected" ÷ N. ``select``:
a fleet of that workload, one node's load changed before each decision (as above), views +
decide + audit copy; ``decide``: 8 fresh snapshots of plain lists, cycled; ``fleet``: the load
change and ``Fleet.views()`` alone (what ``select`` costs outside routing).

With ``--baseline-tree DIR`` (an exported copy of another commit's tree, e.g.
``git archive <commit> inferlb | tar -x -C DIR``) each round runs the baseline and this tree in
fresh subprocesses one after the other (``PYTHONPATH`` set to each), so both see the same load;
the figures are pooled over the rounds. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "measure"]

_HERE = Path(__file__).resolve()
_TREE = _HERE.parents[1]


def _pct(vals: Sequence[float], q: float) -> float:
    k = (len(vals) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def _stats(ns: list[int]) -> dict[str, float]:
    s = sorted(ns)
    return {"n": len(s), "p50": _pct(s, 0.5) / 1e3, "p90": _pct(s, 0.9) / 1e3, "p99": _pct(s, 0.99) / 1e3,
            "max": s[-1] / 1e3, "mean": sum(s) / len(s) / 1e3}


def _random_views(rng: random.Random, n: int) -> list[Any]:
    """``n`` random NodeViews (5 % unhealthy) for the ``decide`` loops: no view shared with another call."""
    from inferlb.routing.types import NodeView

    out = []
    for i in range(n):
        cap = rng.choice([16384, 32768, 65536, 131072])
        healthy = rng.random() >= 0.05
        out.append(NodeView(
            name=f"node{i:04d}", models=frozenset({"m0", "m1"} if i % 3 == 0 else {"m0"}),
            capacity_tokens=cap, max_concurrency=64, weight=rng.choice([1.0, 2.0]),
            inflight_requests=rng.randint(0, 40), inflight_tokens=rng.randint(0, cap // 2),
            waiting=rng.choice([None, rng.randint(0, 8)]), kv_usage=rng.choice([None, rng.random()]),
            healthy=healthy, unhealthy_reason=None if healthy else "ejected for 12.0s more",
            tokens_per_s=rng.choice([None, rng.uniform(20, 120)])))
    return out


def _loaded_fleet(rng: random.Random, n: int, profile: str) -> Any:
    """A Fleet of ``n`` nodes under ``profile`` with random in-flight load, 5 % ejected (one rng order)."""
    from inferlb.config.settings import fleet_from_mapping
    from inferlb.fleet.state import Fleet
    from inferlb.types import SystemClock

    raw = {"models": [{"name": "m0"}, {"name": "m1"}],
           "nodes": [{"name": f"node{i:04d}", "url": f"http://10.0.{i // 250}.{i % 250 + 1}:8000",
                      "models": ["m0", "m1"] if i % 3 == 0 else ["m0"],
                      "capacity_tokens": rng.choice([16384, 32768, 65536, 131072])} for i in range(n)],
           "routing": {"profile": profile}}
    fleet = Fleet(fleet_from_mapping(raw), SystemClock())
    for st in fleet.nodes.values():
        st.inflight_requests = rng.randint(0, 40)
        st.inflight_tokens = rng.randint(0, st.cfg.capacity_tokens // 2)
        st.tokens_per_s = rng.choice([None, rng.uniform(20, 120)])
        if rng.random() < 0.05:
            st.state, st.reason, st.ejected_until = "ejected", "5 consecutive failures", time.monotonic() + 1e6
    return fleet


def measure(profile: str, n: int, iters: int, seed: int = 1) -> dict[str, Any]:
    """Per-decision CPU and wall nanoseconds for ``decide`` and ``select`` (see the module docstring)."""
    from inferlb.routing.profiles import build_router
    from inferlb.routing.types import RouteRequest

    rng = random.Random(seed)

    req = RouteRequest(model="m0", prompt_tokens=400, output_tokens=256, priority="standard")
    cpu = time.thread_time_ns
    wall = time.perf_counter_ns
    name, active = (profile[:-len("+active")], True) if profile.endswith("+active") else (profile, False)

    def make_router() -> Any:
        return build_router(name, seed=seed, predictor={"min_samples": 0} if active else None)

    router = make_router()
    snaps = [_random_views(rng, n) for _ in range(8)]
    for i in range(min(500, iters)):
        router.decide(req, snaps[i % 8])
    d_cpu, d_wall = [], []
    for i in range(iters):
        views = snaps[i % 8]
        w0, c0 = wall(), cpu()
        router.decide(req, views)
        c1, w1 = cpu(), wall()
        d_cpu.append(c1 - c0)
        d_wall.append(w1 - w0)

    fleet = _loaded_fleet(rng, n, name)
    names = list(fleet.nodes)
    router = make_router()
    for _ in range(min(500, iters)):
        router.decide(req, fleet.views()).to_json()
    s_cpu, s_wall = [], []
    for i in range(iters):
        node = names[rng.randrange(len(names))]
        fleet.acquire(node, 656)
        if i % 2:
            fleet.release(node, 656)
        w0, c0 = wall(), cpu()
        router.decide(req, fleet.views()).to_json()
        c1, w1 = cpu(), wall()
        s_cpu.append(c1 - c0)
        s_wall.append(w1 - w0)
    return {"decide_cpu": d_cpu, "decide_wall": d_wall, "select_cpu": s_cpu, "select_wall": s_wall}


def count(profile: str, n: int, decisions: int, kind: str, seed: int = 1) -> None:
    """The ``--count`` loop (see the module docstring)."""
    import functools

    from inferlb.routing.profiles import build_router
    from inferlb.routing.types import RouteRequest

    rng = random.Random(seed)
    name, active = (profile[:-len("+active")], True) if profile.endswith("+active") else (profile, False)
    fleet = _loaded_fleet(rng, n, name)
    names = list(fleet.nodes)
    router = build_router(name, seed=seed, predictor={"min_samples": 0} if active else None)
    req = RouteRequest(model="m0", prompt_tokens=400, output_tokens=256, priority="standard")
    for _ in range(300):
        router.decide(req, fleet.views()).to_json()
    steps = [names[rng.randrange(len(names))] for _ in range(decisions)]
    snaps: list[list[Any]] = []
    if kind == "decide":
        vr = random.Random(seed)
        for _ in range(8):
            snaps.append(_random_views(vr, n))
        for j in range(50):
            router.decide(req, snaps[j % 8])

    def step(acc: None, i: int) -> None:
        if kind == "decide":
            router.decide(req, snaps[i % 8])
            return acc
        node = steps[i]
        fleet.acquire(node, 656)
        if i % 2:
            fleet.release(node, 656)
        if kind == "fleet":
            fleet.views()
        else:
            router.decide(req, fleet.views()).to_json()
        return acc

    functools.reduce(step, range(decisions), None)


def _worker(a: argparse.Namespace) -> int:
    if a.gc == "off":
        gc.disable()
    out: dict[str, Any] = {}
    for profile in a.profiles.split(","):
        for n in (int(x) for x in a.sizes.split(",")):
            out[f"{profile}/{n}"] = measure(profile, n, a.iters, a.seed)
    json.dump(out, sys.stdout)
    return 0


def _run_tree(tree: Path, a: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(_HERE), "--worker", "--sizes", a.sizes, "--profiles", a.profiles,
           "--iters", str(a.iters), "--seed", str(a.seed), "--gc", a.gc]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=600)
    result: dict[str, Any] = json.loads(r.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--profiles", default="token-aware")
    ap.add_argument("--iters", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gc", choices=("on", "off"), default="on")
    ap.add_argument("--baseline-tree", default=None, help="a directory holding another tree's inferlb/")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--count", choices=("select", "decide", "fleet"), default=None,
                    help="run --decisions decisions for an instruction count (see above)")
    ap.add_argument("--decisions", type=int, default=200)
    a = ap.parse_args(argv)
    if a.worker:
        return _worker(a)
    if a.count:
        count(a.profiles.split(",")[0], int(a.sizes.split(",")[0]), a.decisions, a.count, a.seed)
        return 0
    trees = [("this", _TREE)]
    if a.baseline_tree:
        trees.insert(0, ("baseline", Path(a.baseline_tree).resolve()))
    load0 = os.getloadavg()
    pooled: dict[tuple[str, str, str], list[int]] = {}
    for _ in range(a.rounds):
        for label, tree in trees:
            for cell, series in _run_tree(tree, a).items():
                for kind, ns in series.items():
                    pooled.setdefault((label, cell, kind), []).extend(ns)
    load1 = os.getloadavg()
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
          f"after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; gc {a.gc}; {a.rounds} round(s) × {a.iters}")
    print(f"{'tree':9} {'profile/nodes':18} {'kind':12} {'p50 µs':>8} {'p90 µs':>8} {'p99 µs':>8} "
          f"{'max µs':>9} {'mean µs':>8}")
    for (label, cell, kind), ns in sorted(pooled.items(), key=lambda x: (x[0][1], x[0][2], x[0][0])):
        s = _stats(ns)
        print(f"{label:9} {cell:18} {kind:12} {s['p50']:8.1f} {s['p90']:8.1f} {s['p99']:8.1f} "
              f"{s['max']:9.1f} {s['mean']:8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
