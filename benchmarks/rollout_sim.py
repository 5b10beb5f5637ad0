"""Canary rollouts in virtual time: the real version split, routing core, per-version window and
``rollout.bpmn`` on SpiffWorkflow, over the emulator's continuous-batching engine.

``python -m benchmarks.rollout_sim [--rate 50] [--max-s 3600] [--seed 1]
[--scenarios healthy,errors,latency2x] [--json OUT]``

Each scenario runs the same seeded plan (Poisson arrivals, lognormal prompts of median 400
tokens and answers of median 64, all streamed; users drawn from a pool of 2,000, so the split is
sticky) over 16 ``a100``-like nodes: ``v1`` on eight, ``v2`` on the other
eight. The first ``--warmup-s`` seconds go to v1 only; they also set the model's SLO: e2e at most
the p95 of v1's requests in that warm-up (so a healthy version meets it about 95 % of the time),
TTFT at most its p95 there. Then a rollout from v1 to v2 starts with the default steps
(1 → 5 → 25 → 50 → 100 %) and criteria, and a round of ``rollout.bpmn`` runs every
``--interval-s`` until it completes or rolls back. Each served attempt carries its node's first-
token and end times (no gateway queue here: from the arrival), which the guard's latency tests
(``ttft``, ``tpot``) compare between the versions.

* ``healthy``: v2 is the same engine;
* ``errors``: 5 % of v2's attempts answer 503 (retryable: the gateway's rule tries another v2
  node, then a v1 node, as ``routing/select`` does);
* ``latency2x``: v2's engine steps and prefill take twice as long.

Printed per scenario: the outcome, the time from the rollout's start to its last decision
(virtual seconds), the step timeline, the share of requests v2 served between start and
decision, the requests that met one of v2's faults, the requests no attempt could serve, and the
wall time of the run on this machine, and the wall time of one ``rollout.bpmn`` round on
SpiffWorkflow (p50 / p99). Healthy is the baseline of the same run. No HTTP; apart from those two
wall times, no wall clock in the figures: a run is deterministic.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any

from inferlb.app import default_processes_dir
from inferlb.bench.loadgen.workload import Workload, plan
from inferlb.config.rollout import RolloutConfig, RolloutSpec
from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.health.isolation import observe
from inferlb.node_types import Sample
from inferlb.rollout.manager import RolloutManager
from inferlb.rollout.window import VersionWindow
from inferlb.routing.profiles import build_router
from inferlb.routing.types import RouteRequest
from inferlb.simulator.batching import BatchCore, Seq, SeqState
from inferlb.simulator.presets import PRESETS
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.tasks import ROLLOUT_CONTRACT, SERVICES
from inferlb.types import ManualClock
from inferlb.versions.table import Version, VersionTable
from inferlb.workflow.definition import load_process

__all__ = ["Outcome", "main", "simulate"]

_MODEL = "sim-llm"
_NODES = 16
_USERS = 2000
SCENARIOS = ("healthy", "errors", "latency2x")
WORKLOAD: dict[str, Any] = {"name": "rollout-chat",
                            "output_tokens": {"dist": "lognormal", "median": 64, "sigma": 0.8, "max": 1000}}


@dataclass
class Outcome:
    scenario: str
    state: str                           # completed | rolled_back | running (not decided by max_s)
    decided_after_s: float | None        # from the rollout's start to its last decision
    timeline: list[tuple[float, str, float]] = field(default_factory=list)   # (s after start, action, percent)
    requests: int = 0                    # arrivals between start and decision
    v2_served: int = 0                   # of which v2 served
    v2_faulted: int = 0                  # of which met a v2 fault (a failed attempt, or a 2×-slow answer)
    failed: int = 0                      # of which no attempt could serve
    slo_e2e_s: float = 0.0
    slo_ttft_s: float = 0.0
    reason: str | None = None
    wall_s: float = 0.0
    round_ms: list[float] = field(default_factory=list)   # wall time of each rollout.bpmn round

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["v2_share"] = self.v2_served / self.requests if self.requests else None
        d["faulted_share"] = self.v2_faulted / self.requests if self.requests else None
        d["round_ms_p50"], d["round_ms_p99"] = _pct(self.round_ms, 0.5), _pct(self.round_ms, 0.99)
        del d["round_ms"]
        return d


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


@dataclass
class _Flight:
    rec: RequestRecord
    node: int
    tokens: int
    arrived: float
    stream: bool
    version: str
    in_window: bool


async def simulate(scenario: str, *, rate: float, max_s: float, seed: int, warmup_s: float = 60.0,
                   interval_s: float = 5.0, scrape_s: float = 5.0) -> Outcome:
    """One scenario (see the module docstring)."""
    if scenario not in SCENARIOS:
        raise SystemExit(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    wall0 = time.perf_counter()
    preset = PRESETS["a100"]
    names = [f"a100-{i}" for i in range(_NODES)]
    half = _NODES // 2
    cfg = fleet_from_mapping({
        "models": [{"name": _MODEL, "versions": [{"name": "v1", "weight": 100, "nodes": names[:half]},
                                                 {"name": "v2", "weight": 0, "nodes": names[half:]}]}],
        "nodes": [{"name": n, "url": f"http://127.0.0.1:{20000 + i}", "models": [_MODEL],
                   "capacity_tokens": preset.kv_tokens, "max_concurrency": preset.max_num_seqs}
                  for i, n in enumerate(names)],
        "rollouts": {"interval_s": interval_s},
    })
    clock = ManualClock()
    start_mono = clock.monotonic()
    fleet = Fleet(cfg, clock)
    # No capacity filter: a busy node queues (its engine's waiting queue), as the gateway's admission
    # queue would, so a version keeps its own requests (routing/select's rule) instead of failing them.
    router = build_router("token-aware", filters=["healthy", "serves-model"], seed=seed)
    versions = VersionTable.from_fleet(cfg)
    window = VersionWindow(clock, lambda m: versions.get(m) is not None)
    process = load_process(default_processes_dir() / cfg.rollouts.process, SERVICES, engine="spiff",
                           required=dict(ROLLOUT_CONTRACT.required), start_data=ROLLOUT_CONTRACT.start_data)
    rollouts: RolloutConfig = cfg.rollouts
    manager = RolloutManager(versions=versions, window=window, process=process, clock=clock, cfg=rollouts)
    slow = 2.0 if scenario == "latency2x" else 1.0
    base = preset.batch_spec()
    cores = [BatchCore(base if i < half else replace(
        base, step_base_s=base.step_base_s * slow, step_per_seq_s=base.step_per_seq_s * slow,
        step_per_kv_token_s=base.step_per_kv_token_s * slow, prefill_s_per_token=base.prefill_s_per_token * slow))
        for i in range(_NODES)]
    index = {n: i for i, n in enumerate(names)}
    error_rate = 0.05 if scenario == "errors" else 0.0
    workload = Workload.model_validate(WORKLOAD)
    reqs = plan(workload, seed=seed, rate=rate, duration_s=max_s)
    users = random.Random(f"{seed}:users")
    faults = random.Random(f"{seed}:faults")
    wake: list[tuple[float, int]] = []
    flights: dict[int, _Flight] = {}
    warm_e2e: list[float] = []
    warm_ttft: list[float] = []
    out = Outcome(scenario, "running", None)
    started_at: float | None = None
    next_round = warmup_s
    next_scrape = 0.0

    def at(t: float) -> None:
        clock.advance(max(0.0, start_mono + t - clock.monotonic()))

    def schedule(i: int) -> None:
        nxt = cores[i].next_event_at()
        if nxt is not None:
            heapq.heappush(wake, (nxt, i))

    def finish(f: _Flight, seq: Seq, now: float) -> None:
        rec = f.rec
        first = (seq.first_token_at or now) - f.arrived
        total = (seq.finished_at or now) - f.arrived
        rec.first_byte_at = rec.received_at + first
        rec.last_byte_at = rec.received_at + total
        rec.status = "ok"
        rec.completion_tokens = seq.generated
        att = rec.attempts[-1]
        att.outcome, att.http_status = "ok", 200
        # The node's times for the guard's latency tests: no gateway queue here, so from arrival.
        att.first_byte_at, att.ended_at = rec.first_byte_at, rec.last_byte_at
        name = names[f.node]
        fleet.report_success(name, stream=f.stream, completion_tokens=seq.generated, ttfb_s=first, e2e_s=total)
        fleet.release(name, f.tokens)
        if started_at is None:
            warm_e2e.append(total)
            if f.stream:
                warm_ttft.append(first)
        window.observe(rec)

    def run_nodes_until(t: float) -> None:
        while wake and wake[0][0] <= t:
            when, i = heapq.heappop(wake)
            if cores[i].next_event_at() != when:
                continue
            at(when)
            report = cores[i].advance(when)
            for seq in report.progressed:
                f = flights.get(id(seq))
                if f is not None and seq.state is SeqState.FINISHED:
                    del flights[id(seq)]
                    finish(f, seq, when)
            schedule(i)

    def dispatch(rec: RequestRecord, version: Version, prompt: int, output: int, t: float, stream: bool,
                 in_window: bool) -> None:
        """The gateway's attempts: the version's nodes, then (not pinned) the other versions."""
        tried: set[str] = set()
        v: Version | None = version
        faulted = False
        for attempt in range(1, 4):
            if v is None:
                break
            d = router.decide(RouteRequest(_MODEL, prompt, output, exclude=frozenset(tried), only=v.nodes),
                              fleet.views())
            if d.pick is None:
                mv = versions.get(_MODEL)
                alts = [a for a in (mv.alternatives(v.name) if mv is not None else [])
                        if a.nodes - tried]
                v = alts[0] if alts else None
                if v is None:
                    break
                d = router.decide(RouteRequest(_MODEL, prompt, output, exclude=frozenset(tried), only=v.nodes),
                                  fleet.views())
                if d.pick is None:
                    break
            node = d.pick
            tried.add(node)
            rec.decisions.append({"attempt": attempt, "model": _MODEL, "version": v.name})
            rec.attempts.append(AttemptRecord(attempt, node, _MODEL, rec.received_at))
            if v.name == "v2" and faults.random() < error_rate:
                rec.attempts[-1].outcome, rec.attempts[-1].http_status = "retryable", 503
                fleet.report_failure(node)
                faulted = True
                continue
            rec.model_version = v.name
            i = index[node]
            tokens = prompt + output
            fleet.acquire(node, tokens)
            seq = cores[i].submit(prompt, output, t)
            flights[id(seq)] = _Flight(rec, i, tokens, t, stream, v.name, in_window)
            schedule(i)
            if in_window:
                out.v2_served += v.name == "v2"
                out.v2_faulted += faulted or (v.name == "v2" and slow > 1.0)
            return
        rec.status = "upstream_error"
        window.observe(rec)
        if in_window:
            out.failed += 1
            out.v2_faulted += faulted

    spec = RolloutSpec(model=_MODEL, from_version="v1", to_version="v2")
    rollout_id: str | None = None
    for n, r in enumerate(reqs):
        run_nodes_until(r.t)
        at(r.t)
        while clock.monotonic() - start_mono >= next_scrape:
            now = clock.monotonic()
            observe(fleet, [Sample(nm, "metrics", True, now, 0.0,
                                   values={"waiting": len(c.waiting), "kv_usage": c.kv_usage}).to_json()
                            for nm, c in zip(names, cores, strict=True)])
            next_scrape += scrape_s
        if r.t >= next_round:
            run_nodes_until(next_round)
            at(next_round)
            if rollout_id is None:
                # The warm-up's p95 is the SLO the rollout judges both versions by.
                out.slo_e2e_s, out.slo_ttft_s = _pct(warm_e2e, 0.95), _pct(warm_ttft, 0.95)
                window.set_slo(_MODEL, (out.slo_ttft_s, out.slo_e2e_s))
                ro = await manager.start_rollout(spec)
                rollout_id, started_at = ro.id, r.t
                out.timeline.append((0.0, "start", ro.percent))
            else:
                ro = manager.rollouts[rollout_id]
                before = ro.percent
                t0 = time.perf_counter()
                await manager.run_once()
                out.round_ms.append((time.perf_counter() - t0) * 1000.0)
                if ro.percent != before or not ro.running:
                    out.timeline.append((round(r.t - (started_at or 0.0), 1),
                                         ro.state if not ro.running else "promote", ro.percent))
                if not ro.running:
                    out.state, out.reason = ro.state, ro.reason
                    out.decided_after_s = round(r.t - (started_at or 0.0), 1)
                    break
            next_round += interval_s
        mv = versions.get(_MODEL)
        assert mv is not None
        rid = f"r{n}"
        version = versions.assign(_MODEL, "default", f"user-{users.randrange(_USERS)}", rid)
        assert version is not None
        rec = RequestRecord(request_id=rid, received_at=round(clock.time(), 6), endpoint="chat",
                            model_requested=_MODEL, stream=r.stream)
        in_window = started_at is not None
        out.requests += in_window
        dispatch(rec, version, r.prompt_tokens, r.output_tokens, r.t, r.stream, in_window)
    out.wall_s = round(time.perf_counter() - wall0, 2)
    return out


def _fmt(o: Outcome) -> str:
    share = f"{o.v2_served / o.requests:.2%}" if o.requests else "-"
    hit = f"{o.v2_faulted / o.requests:.2%}" if o.requests else "-"
    decided = f"{o.decided_after_s:g}" if o.decided_after_s is not None else "-"
    steps = " → ".join(f"{p:g}%@{t:g}s" for t, _, p in o.timeline)
    return (f"{o.scenario:10} {o.state:12} {decided:>9} {o.requests:>9} {share:>9} {hit:>9} {o.failed:>7} "
            f"{o.wall_s:>7.1f}  {steps}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=40.0, help="requests/s")
    ap.add_argument("--max-s", dest="max_s", type=float, default=3600.0, help="virtual seconds at most")
    ap.add_argument("--warmup-s", dest="warmup_s", type=float, default=60.0)
    ap.add_argument("--interval-s", dest="interval_s", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    half = _NODES // 2
    print(f"{WORKLOAD['name']} workload at {a.rate:g} req/s, {_NODES} a100-like nodes (v1: {half}, v2: {half}), "
          f"rounds every {a.interval_s:g} s, default steps and criteria, seed {a.seed} (virtual time)")
    print(f"{'scenario':10} {'outcome':12} {'decided s':>9} {'requests':>9} {'v2 served':>9} "
          f"{'v2 fault':>9} {'failed':>7} {'wall s':>7}  steps (percent @ s after start)")
    results = []
    for sc in a.scenarios.split(","):
        o = asyncio.run(simulate(sc.strip(), rate=a.rate, max_s=a.max_s, seed=a.seed, warmup_s=a.warmup_s,
                                 interval_s=a.interval_s))
        results.append(o)
        print(_fmt(o), flush=True)
    print(f"SLO from the warm-up (v1's p95): e2e ≤ {results[0].slo_e2e_s:.3f} s, TTFT ≤ {results[0].slo_ttft_s:.3f} s")
    for o in results:
        if o.reason:
            print(f"  {o.scenario}: {o.reason}")
    rounds = [ms for o in results for ms in o.round_ms]
    print(f"one rollout.bpmn round (observe, decide, act, record on SpiffWorkflow): p50 {_pct(rounds, 0.5):.2f} ms, "
          f"p99 {_pct(rounds, 0.99):.2f} ms wall over {len(rounds)} rounds")
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump({"rate": a.rate, "seed": a.seed, "results": [o.to_json() for o in results]}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
