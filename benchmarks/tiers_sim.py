"""Cost tiers in virtual time: all-strong vs all-cheap vs tiered, and the guard when the cheap tier degrades.

``python -m benchmarks.tiers_sim [--rate 6] [--duration-s 600] [--tune-seed 1] [--seed 2] [--json OUT]``

What is real: the tier choice (tiers/router.py with the classifier of tiers/classify.py on each
request's synthetic body), the feedback guard (tiers/guard.py) fed by each request's end, the
learned model (tiers/learned.py) where a row says so, and the emulator's continuous-batching
engine (simulator/batching.py) on every node. What is **simulated** (assumptions, not
measurements of any real model):

* Two pools of 4 ``h100``-like nodes: ``small`` runs at the preset's speed; ``large`` (a bigger
  model) takes 3x as long per engine step and per prefill token. Cost is priced per token, as
  hosted APIs price an 8B-class and a 70B-class model: $0.10 and $0.90 per million (prompt + output)
  tokens; both pools are provisioned in every row, so the node-hours are the same and the token
  price is what a tier saves.
* The workload: Poisson arrivals; 30 % of requests are *hard* (a label only the simulation knows):
  prompts of median 1,200 tokens (easy: 150), answers of median 300 (easy: 60), and in their body a
  code fence with probability 0.6 (easy 0.05), maths words 0.3 (easy 0.02), tools 0.3 (easy 0.05),
  a JSON schema 0.2 (easy 0.05). The classifier sees the body and the prompt length, never the label.
* The small model fails a hard request with probability 0.4 (the large one 0.03; either fails an
  easy one with 0.01), and its answer to a hard one is twice as long. A failure is an error status
  the gateway sees (as an output validator or a 5xx would report it). Real quality failures are
  often invisible to a gateway; then only the SLO-miss half of the guard would see anything.
* ``degraded``: from a third of the run on, the small model fails 35 % of every request (a bad
  deployment) and the guard (window 60 s, 20 requests, error rate 0.1, cool-down 120 s, 5 % probes)
  should move its traffic to the large model.

The threshold of the cheap tier is tuned on ``--tune-seed`` (the cheapest of 0.1 … 0.6 whose good
share is within 2 points of all-strong's) and every figure is then measured on ``--seed`` (a
different plan). "Good" = served without error within the SLO (e2e ≤ 30 s). Printed side by side:
requests, good share, error share, SLO-miss share, cost, cost per good request, share sent to
the small model, p50/p95 e2e; for ``degraded`` also the guard's trips and the good share after
the fault. Deterministic: no wall clock in the figures.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

from inferlb.config.settings import SLOConfig
from inferlb.config.tiers import TierPolicy
from inferlb.simulator.batching import BatchCore, Seq, SeqState
from inferlb.simulator.presets import PRESETS
from inferlb.store.records import RequestRecord
from inferlb.tiers.router import TierRouter
from inferlb.types import ManualClock

__all__ = ["Result", "main", "simulate"]

NODES = 4
PRICE_PER_M = {"small": 0.10, "large": 0.90}
SLO_E2E_S = 30.0
HARD_SHARE = 0.3
THRESHOLDS = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6)
GUARD = {"window_s": 60, "min_requests": 20, "max_error_rate": 0.1, "max_slo_miss_rate": 0.2,
         "cooldown_s": 120, "probe_share": 0.05, "recover_ratio": 0.5}


@dataclass(frozen=True)
class Req:
    t: float
    rid: str
    hard: bool
    prompt: int
    output: int
    body: dict[str, Any]


@dataclass
class Result:
    policy: str
    scenario: str
    requests: int = 0
    good: int = 0
    errors: int = 0
    slo_missed: int = 0
    to_small: int = 0
    cost: float = 0.0
    e2e: list[float] = field(default_factory=list)
    trips: int = 0
    trip_after_fault_s: float | None = None
    learned: dict[str, Any] | None = None
    after_fault: int = 0
    after_fault_good: int = 0

    def row(self) -> dict[str, Any]:
        n = self.requests or 1
        e = sorted(self.e2e)
        return {"policy": self.policy, "scenario": self.scenario, "requests": self.requests,
                "good_share": round(self.good / n, 4), "error_share": round(self.errors / n, 4),
                "slo_miss_share": round(self.slo_missed / n, 4), "cost_usd": round(self.cost, 4),
                "usd_per_1k_good": round(1000 * self.cost / self.good, 4) if self.good else None,
                "small_share": round(self.to_small / n, 4),
                "e2e_p50_s": round(e[len(e) // 2], 2) if e else None,
                "e2e_p95_s": round(e[min(len(e) - 1, int(0.95 * len(e)))], 2) if e else None,
                "guard_trips": self.trips, "trip_after_fault_s": self.trip_after_fault_s,
                "learned_ready": None if self.learned is None else self.learned["ready"],
                "good_after_fault": round(self.after_fault_good / self.after_fault, 4) if self.after_fault else None}


def _lognormal(rng: random.Random, median: float, sigma: float, hi: int) -> int:
    return max(1, min(hi, int(median * math.exp(rng.gauss(0.0, sigma)))))


def workload(seed: int, rate: float, duration_s: float) -> list[Req]:
    """The seeded plan of the module docstring."""
    rng = random.Random(f"tiers:{seed}")
    out: list[Req] = []
    t, i = 0.0, 0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        hard = rng.random() < HARD_SHARE
        p = (0.6, 0.3, 0.3, 0.2) if hard else (0.05, 0.02, 0.05, 0.05)
        text = "Please help with this. "
        if rng.random() < p[0]:
            text += "```python\ndef f(x):\n    return x\n```\n"
        if rng.random() < p[1]:
            text += "Prove that the integral converges; solve for x in the equation. "
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
        if rng.random() < p[2]:
            body["tools"] = [{"type": "function", "function": {"name": "lookup"}}]
        if rng.random() < p[3]:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}
        prompt = _lognormal(rng, 1200 if hard else 150, 0.6, 8000)
        output = _lognormal(rng, 300 if hard else 60, 0.6, 2000)
        out.append(Req(t, f"r{i}", hard, prompt, output, body))
        i += 1


@dataclass
class _Flight:
    req: Req
    model: str
    tier: dict[str, Any] | None
    fails: bool


def simulate(policy: str, scenario: str, reqs: list[Req], *, threshold: float, duration_s: float,
             seed: int, learned: bool = False) -> Result:
    """One policy (``strong``, ``cheap``, ``tiered``, ``tiered-noguard``) over one plan."""
    preset = PRESETS["h100"]
    base = preset.batch_spec()
    big = replace(base, step_base_s=base.step_base_s * 3, step_per_seq_s=base.step_per_seq_s * 3,
                  step_per_kv_token_s=base.step_per_kv_token_s * 3, prefill_s_per_token=base.prefill_s_per_token * 3)
    pools = {"small": [BatchCore(base) for _ in range(NODES)], "large": [BatchCore(big) for _ in range(NODES)]}
    cores = [*pools["small"], *pools["large"]]
    clock = ManualClock()
    start, wall0 = clock.monotonic(), clock.time()
    router = TierRouter(clock)
    tiers = TierPolicy.model_validate({
        "models": [{"model": "small", "max_score": threshold}, {"model": "large"}],
        "guard": {**GUARD, "enabled": policy != "tiered-noguard"},
        "learned": {"enabled": learned, "min_samples": 200}})
    slos = [SLOConfig(model="*", e2e_max_s=SLO_E2E_S)]
    rng = random.Random(f"faults:{seed}:{policy}:{scenario}")
    fault_at = duration_s / 3 if scenario == "degraded" else math.inf
    res = Result(policy + ("+learned" if learned else ""), scenario)
    wake: list[tuple[float, int]] = []
    flights: dict[int, _Flight] = {}

    def at(t: float) -> None:
        clock.advance(max(0.0, start + t - clock.monotonic()))

    def schedule(i: int) -> None:
        nxt = cores[i].next_event_at()
        if nxt is not None:
            heapq.heappush(wake, (nxt, i))

    def finish(f: _Flight, seq: Seq, now: float) -> None:
        r = f.req
        e2e = (seq.finished_at or now) - r.t
        ok = not f.fails
        missed = ok and e2e > SLO_E2E_S
        res.requests += 1
        res.errors += not ok
        res.slo_missed += missed
        res.good += ok and not missed
        res.cost += (r.prompt + seq.generated) * PRICE_PER_M[f.model] / 1e6
        if ok:
            res.e2e.append(e2e)
        if r.t >= fault_at:
            res.after_fault += 1
            res.after_fault_good += ok and not missed
        if f.tier is not None:
            rec = RequestRecord(request_id=r.rid, received_at=clock.time() - e2e, endpoint="chat",
                                model_requested="auto", status="ok" if ok else "upstream_error",
                                last_byte_at=clock.time(), tags={"tier": f.tier})
            router.observe(rec)

    def run_until(t: float) -> None:
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

    for r in reqs:
        run_until(r.t)
        at(r.t)
        tier: dict[str, Any] | None = None
        if policy == "strong":
            model = "large"
        elif policy == "cheap":
            model = "small"
        else:
            choice = router.choose("auto", tiers, r.body, prompt_tokens=r.prompt, max_tokens=None,
                                   request_id=r.rid, slos=slos)
            model, tier = choice.model, choice.to_json()
        small = model == "small"
        res.to_small += small
        # The small model: 0.4 on hard requests, 0.01 on easy ones (0.35 once degraded); the large: 0.03 / 0.01.
        p_fail = (0.4 if r.hard else 0.35 if r.t >= fault_at else 0.01) if small else (0.03 if r.hard else 0.01)
        output = r.output * 2 if small and r.hard else r.output
        pool = pools[model]
        k = min(range(NODES), key=lambda j: len(pool[j].running) + len(pool[j].waiting))
        i = cores.index(pool[k])
        seq = cores[i].submit(r.prompt, output, r.t)
        flights[id(seq)] = _Flight(r, model, tier, rng.random() < p_fail)
        schedule(i)
    run_until(math.inf)
    res.trips = sum(g.trips for g in router.guards.values())
    trips = [t["at"] for t in router.transitions if t["event"] == "tripped"]
    if trips and fault_at < math.inf:
        res.trip_after_fault_s = round(trips[0] - (wall0 + fault_at), 1)
    if learned and ("auto", "small") in router.models:
        res.learned = router.models[("auto", "small")].describe()
    return res


def tune(seed: int, rate: float, duration_s: float) -> tuple[float, list[dict[str, Any]]]:
    """The cheap tier's threshold on the tuning plan: the cheapest within 2 points of all-strong's good share."""
    reqs = workload(seed, rate, duration_s)
    strong = simulate("strong", "healthy", reqs, threshold=0.0, duration_s=duration_s, seed=seed).row()
    rows = [simulate("tiered", "healthy", reqs, threshold=th, duration_s=duration_s, seed=seed).row()
            | {"threshold": th} for th in THRESHOLDS]
    fit = [r for r in rows if r["good_share"] >= strong["good_share"] - 0.02]
    best = min(fit, key=lambda r: r["cost_usd"]) if fit else max(rows, key=lambda r: r["good_share"])
    return float(best["threshold"]), rows


COLUMNS = ("policy", "scenario", "requests", "good_share", "error_share", "slo_miss_share", "cost_usd",
           "usd_per_1k_good", "small_share", "e2e_p50_s", "e2e_p95_s", "guard_trips", "trip_after_fault_s",
           "good_after_fault", "learned_ready")


def _print(rows: list[dict[str, Any]], cols: tuple[str, ...] = COLUMNS) -> None:
    widths = [max(len(c), *(len(str(r.get(c))) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r.get(c)).ljust(w) for c, w in zip(cols, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--tune-seed", type=int, default=1)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    logging.getLogger("inferlb.tiers").setLevel(logging.ERROR)   # the trips are a column of the table
    threshold, sweep = tune(a.tune_seed, a.rate, a.duration_s)
    print(f"tuning plan (seed {a.tune_seed}): good share and cost per threshold")
    _print(sweep, ("threshold", "good_share", "cost_usd", "small_share"))
    print(f"chosen max_score {threshold:g}; measured on seed {a.seed}:\n")
    reqs = workload(a.seed, a.rate, a.duration_s)
    hard = sum(r.hard for r in reqs)
    print(f"{len(reqs)} requests in {a.duration_s:g} s, {hard} hard ({hard / max(1, len(reqs)):.0%})")
    kw = {"threshold": threshold, "duration_s": a.duration_s, "seed": a.seed}
    rows = [simulate(p, s, reqs, **kw).row()
            for s, ps in (("healthy", ("strong", "cheap", "tiered")), ("degraded", ("tiered-noguard", "tiered")))
            for p in ps]
    learned = simulate("tiered", "healthy", reqs, learned=True, **kw)
    rows.insert(3, learned.row())
    _print(rows)
    if learned.learned is not None:
        lm = learned.learned
        print(f"learned model of the small tier at the end: ready {lm['ready']}, trained on {lm['trained']}, "
              f"held-out log loss {lm['test_logloss']} vs the base rate's {lm['base_logloss']} "
              f"({lm['tested']} held out)")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump({"threshold": threshold, "sweep": sweep, "rows": rows, "learned": learned.learned}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
