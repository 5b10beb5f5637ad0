"""The goals of learned routing, measured in the discrete-event simulator
(docs/benchmarks.md, "Learned routing: the goals in the discrete-event simulator").

``python -m benchmarks.learned_goals [--nodes 12] [--load 0.85] [--requests 10000]
[--seeds 1,2,3] [--profiles learned,token-aware,...] [--no-ope] [--json] [--max-seconds 60]``

What it does, in order, all in virtual time (:class:`~inferlb.simulator.des.sim.Simulation`, seeded):

1. **Capacity.** Each preset of the fleet (``h100`` / ``a100`` / ``l4`` in turn) is measured alone
   in the DES: one node, the workload offered at well over what it can serve (round-robin, so
   nothing is filtered), completions per second between ``--cal-warm`` and ``--cal-duration``
   virtual seconds = its saturated throughput. The fleet's capacity is their sum (the most the
   fleet completes per second with every node busy); the offered rate is ``--load`` × that.
2. **Runs.** The same plan (``heavy-tail``: lognormal prompts, Pareto outputs; ``--requests``
   requests at that rate) per seed through each profile, with the gateway's admission rules
   (:class:`~inferlb.bench.des_admission.GatewayAdmission`) and the workload's client timeout.
   ``learned`` runs with its feedback loop (:class:`~inferlb.simulator.des.feedback.LearnedFeedback`:
   every answer observed with the node's times, training every ``train_interval_s`` of virtual
   time), starting cold (token-aware decides while it warms up; that counts against it).
3. **Figures** per profile over the seeds: e2e p50 / p99, TTFT p99 (streams), goodput (requests
   meeting the workload's SLO per second of the arrival window) and SLO attainment, by the
   definitions of ``inferlb bench run`` (:func:`~inferlb.bench.des_report.des_summary`).
4. **Regret.** A request's *cost* is its e2e seconds as the client saw it (gateway queue
   included); a request that did not complete (rejected, no node, failed, timed out) costs
   ``--failure-cost-s`` (the workload's client timeout, 60 s). Regret of learned after N requests =
   (mean cost of learned over requests 1..N − mean cost of the best fixed profile over the same
   N requests) / the latter, where the best fixed profile is the one with the lowest mean cost
   over those N requests (same plan, same seed). Per seed and pooled over the seeds.
5. **Off-policy evaluation** (``--no-ope`` skips it): every decision the learned policy made
   itself (exploring, with its propensity) is logged with its cost, as the audit trail logs it;
   ``ope_replay.evaluate`` estimates from that log the mean cost of ``token-aware`` and of
   ``learned`` (SNIPS, DR, with bootstrap intervals), compared with each policy's measured
   on-policy mean cost on the same requests (the logged rows) in its own run of the same plan.

Goals checked and printed (``goal met`` / ``NOT met``): learned e2e p99 ≤ 0.8 × token-aware's with
goodput no lower; regret < 5 %; OPE estimate of token-aware within ±5 % of its measured value.
``--max-seconds`` bounds the wall time: runs not started by then are reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferlb.bench.des_admission import GatewayAdmission
from inferlb.bench.des_report import des_summary
from inferlb.bench.loadgen.workload import PlannedRequest, Workload, load_workload, plan
from inferlb.config.admission import AdmissionPolicy
from inferlb.routing.ope_replay import MIN_ESS, evaluate, softmax_policy
from inferlb.routing.profiles import build_router
from inferlb.simulator.des.feedback import LearnedFeedback
from inferlb.simulator.des.results import OUTCOMES, DesResults
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.presets import preset_spec
from inferlb.simulator.spec import NodeSpec

__all__ = ["FIXED", "ProfileRun", "costs", "fleet", "fleet_capacity", "main", "node_capacity", "ope_check",
           "regret", "run_profile"]

FIXED = ("token-aware", "least-connections", "power-of-two", "round-robin", "weighted")
CYCLE = ("h100", "a100", "l4")
_OK = OUTCOMES.index("ok")


def fleet(n: int, presets: Sequence[str] = CYCLE) -> list[NodeSpec]:
    """``n`` preset nodes, the presets in turn (``h100-0000``, ``a100-0001``, …)."""
    return [preset_spec(f"{presets[i % len(presets)]}-{i:04d}", presets[i % len(presets)]) for i in range(n)]


def node_capacity(preset: str, w: Workload, *, seed: int = 1, duration_s: float = 120.0, warm_s: float = 30.0,
                  offered_rps: float = 60.0) -> float:
    """Saturated throughput of one ``preset`` node in the DES: completions per second between
    ``warm_s`` and ``duration_s`` while ``offered_rps`` (more than it serves) keep coming; ValueError
    when the node's queue is empty at the end (it was not saturated)."""
    reqs = plan(w, seed=seed, rate=offered_rps, duration_s=duration_s)
    sim = Simulation([preset_spec("cal", preset)], profile="round-robin", seed=seed, model=w.model)
    res = sim.run(reqs, until=duration_s)
    done = sum(1 for i in range(len(res.t))
               if res.outcome[i] == _OK and warm_s <= res.t[i] + res.e2e[i] <= duration_s)
    if sim.nodes_info()[0].waiting == 0:     # nothing left waiting for a slot: it kept up
        raise ValueError(f"{preset}: {offered_rps} req/s did not saturate the node; offer more")
    return done / (duration_s - warm_s)


