"""LoRA-adapter affinity measured in the discrete-event simulator (virtual time: deterministic).

::

    python -m benchmarks.lora_des [--nodes 8] [--adapters 20] [--zipf 1.0] [--max-lora 2,4] [--load-s 0.5]
                                  [--loads 0.3,0.6] [--train-seeds 11,12] [--test-seeds 1,2,3]
                                  [--weights 1,2,4] [--duration S] [--json OUT]

The fleet: ``--nodes`` ``a100`` nodes (inferlb/simulator/presets.py), each able to load every one
of ``--adapters`` LoRA adapters with ``--max-lora`` GPU slots and ``--load-s`` seconds to load a
cold one (inferlb/simulator/lora.py: LRU eviction of adapters no request holds, a request waits
for a slot when every loaded adapter is held). The workload: the built-in ``chat`` (its SLO,
warm-up and token mix), Poisson arrivals at ``load`` × the fleet's capacity (``--nodes`` × the
saturated throughput of one ``a100`` node on ``chat`` with no adapters, benchmarks/learned_goals.py
``node_capacity``), each request naming an adapter drawn with Zipf popularity (rank ``k`` has
weight ``1 / k^zipf``), seeded per run.

Profiles: ``token-aware`` (adapter-blind: the gateway's default for a fleet without LoRA models)
against ``lora-affinity`` (routing/lora.py; the default of a fleet with a LoRA model), whose
``lora-affinity`` scorer weight (``--weights``) and ``spread_on_slot_wait`` (on/off) are chosen
per max_lora on the *train* seeds (lowest mean TTFT p99 over the loads and train seeds); every
figure is reported on the *test* seeds only, beside the profile's shipped setting (weight 2,
``spread_on_slot_wait`` off).
Per (max_lora, load, profile), means over the test seeds: the adapter-miss rate (requests whose
adapter was neither loaded nor loading on the node they went to: loads ÷ adapter requests), the
share of requests that waited for a free slot, evictions, TTFT p50 / p99, e2e p99, goodput (within
the workload's SLO, a second) and SLO attainment.

Bounded: the default run takes about a minute of CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.learned_goals import node_capacity
from inferlb.bench.des_report import des_summary
from inferlb.bench.loadgen.workload import PlannedRequest, Workload, load_workload, plan
from inferlb.routing.profiles import build_router
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.lora import LoraSpec
from inferlb.simulator.presets import preset_spec

__all__ = ["main", "run_one"]

# The lora-affinity profile's own setting (routing/profiles.py, routing/lora.py), reported beside
# the one the train seeds choose.
SHIPPED_WEIGHT = 2.0
SHIPPED_SPREAD = False


@dataclass(frozen=True, slots=True)
class AdapterRequest:
    """A planned request that names a LoRA adapter (the simulation reads ``adapter``)."""

    t: float
    prompt_tokens: int
    output_tokens: int
    adapter: str
    model: str | None = None
    priority: str | None = None
    stream: bool = True
    max_tokens: int | None = None


def with_adapters(reqs: Sequence[PlannedRequest], adapters: int, zipf: float, seed: int) -> list[AdapterRequest]:
    rng = random.Random(seed * 7919 + 17)
    names = [f"lora-{k:02d}" for k in range(adapters)]
    weights = [1.0 / (k + 1) ** zipf for k in range(adapters)]
    picks = rng.choices(names, weights, k=len(reqs))
    return [AdapterRequest(r.t, r.prompt_tokens, r.output_tokens, a, r.model, r.priority, r.stream,
                           getattr(r, "max_tokens", None)) for r, a in zip(reqs, picks, strict=True)]


def run_one(profile: str, weight: float, spread: bool, *, w: Workload, nodes: int, adapters: int, zipf: float,
            max_lora: int, load_s: float, rate: float, duration_s: float, seed: int) -> dict[str, Any]:
    lora = LoraSpec(adapters=tuple(f"lora-{k:02d}" for k in range(adapters)), max_lora=max_lora, load_s=load_s)
    specs = [preset_spec(f"a100-{i}", "a100", [w.model], lora=lora) for i in range(nodes)]
    scorers = None
    if profile == "lora-affinity":
        scorers = {"outstanding-tokens": 1.0, "queue-depth": 0.5, "kv-cache": 0.5, "decode-speed": 1.0,
                   "lora-affinity": weight}
    params = {"lora-affinity": {"spread_on_slot_wait": spread}} if profile == "lora-affinity" else None
    router = build_router(profile, seed=seed, scorers=scorers, params=params)
    router.scores_when_read = True
    sim = Simulation(specs, router=router, seed=seed, model=w.model)
    reqs = with_adapters(plan(w, seed=seed, rate=rate, duration_s=duration_s), adapters, zipf, seed)
    res = sim.run(reqs)
    s = des_summary(res, w, duration_s=duration_s)
    tot = sim.lora_totals()
    n = max(1, tot["requests"])
    return {"miss": tot["loads"] / n, "waited": tot["waited_for_slot"] / n, "evictions": tot["evictions"],
            "ttft_p50": s["ttft_s"]["p50"], "ttft_p99": s["ttft_s"]["p99"], "e2e_p99": s["e2e_s"]["p99"],
            "goodput": s["goodput_rps"], "slo": s["slo_attainment"], "offered": s["offered_rps"]}


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--adapters", type=int, default=20)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--max-lora", default="2,4")
    ap.add_argument("--load-s", type=float, default=0.5)
    ap.add_argument("--loads", default="0.3,0.6")
    ap.add_argument("--train-seeds", default="11,12")
    ap.add_argument("--test-seeds", default="1,2,3")
    ap.add_argument("--weights", default="1,2,4")
    ap.add_argument("--duration", type=float, default=150.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    started = time.process_time()
    w = load_workload("chat")
    cap = node_capacity("a100", w) * a.nodes
    max_loras = [int(x) for x in a.max_lora.split(",")]
    loads = [float(x) for x in a.loads.split(",")]
    train = [int(x) for x in a.train_seeds.split(",")]
    test = [int(x) for x in a.test_seeds.split(",")]
    weights = [float(x) for x in a.weights.split(",")]
    common = {"w": w, "nodes": a.nodes, "adapters": a.adapters, "zipf": a.zipf, "load_s": a.load_s,
              "duration_s": a.duration}
    print(f"fleet {a.nodes} × a100, {a.adapters} adapters (Zipf {a.zipf}), load_s {a.load_s} s, "
          f"capacity {cap:.1f} req/s; chat workload, {a.duration:g} s per run")
    # Train, per max_lora: the lora-affinity weight and spread_on_slot_wait with the lowest mean
    # TTFT p99 over the loads and the train seeds.
    chosen: dict[int, tuple[float, bool]] = {}
    train_scores: dict[str, float] = {}
    for m in max_loras:
        score: dict[tuple[float, bool], float] = {}
        for wt in weights:
            for spread in (False, True):
                rows = [run_one("lora-affinity", wt, spread, max_lora=m, rate=cap * ld, seed=s, **common)
                        for ld in loads for s in train]
                score[wt, spread] = _mean(rows, "ttft_p99")
                train_scores[f"max_lora={m} weight={wt:g} spread={spread}"] = score[wt, spread]
        chosen[m] = min(score, key=lambda k: score[k])
        print(f"train seeds {','.join(map(str, train))}, max_lora {m}: mean TTFT p99 by (weight, spread_on_slot_wait) "
              + ", ".join(f"({k[0]:g}, {'on' if k[1] else 'off'}) {v:.2f} s" for k, v in score.items())
              + f"; chosen ({chosen[m][0]:g}, {'on' if chosen[m][1] else 'off'})")
    print("test seeds " + ",".join(map(str, test)) + " (means):")
    head = (f"{'max_lora':>8} {'load':>5} {'profile':<14} {'miss':>6} {'waited':>6} {'evict':>6} "
            f"{'TTFT p50':>9} {'TTFT p99':>9} {'e2e p99':>8} {'goodput':>8} {'SLO':>6}")
    print(head)
    out: list[dict[str, Any]] = []
    for m in max_loras:
        for ld in loads:
            wt, spread = chosen[m]
            for label, prof, wt_, spread_ in (("token-aware", "token-aware", 0.0, False),
                                              ("lora (shipped)", "lora-affinity", SHIPPED_WEIGHT, SHIPPED_SPREAD),
                                              (f"lora ({wt:g},{'on' if spread else 'off'})", "lora-affinity", wt,
                                               spread)):
                rows = [run_one(prof, wt_, spread_, max_lora=m, rate=cap * ld, seed=s, **common) for s in test]
                fig = {k: _mean(rows, k) for k in rows[0]}
                out.append({"max_lora": m, "load": ld, "profile": label, **fig})
                print(f"{m:>8} {ld:>5.2f} {label:<14} {fig['miss']:>6.1%} {fig['waited']:>6.1%} "
                      f"{fig['evictions']:>6.0f} {fig['ttft_p50']:>8.3f}s {fig['ttft_p99']:>8.3f}s "
                      f"{fig['e2e_p99']:>7.2f}s {fig['goodput']:>8.2f} {fig['slo']:>6.1%}")
    print(f"({time.process_time() - started:.0f} s CPU)")
    if a.json is not None:
        a.json.write_text(json.dumps({"chosen": {str(m): c for m, c in chosen.items()}, "train": train_scores,
                                      "rows": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
