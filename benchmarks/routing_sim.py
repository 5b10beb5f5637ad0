"""Routing quality in virtual time: the real routing core and fleet state over the emulator's engine.

``python -m benchmarks.routing_sim [--nodes 64] [--rate R] [--duration 60] [--seed 1]
[--targets token-aware,token-aware:k=0,round-robin]``

Each target routes the same seeded plan (the ``heavy-tail`` workload) over the same fleet: a node
is a :class:`~inferlb.simulator.batching.BatchCore` (continuous batching over a paged KV cache,
presets ``h100`` / ``a100`` / ``l4`` in turn, so speeds and KV sizes differ), the gateway's view of
it a :class:`~inferlb.fleet.state.Fleet` fed as in production: in-flight counts on dispatch and
completion, learned speed and latency from each answer (``report_success``), and the nodes'
waiting / KV-use metrics every ``--scrape-s`` seconds. No HTTP, no wall clock: a run is
deterministic and takes seconds, so the cost of sampling (``token-aware`` samples k = 16
candidates on fleets larger than that; ``:k=N`` sets another k, ``:k=0`` considers every node) is
measured on fleets of hundreds of nodes, where the real-time ``inferlb bench compare`` cannot go.

Printed per target: completed requests, TTFT (streamed requests) and e2e percentiles (virtual seconds), the share of
requests that met the workload's SLO, the busiest node's share of requests, the share of decisions
made over a sample, and the mean wall time of one routing decision (views + decide + the audit
copy) on this machine.
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from dataclasses import dataclass
from typing import Any

from inferlb.bench.loadgen.workload import load_workload, plan
from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.health.isolation import observe
from inferlb.node_types import Sample
from inferlb.routing.profiles import build_router
from inferlb.routing.types import RouteRequest
from inferlb.simulator.batching import BatchCore, Seq, SeqState
from inferlb.simulator.presets import PRESETS
from inferlb.types import ManualClock

__all__ = ["SimResult", "main", "simulate"]

_PRESET_CYCLE = ("h100", "a100", "l4")
_MODEL = "sim-llm"


@dataclass
class SimResult:
    target: str
    requests: int
    completed: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    slo_met: float | None
    decision_us_mean: float
    busiest_share: float
    sampled_share: float          # decisions made over a sample of the nodes

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _target(spec: str) -> tuple[str, int | None]:
    """``profile`` or ``profile:k=N``."""
    profile, _, opt = spec.partition(":")
    if not opt:
        return profile, None
    key, _, val = opt.partition("=")
    if key != "k" or not val.isdigit():
        raise SystemExit(f"bad target {spec!r}: use PROFILE or PROFILE:k=N")
    return profile, int(val)


def simulate(target: str, *, nodes: int, rate: float, duration_s: float, seed: int,
             scrape_s: float = 5.0) -> SimResult:
    """Route one seeded heavy-tail plan over ``nodes`` simulated nodes with ``target``."""
    profile, k = _target(target)
    presets = [PRESETS[_PRESET_CYCLE[i % len(_PRESET_CYCLE)]] for i in range(nodes)]
    names = [f"{_PRESET_CYCLE[i % len(_PRESET_CYCLE)]}-{i:04d}" for i in range(nodes)]
    cfg = fleet_from_mapping({
        "models": [{"name": _MODEL}],
        "nodes": [{"name": n, "url": f"http://127.0.0.1:{20000 + i}", "models": [_MODEL],
                   "capacity_tokens": p.kv_tokens, "max_concurrency": p.max_num_seqs}
                  for i, (n, p) in enumerate(zip(names, presets, strict=True))],
    })
    clock = ManualClock()
    fleet = Fleet(cfg, clock)
    router = build_router(profile, seed=seed, sample=k)
    cores = [BatchCore(p.batch_spec()) for p in presets]
    index = {n: i for i, n in enumerate(names)}
    workload = load_workload("heavy-tail")
    reqs = plan(workload, seed=seed, rate=rate, duration_s=duration_s)
    wake: list[tuple[float, int]] = []
    inflight: dict[int, tuple[int, Seq, int, float, bool]] = {}   # id(seq) → (node, seq, tokens, at, stream)
    ttft: list[float] = []
    e2e: list[float] = []
    slo_ok = 0
    served = [0] * nodes
    decide_ns = 0
    sampled = 0
    start = clock.monotonic()
    next_scrape = start

    def schedule(i: int) -> None:
        at = cores[i].next_event_at()
        if at is not None:
            heapq.heappush(wake, (at, i))

    def run_nodes_until(t: float) -> None:
        nonlocal slo_ok
        while wake and wake[0][0] <= t:
            at, i = heapq.heappop(wake)
            if cores[i].next_event_at() != at:
                continue   # a stale wake-up
            clock.advance(max(0.0, start + at - clock.monotonic()))
            report = cores[i].advance(at)
            for seq in report.progressed:
                entry = inflight.get(id(seq))
                if entry is None or seq.state is not SeqState.FINISHED:
                    continue
                node, _, tokens, arrived, stream = entry
                del inflight[id(seq)]
                first = (seq.first_token_at or at) - arrived
                total = (seq.finished_at or at) - arrived
                if stream:
                    ttft.append(first)
                e2e.append(total)
                slo = workload.slo   # TTFT counts for streams only
                slo_ok += (not stream or first <= slo.ttft_s) and total <= slo.e2e_s
                fleet.report_success(names[node], stream=stream, completion_tokens=seq.generated,
                                     ttfb_s=first if stream else total, e2e_s=total)
                fleet.release(names[node], tokens)
            schedule(i)

    for r in reqs:
        run_nodes_until(r.t)
        clock.advance(max(0.0, start + r.t - clock.monotonic()))
        while clock.monotonic() >= next_scrape:
            now = clock.monotonic()
            observe(fleet, [Sample(n, "metrics", True, now, 0.0,
                                   values={"waiting": len(c.waiting), "kv_usage": c.kv_usage}).to_json()
                            for n, c in zip(names, cores, strict=True)])
            next_scrape += scrape_s
        t0 = time.perf_counter_ns()
        d = router.decide(RouteRequest(_MODEL, r.prompt_tokens, r.output_tokens), fleet.views())
        d.to_json()
        decide_ns += time.perf_counter_ns() - t0
        sampled += d.sampled is not None
        if d.pick is None:
            continue
        i = index[d.pick]
        tokens = r.prompt_tokens + r.output_tokens
        fleet.acquire(d.pick, tokens)
        served[i] += 1
        seq = cores[i].submit(r.prompt_tokens, r.output_tokens, r.t)
        inflight[id(seq)] = (i, seq, tokens, r.t, r.stream)
        schedule(i)
    run_nodes_until(duration_s * 10)   # drain: every admitted request finishes
    return SimResult(target=target, requests=len(reqs), completed=len(e2e), ttft_p50_s=_pct(ttft, 0.5),
                     ttft_p99_s=_pct(ttft, 0.99), e2e_p50_s=_pct(e2e, 0.5), e2e_p99_s=_pct(e2e, 0.99),
                     slo_met=slo_ok / len(e2e) if e2e else None,
                     decision_us_mean=decide_ns / max(1, len(reqs)) / 1e3,
                     busiest_share=max(served) / max(1, sum(served)), sampled_share=sampled / max(1, len(reqs)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--rate", type=float, default=None, help="requests/s (default: 1.2 per node)")
    ap.add_argument("--duration", type=float, default=60.0, help="virtual seconds of arrivals")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scrape-s", type=float, default=5.0)
    ap.add_argument("--targets", default="token-aware,token-aware:k=0,round-robin")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    rate = a.rate if a.rate is not None else 1.2 * a.nodes
    print(f"{a.nodes} nodes, heavy-tail at {rate:g} req/s for {a.duration:g} s (virtual), seed {a.seed}")
    print(f"{'target':24} {'done':>6} {'TTFT p50':>9} {'TTFT p99':>9} {'e2e p50':>8} {'e2e p99':>8} "
          f"{'SLO met':>8} {'busiest':>8} {'sampled':>8} {'µs/decision':>12}")
    results = []
    for target in a.targets.split(","):
        r = simulate(target, nodes=a.nodes, rate=rate, duration_s=a.duration, seed=a.seed, scrape_s=a.scrape_s)
        results.append(r)

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"

        print(f"{r.target:24} {r.completed:6d} {f(r.ttft_p50_s):>9} {f(r.ttft_p99_s):>9} {f(r.e2e_p50_s):>8} "
              f"{f(r.e2e_p99_s):>8} {f(r.slo_met):>8} {r.busiest_share:8.1%} {r.sampled_share:8.0%} "
              f"{r.decision_us_mean:12.1f}", flush=True)
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump({"nodes": a.nodes, "rate": rate, "duration_s": a.duration, "seed": a.seed,
                       "results": [r.to_json() for r in results]}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