def fleet_capacity(specs: Sequence[NodeSpec], w: Workload, *, seed: int = 1, duration_s: float = 120.0,
                   warm_s: float = 30.0) -> tuple[float, dict[str, float]]:
    """The fleet's capacity (sum of its nodes' saturated throughputs) and each preset's."""
    per: dict[str, float] = {}
    total = 0.0
    for s in specs:
        p = s.preset or "?"
        if p not in per:
            per[p] = node_capacity(p, w, seed=seed, duration_s=duration_s, warm_s=warm_s)
        total += per[p]
    return total, per


def costs(res: DesResults, failure_cost_s: float) -> list[float]:
    """Per request (plan order): e2e seconds from arrival if it completed, else ``failure_cost_s``."""
    return [res.e2e[i] if res.outcome[i] == _OK else failure_cost_s for i in range(len(res.t))]


@dataclass
class ProfileRun:
    profile: str
    seed: int
    summary: dict[str, Any]
    cost: list[float]
    wall_s: float
    feedback: LearnedFeedback | None = None
    results: DesResults | None = None
    learned: dict[str, Any] = field(default_factory=dict)   # explored, fallback decisions, predictor state


def run_profile(profile: str, specs: Sequence[NodeSpec], reqs: Sequence[PlannedRequest], w: Workload, *,
                seed: int, duration_s: float, failure_cost_s: float, log: bool = False,
                router_kwargs: dict[str, Any] | None = None, lengths: Any = None) -> ProfileRun:
    """One seeded run of ``reqs`` routed by ``profile`` (``learned``: with its feedback loop);
    ``lengths``: a :class:`~inferlb.routing.length.LengthPredictor` that routing counts budgets by
    (the gateway's default, ``routing.output_length``), None to count the declared budgets."""
    sim_box: list[Simulation] = []
    router = build_router(profile, seed=seed, clock=lambda: sim_box[0].now if sim_box else 0.0,
                          **(router_kwargs or {}))
    fb = LearnedFeedback(router, log=log, failure_cost_s=failure_cost_s) if hasattr(router, "lifecycle") else None
    sim = Simulation(specs, router=router, seed=seed, admission=GatewayAdmission(AdmissionPolicy()), model=w.model,
                     timeout_s=w.timeout_s, feedback=fb, lengths=lengths)
    sim_box.append(sim)
    t0 = time.perf_counter()
    res = sim.run(reqs)
    wall = time.perf_counter() - t0
    out = ProfileRun(profile, seed, des_summary(res, w, duration_s=duration_s), costs(res, failure_cost_s), wall, fb,
                     res)
    if fb is not None:
        lc = fb.lifecycle
        st = lc.status()
        out.learned = {"explored": lc.explored_total, "fallback_decisions": lc.fallbacks_total,
                       "state": st["state"], "mape": st["mape"], "observed": fb.observed, "logged": len(fb.logged),
                       "transitions": lc.transitions_total}
    return out


def regret(learned: Sequence[float], fixed: Mapping[str, Sequence[float]], n: int) -> dict[str, Any]:
    """Regret of ``learned`` against the best of ``fixed`` over the first ``n`` requests (see the
    module docstring); the best profile's name and every profile's mean cost."""
    if not fixed:
        raise ValueError("no fixed profile to compare with")
    n = min(n, len(learned), *(len(c) for c in fixed.values()))
    means = {p: sum(c[:n]) / n for p, c in fixed.items()}
    best = min(means, key=lambda p: means[p])
    mine = sum(learned[:n]) / n
    return {"n": n, "learned": mine, "best": best, "best_mean": means[best], "means": means,
            "regret": (mine - means[best]) / means[best]}


def ope_check(learned_run: ProfileRun, on_policy: dict[str, ProfileRun], *, n_boot: int = 300,
              seed: int = 0, policies: dict[str, Any] | None = None, min_ess: float = MIN_ESS,
              reward_model: str = "fitted") -> dict[str, Any]:
    """Estimate each policy of ``on_policy`` (a profile name, or the router ``policies`` gives for
    that name) from ``learned_run``'s logged decisions and compare with its measured mean cost on
    the same requests (the logged rows) in its own run. An estimate refused for insufficient
    overlap (ESS < ``min_ess``) has ``refused``; its withheld values are still compared (as
    ``*_error``), to show what the refusal kept from being printed as an estimate."""
    fb = learned_run.feedback
    if fb is None or not fb.logged:
        return {"error": "no logged learned decisions"}
    rows = fb.logged_rows
    out: dict[str, Any] = {"logged": len(fb.logged)}
    for name, run in on_policy.items():
        est = evaluate(fb.logged, (policies or {}).get(name, name), n_boot=n_boot, seed=seed, min_ess=min_ess,
                       keep_refused=True, reward_model=reward_model)
        measured = sum(run.cost[i] for i in rows) / len(rows)
        entry: dict[str, Any] = {"measured": measured, "measured_all": sum(run.cost) / len(run.cost),
                                 "ess": est.get("ess"), "skipped": est.get("skipped"), "n": est.get("n"),
                                 "refused": est.get("refused")}
        for k in ("ips", "snips", "dr", "switch_dr"):
            e = est.get(k) or (est.get("withheld") or {}).get(k)
            if isinstance(e, dict):
                entry[k] = e
                entry[f"{k}_error"] = (e["value"] - measured) / measured
        out[name] = entry
    return out


def _pooled(runs: Sequence[ProfileRun]) -> dict[str, Any]:
    """Mean over seeds of each figure."""
    def mean(xs: list[float]) -> float:
        xs = [x for x in xs if x == x]
        return sum(xs) / len(xs) if xs else math.nan

    s = [r.summary for r in runs]
    return {"e2e_p50": mean([x["e2e_s"]["p50"] for x in s]), "e2e_p99": mean([x["e2e_s"]["p99"] for x in s]),
            "ttft_p99": mean([x["ttft_s"]["p99"] for x in s]), "goodput": mean([x["goodput_rps"] for x in s]),
            "slo": mean([x["slo_attainment"] for x in s]), "cost": mean([sum(r.cost) / len(r.cost) for r in runs]),
            "not_ok": mean([float(x["measured"] - x["outcomes"]["ok"]) for x in s]),
            "wall_s": sum(r.wall_s for r in runs), "seeds": len(runs)}


def _f(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=12)
    ap.add_argument("--load", type=float, default=0.85, help="offered load / measured capacity (0.85)")
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--profiles", default="learned," + ",".join(FIXED))
    ap.add_argument("--workload", default="heavy-tail")
    ap.add_argument("--failure-cost-s", type=float, default=None, help="cost of a request that did not complete "
                    "(default: the workload's timeout_s)")
    ap.add_argument("--cal-duration", type=float, default=120.0)
    ap.add_argument("--cal-warm", type=float, default=30.0)
    ap.add_argument("--no-ope", action="store_true")
    ap.add_argument("--epsilon", type=float, default=None, help="learned: exploration rate (default: the profile's)")
    ap.add_argument("--temperature", type=float, default=None,
                    help="learned: softmax temperature (default: the profile's)")
    ap.add_argument("--learned-params", default=None, help='learned: plugin params as JSON, e.g. '
                    '\'{"predicted-latency": {"interference": 1.0}}\' (merged over the bandit options)')
    ap.add_argument("--ope-softmax", type=float, default=0.1, help="OPE also estimates token-aware with a softmax "
                    "over its scores at this temperature (run on-policy too, to compare); 0: not")
    ap.add_argument("--min-ess", type=float, default=MIN_ESS, help="OPE refuses below this effective sample size")
    ap.add_argument("--reward-model", choices=["fitted", "predictions", "none"], default="fitted",
                    help="DR's reward model: fitted on logged costs (default) or the logged predictions")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="wall-time bound: later runs are skipped")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", type=Path, default=None, metavar="PNG",
                    help="also write a chart: the latency tail of each profile and the goals per seed (needs the "
                         "plot extra)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    w = load_workload(a.workload)
    specs = fleet(a.nodes)
    seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    profiles = [p.strip() for p in a.profiles.split(",") if p.strip()]
    fail_cost = a.failure_cost_s if a.failure_cost_s is not None else (w.timeout_s or 60.0)
    cap, per = fleet_capacity(specs, w, seed=seeds[0], duration_s=a.cal_duration, warm_s=a.cal_warm)
    rate = a.load * cap
    duration = a.requests / rate
    log = print if not a.json else (lambda *x, **k: None)
    log(f"fleet: {a.nodes} nodes ({', '.join(f'{p} {v:.2f} req/s saturated' for p, v in per.items())}); "
        f"capacity {cap:.1f} req/s; offered {rate:.1f} req/s ({a.load:.0%}), {a.workload}, "
        f"~{a.requests} requests per seed over {duration:.0f} virtual s; seeds {seeds}", flush=True)
    bandit = {k: v for k, v in (("epsilon", a.epsilon), ("temperature", a.temperature)) if v is not None}
    lparams: dict[str, Any] = {"softmax-bandit": bandit} if bandit else {}
    if a.learned_params:
        for k, v in json.loads(a.learned_params).items():
            lparams[k] = {**lparams.get(k, {}), **v}
    learned_kw: dict[str, Any] | None = {"params": lparams} if lparams else None
    soft = f"token-aware~softmax({a.ope_softmax:g})"
    soft_kw = {"picker": "softmax-bandit", "params": {"softmax-bandit": {
        "epsilon": 1.0, "temperature": a.ope_softmax, "never_explore": []}}}
    if a.ope_softmax > 0 and not a.no_ope and "learned" in profiles and "token-aware" in profiles:
        profiles.append(soft)
    runs: dict[str, list[ProfileRun]] = {p: [] for p in profiles}
    skipped: list[str] = []
    for seed in seeds:
        reqs = plan(w, seed=seed, rate=rate, duration_s=duration, max_requests=a.requests)
        for p in profiles:
            if time.perf_counter() - t_start > a.max_seconds:
                skipped.append(f"{p}@{seed}")
                continue
            r = run_profile("token-aware" if p == soft else p, specs, reqs, w, seed=seed, duration_s=duration,
                            failure_cost_s=fail_cost, log=p == "learned" and not a.no_ope,
                            router_kwargs=learned_kw if p == "learned" else soft_kw if p == soft else None)
            r.profile = p
            runs[p].append(r)
            log(f"  seed {seed} {p:18} e2e p99 {_f(r.summary['e2e_s']['p99'])} s, goodput "
                f"{_f(r.summary['goodput_rps'], '.2f')} req/s, mean cost {_f(sum(r.cost) / len(r.cost))} s "
                f"({r.wall_s:.1f} s wall){'  ' + json.dumps(r.learned) if r.learned else ''}", flush=True)
    report: dict[str, Any] = {"learned_bandit": bandit, "learned_params": lparams, "nodes": a.nodes,
                              "capacity_rps": cap,
                              "per_preset_rps": per, "offered_rps": rate,
                              "load": a.load, "requests": a.requests, "seeds": seeds, "failure_cost_s": fail_cost,
                              "skipped": skipped, "profiles": {p: _pooled(rs) for p, rs in runs.items() if rs}}
    complete = {p: rs for p, rs in runs.items() if len(rs) == len(seeds)}
    fixed = [p for p in complete if p not in ("learned", soft)]
    goals: dict[str, Any] = {}
    if "learned" in complete and fixed:
        per_seed = []
        for k, seed in enumerate(seeds):
            per_seed.append(regret(complete["learned"][k].cost, {p: complete[p][k].cost for p in fixed},
                                   a.requests) | {"seed": seed})
        pooled_l = [c for r in complete["learned"] for c in r.cost[:a.requests]]
        pooled_f = {p: [c for r in complete[p] for c in r.cost[:a.requests]] for p in fixed}
        report["regret"] = {"per_seed": per_seed, "pooled": regret(pooled_l, pooled_f, len(pooled_l))}
        goals["regret < 5 %"] = report["regret"]["pooled"]["regret"] < 0.05
    if "learned" in complete and "token-aware" in complete:
        lp, tp = report["profiles"]["learned"], report["profiles"]["token-aware"]
        goals["learned e2e p99 ≤ 0.8 × token-aware"] = lp["e2e_p99"] <= 0.8 * tp["e2e_p99"]
        goals["learned goodput ≥ token-aware"] = lp["goodput"] >= tp["goodput"]
        goals["(per seed) p99 ratio"] = [round(l_.summary["e2e_s"]["p99"] / t_.summary["e2e_s"]["p99"], 3)
                                         for l_, t_ in zip(complete["learned"], complete["token-aware"], strict=True)]
        if not a.no_ope:
            ope = []
            for k, seed in enumerate(seeds):
                on = {"token-aware": complete["token-aware"][k], "learned": complete["learned"][k]}
                pol: dict[str, Any] = {"learned": build_router("learned", seed=seed, **(learned_kw or {}))}
                if soft in complete:
                    on[soft] = complete[soft][k]
                    pol[soft] = softmax_policy("token-aware", a.ope_softmax, seed=seed)
                ope.append(ope_check(complete["learned"][k], on, seed=seed, policies=pol, min_ess=a.min_ess,
                                     reward_model=a.reward_model) | {"seed": seed})
            report["ope"] = ope
            report["ope_policies"] = [p for p in ("token-aware", soft, "learned") if p in ope[0]] if ope else []
            for target in ("token-aware", soft):
                entries = [o[target] for o in ope if target in o]
                if not entries:
                    continue
                if any(e.get("refused") for e in entries):
                    goals[f"OPE of {target} within ±5 %"] = (
                        f"refused on {sum(bool(e.get('refused')) for e in entries)} of {len(entries)} seeds "
                        f"(insufficient overlap, ESS < {a.min_ess:g}): the ±5 % criterion applies only where "
                        "the log overlaps the policy")
                    continue
                for m in ("snips", "dr", "switch_dr"):
                    errs = [e.get(f"{m}_error") for e in entries]
                    goals[f"OPE ({m.upper()}) of {target} within ±5 %"] = all(
                        x is not None and abs(x) <= 0.05 for x in errs)
    report["goals"] = goals
    if a.plot is not None and "regret" in report and "(per seed) p99 ratio" in goals:
        from benchmarks.learned_plots import plot_goals

        e2e: dict[str, list[float]] = {p: [] for p in complete if p != soft}
        failed = dict.fromkeys(e2e, 0)
        for p in e2e:
            for r in complete[p]:
                res = r.results
                if res is None:
                    continue
                for i, o in enumerate(res.outcome):
                    if o == _OK:
                        e2e[p].append(res.e2e[i])
                    else:
                        failed[p] += 1
        rows = [{"seed": s_["seed"], "regret": s_["regret"], "p99_ratio": ratio}
                for s_, ratio in zip(report["regret"]["per_seed"], goals["(per seed) p99 ratio"], strict=True)]
        report["plot"] = str(plot_goals(e2e, failed, rows, a.plot))
    report["wall_s"] = time.perf_counter() - t_start
    if a.json:
        json.dump(report, sys.stdout, indent=1, default=lambda x: None)
        print()
        return 0
    _print(report)
    return 0


def _print(r: dict[str, Any]) -> None:
    print(f"\n{'profile':18} {'e2e p50':>8} {'e2e p99':>8} {'TTFT p99':>9} {'goodput':>8} {'SLO %':>6} "
          f"{'not ok':>7} {'mean cost':>9}   (mean over {len(r['seeds'])} seeds; seconds, req/s)")
    for p, s in sorted(r["profiles"].items(), key=lambda kv: kv[1]["cost"]):
        print(f"{p:18} {_f(s['e2e_p50']):>8} {_f(s['e2e_p99']):>8} {_f(s['ttft_p99']):>9} {_f(s['goodput'], '.2f'):>8} "
              f"{_f(s['slo'] * 100, '.1f'):>6} {_f(s['not_ok'], '.0f'):>7} {_f(s['cost']):>9}")
    if "regret" in r:
        g = r["regret"]["pooled"]
        print(f"\nregret after {r['requests']} requests per seed (pooled): {g['regret']:+.2%} against {g['best']} "
              f"(learned {g['learned']:.3f} s vs {g['best_mean']:.3f} s mean cost); per seed: "
              + ", ".join(f"{x['seed']}: {x['regret']:+.2%} vs {x['best']}" for x in r["regret"]["per_seed"]))
    for o in r.get("ope", []):
        for pol in r.get("ope_policies", []):
            e = o.get(pol)
            if not e:
                continue
            parts = [f"{m.upper()} {e[m]['value']:.3f} [{e[m]['ci_low']:.3f}, {e[m]['ci_high']:.3f}] "
                     f"({e[m + '_error']:+.1%})" for m in ("snips", "dr", "switch_dr") if m in e]
            flag = "  REFUSED (insufficient overlap; withheld values shown)" if e.get("refused") else ""
            print(f"OPE seed {o['seed']} {pol:12} measured {e['measured']:.3f} s on the {o['logged']} logged rows "
                  f"(all rows {e['measured_all']:.3f}); " + "; ".join(parts) + f"; ESS {_f(e['ess'], '.0f')}{flag}")
    for k, v in r["goals"].items():
        print(f"goal {k}: {v if not isinstance(v, bool) else ('met' if v else 'NOT met')}")
    if r["skipped"]:
        print(f"skipped (wall-time bound): {', '.join(r['skipped'])}")
    if r.get("plot"):
        print(f"chart: {r['plot']}")
    print(f"wall {r['wall_s']:.1f} s")


if __name__ == "__main__":
    raise SystemExit(main())
