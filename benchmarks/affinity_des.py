"""Prefix / session affinity and the ``rtt`` scorer, measured in the discrete-event simulator
(virtual time: deterministic, no host noise).

::

    python -m benchmarks.affinity_des [--loads 0.5,0.8] [--seeds 1,2,3] [--duration S] [--warmup S]
                                         [--sessions closed|open] [--think S]
                                         [--profiles token-aware,prefix-affinity] [--rtt-loads 0.2,0.4,0.6,0.8,0.95]
                                         [--no-rtt] [--prompt-only] [--json OUT]

``--sessions closed`` (the default) runs the sessions closed loop, as chat users send:
sessions start open loop (Poisson, the same seeded sessions for every profile) and each next turn
leaves ``--think`` seconds (mean, exponential, drawn in the plan; default 7 s) after the client
received the previous answer in full (:class:`~inferlb.simulator.des.closed.ClosedLoop`); a turn that
is not ok ends its session; turns due after ``--duration`` (default 240 s, warm-up 90 s) are not
sent. ``--sessions open`` replays the workload's open-loop plan (a turn leaves ``think_s``, 2 s,
after the previous *send*, so most follow-up turns leave before the previous answer has ended and
cannot hit its blocks; default 120 s, the workload's 15 s warm-up), the older measurement.
A profile may carry ``affinity`` picker parameters: ``prefix-affinity:epsilon=0.25+min_bound=1``.

**Affinity.** The fleet is ``cache4`` (4 ``a100`` nodes, each with the emulator's prefix cache,
inferlb/simulator/prefix_cache.py, behind the simulation's ``prefill_cached`` hook:
:class:`~inferlb.simulator.des.prefix.PrefixCaches`; a completed request leaves its prompt and its answer
cached, as vLLM keeps a finished sequence's decoded blocks; ``--prompt-only``: prompts alone, the
older model); the workload ``chat-sessions`` (8 shared 2,000-token
system prompts, 4-10 turns a session resending the history, the session id in ``user``), planned
with the same seed for every profile, so the offered load is equal (closed loop, the achieved
arrival rate also depends a little on each profile's latency and is reported per profile:
"achieved", measured arrivals ÷ the measured window). The load is a share of the fleet's
*capacity without a cache*: 4 × the saturated throughput of one ``a100`` node in the DES on this
workload with no prefix cache (what the fleet serves if nothing were ever reused, so no profile is
overloaded at a load below 1). Per profile and load, means over the seeds: TTFT p50 / p99, e2e p50
/ p99, goodput (requests within the workload's SLO a second), the caches' hit rate (cached prompt
tokens ÷ prompt tokens in full blocks), and where TTFT goes: the median uncached prompt tokens, the
median time their prefill takes on the node (uncached × the engine's ``prefill_s_per_token``), and
the median of the rest (TTFT − that prefill: waiting for the running step to end, the step's own
base and per-context cost, queueing), and "early": the share of follow-up turns sent before their
session's previous answer had ended (0 closed loop; open loop the plan sends turns ``think_s``
after the previous *send*). The offered rate is the session start rate × the mean turns a
session, the same in both modes.
The *ideal* hit rate is one cache of unbounded size that saw every prompt in order, each followed
at once by its answer (no routing can do better; closed loop, over the turns each run sent);
TTFT p50 ratios are per seed, then averaged.

**RTT.** A fleet of 2 near ``a100`` nodes and 2 far (edge) ones whose round trip is
``--far-delay`` (``NodeSpec.network_delay_s``: added to the client's TTFT and e2e, and fed to the
gateway's ``rtt_ms`` view by the scrapes); the workload ``chat`` with lighter tails (``_EDGE``).
``token-aware`` against ``token-aware`` + ``rtt`` ×1: the share of requests the far nodes serve,
and TTFT p50, at loads given as a share of the whole fleet's capacity (so at a load above 0.5 the
near nodes alone cannot serve it).

Bounded: a run is a fixed plan in virtual time; the whole default run takes ~20-30 s of CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.affinity import _target
from benchmarks.learned_goals import node_capacity
from inferlb.bench.des_report import des_summary
from inferlb.bench.loadgen.sessions import prompt_text, session_plan
from inferlb.bench.loadgen.workload import PlannedRequest, Workload, load_workload, plan
from inferlb.routing.profiles import PROFILES, build_router
from inferlb.simulator.des.closed import ClosedLoop, Session
from inferlb.simulator.des.kvfeed import KVFeed
from inferlb.simulator.des.prefix import PrefixCaches, PromptInfo
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.openai_format import answer_text
from inferlb.simulator.prefix_cache import PrefixCache, finished_sequence
from inferlb.simulator.presets import fleet_specs, preset_spec
from inferlb.simulator.spec import NodeSpec

__all__ = ["des_prompt", "ideal_hit_rate", "main", "near_far_fleet", "run_affinity", "run_rtt"]

_OK = 0   # OUTCOMES.index("ok")
# Closed-loop sessions (docs/benchmarks.md, "Closed-loop chat sessions in the DES"): the mean think
# time after an answer, exponential; the arrival window and its warm-up, long enough that sessions
# started at 0 (7 turns of ~2.5 s answer + 7 s think on average, up to 10) have reached their
# steady-state count before the measurement starts.
CLOSED_THINK_S = 7.0
CLOSED_DURATION_S = 240.0
CLOSED_WARMUP_S = 90.0
# The RTT part's workload: chat-like, with chat-sessions' answer lengths (a light tail, so a
# node's saturated throughput in requests a second is a stable capacity).
_EDGE: dict[str, Any] = {"name": "edge-chat", "prompt_tokens": {"dist": "lognormal", "median": 400, "sigma": 0.5,
                                                                 "max": 4000},
                         "output_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.5, "max": 600},
                         "slo": {"ttft_s": 1.0, "e2e_s": 20.0}, "warmup_s": 10.0, "timeout_s": 60.0}


def des_prompt(r: Any) -> PromptInfo | None:
    """A planned request's prompt for the DES: a chat turn's joined text and session id (sent in
    ``user`` when the workload sends it); None for a request without a chat turn."""
    turn = getattr(r, "chat", None)
    if turn is None:
        return None
    return PromptInfo(prompt_text(turn), turn.session if turn.send_session else None)


def ideal_hit_rate(reqs: Sequence[PlannedRequest], *, decoded: bool = True) -> float:
    """Hit rate of one unbounded cache that saw every prompt in order (an upper bound for routing),
    with ``decoded`` each followed at once by its answer (before any later turn could resend it)."""
    c = PrefixCache(1 << 40)
    for r in reqs:
        info = des_prompt(r)
        if info is not None:
            c.lookup(info.text)
            if decoded:
                c.insert(finished_sequence(info.text, answer_text(r.output_tokens)))
    return c.hits_tokens / c.queries_tokens if c.queries_tokens else math.nan


def early_turns(reqs: Sequence[PlannedRequest], e2e: Sequence[float], warmup_s: float) -> float:
    """Share of the measured follow-up turns sent before their session's previous turn had been
    answered to the end (that answer cannot be in any cache yet); NaN: none."""
    ended: dict[tuple[str, int], float] = {}
    for r, d in zip(reqs, e2e, strict=False):
        if r.chat is not None:
            ended[(r.chat.session, len(r.chat.turns))] = r.t + d
    early = total = 0
    for r in reqs:
        if r.chat is None or len(r.chat.turns) < 2 or r.t < warmup_s:
            continue
        prev = ended.get((r.chat.session, len(r.chat.turns) - 1))
        if prev is None or math.isnan(prev):
            continue
        total += 1
        early += r.t < prev
    return early / total if total else math.nan


def _p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def run_affinity(spec: str, specs: Sequence[NodeSpec], reqs: Sequence[PlannedRequest] | None, w: Workload, *,
                 seed: int, duration_s: float, decoded: bool = True,
                 sessions: Sequence[Session] | None = None, kv_feed: KVFeed | None = None) -> dict[str, Any]:
    """One seeded DES run of ``reqs`` (open loop) or of ``sessions`` (closed loop:
    :class:`~inferlb.simulator.des.closed.ClosedLoop`, no turn sent at or after ``duration_s``; then
    ``reqs`` is ignored) routed by ``spec`` (``profile[:k=v+...]``) with per-node prefix caches
    (``decoded``: a completed answer is cached too): the summary of
    :func:`~.des_report.des_summary` plus the cache and TTFT figures, the achieved arrival rate
    (``achieved_rps``: measured arrivals ÷ the measured window) and, closed loop, the turns not
    sent (``abandoned`` after a turn that was not ok, ``cut`` past the window) and the ideal hit
    rate of the turns this run sent. ``kv_feed``: the caches publish KV events into it and routing
    reads its index (benchmarks/kv_events_des.py)."""
    profile, params = _target(spec)
    router = build_router(profile, seed=seed, params={"affinity": params} if params else None)
    caches = PrefixCaches(des_prompt, decoded=decoded, sink_of=kv_feed.sink_for if kv_feed is not None else None)
    t0 = time.perf_counter()
    extra: dict[str, Any] = {}
    if sessions is not None:
        closed = ClosedLoop(specs, router=router, seed=seed, model=w.model, timeout_s=w.timeout_s,
                            prefill_cached=caches)
        if kv_feed is not None:
            closed.kv_feed = kv_feed
            kv_feed.clock = lambda: closed.now
        res = closed.run_sessions(sessions, stop_s=duration_s)
        reqs = closed.requests
        extra = {"abandoned": closed.abandoned, "cut": closed.cut,
                 "ideal_hit_rate": ideal_hit_rate(reqs, decoded=decoded)}
    else:
        if reqs is None:
            raise ValueError("reqs or sessions")
        sim = Simulation(specs, router=router, seed=seed, model=w.model, timeout_s=w.timeout_s,
                         prefill_cached=caches)
        if kv_feed is not None:
            sim.kv_feed = kv_feed
            kv_feed.clock = lambda: sim.now
        res = sim.run(reqs)
    wall = time.perf_counter() - t0
    s = des_summary(res, w, duration_s=duration_s)
    per_token = {n.name: (n.batching.prefill_s_per_token if n.batching is not None else n.prefill_s_per_token)
                 for n in specs}
    names = [n.name for n in res.nodes]
    uncached: list[float] = []
    prefill: list[float] = []
    rest: list[float] = []
    for i in range(len(res.t)):
        if res.t[i] < w.warmup_s or res.outcome[i] != _OK or not res.stream[i] or math.isnan(res.ttft[i]):
            continue
        u = res.prompt_tokens[i] - caches.cached.get(i, 0)
        p = u * per_token[names[res.node[i]]]
        uncached.append(u)
        prefill.append(p)
        rest.append(res.ttft[i] - p)
    s.update(extra)
    s.update({"label": spec, "seed": seed, "wall_s": wall, "prefix_cache": caches.totals(),
              "achieved_rps": s["offered_rps"],
              "early_turns": early_turns(reqs, res.e2e, w.warmup_s),
              "ttft_parts": {"uncached_tokens_p50": _p50(uncached), "prefill_s_p50": _p50(prefill),
                             "rest_s_p50": _p50(rest)}})
    return s


def near_far_fleet(far_delay_s: float, model: str, n_near: int = 2, n_far: int = 2) -> list[NodeSpec]:
    """``near-i`` (no network delay) and ``far-i`` (``far_delay_s`` round trip) ``a100`` nodes."""
    return ([preset_spec(f"near-{i}", "a100", [model]) for i in range(n_near)]
            + [preset_spec(f"far-{i}", "a100", [model], network_delay_s=far_delay_s) for i in range(n_far)])


def run_rtt(specs: Sequence[NodeSpec], reqs: Sequence[PlannedRequest], w: Workload, *, seed: int,
            duration_s: float, rtt_weight: float) -> dict[str, Any]:
    """``token-aware``, plus the ``rtt`` scorer at ``rtt_weight`` (0: none), over ``reqs``: the
    share of the routed requests the ``far-*`` nodes served, and the summary."""
    scorers = dict(PROFILES["token-aware"].scorers)
    if rtt_weight > 0:
        scorers["rtt"] = rtt_weight
    router = build_router("token-aware", seed=seed, scorers=scorers)
    sim = Simulation(specs, router=router, seed=seed, model=w.model, timeout_s=w.timeout_s)
    res = sim.run(reqs)
    far = {k for k, n in enumerate(res.nodes) if n.name.startswith("far-")}
    routed = [res.node[i] for i in range(len(res.t)) if res.t[i] >= w.warmup_s and res.node[i] >= 0]
    s = des_summary(res, w, duration_s=duration_s)
    s["far_share"] = sum(1 for k in routed if k in far) / len(routed) if routed else math.nan
    return s


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _affinity_part(a: argparse.Namespace, out: dict[str, Any]) -> None:
    w = load_workload("chat-sessions")
    assert w.sessions is not None
    closed = a.sessions == "closed"
    # The load's yardstick is measured on the unchanged workload in both modes (the request mix,
    # not the timing, sets a node's throughput without a cache); open loop with --think measures it
    # on its own plan, as it always did.
    open_think = w.sessions.think_s
    if not closed and a.think is not None:
        w = w.model_copy(update={"sessions": w.sessions.model_copy(update={"think_s": a.think})})
        open_think = a.think
    specs = fleet_specs("cache4", [w.model])
    t0 = time.perf_counter()
    per_node = node_capacity("a100", w, seed=1, offered_rps=30.0)
    cap = per_node * len(specs)
    duration = a.duration if a.duration is not None else (CLOSED_DURATION_S if closed else 120.0)
    if a.warmup is not None:
        w = w.model_copy(update={"warmup_s": a.warmup})
    elif closed:
        w = w.model_copy(update={"warmup_s": CLOSED_WARMUP_S})
    think = (a.think if a.think is not None else CLOSED_THINK_S) if closed else open_think
    if not duration > w.warmup_s:
        raise SystemExit("the arrival window must be longer than the warm-up")
    print(f"chat-sessions on cache4: capacity without a cache {cap:.2f} req/s (4 × {per_node:.2f}, one a100 "
          f"saturated in the DES, {time.perf_counter() - t0:.1f} s); arrivals {duration:g} s, warm-up "
          f"{w.warmup_s:g} s, seeds {a.seeds}; cached: {'prompts only' if a.prompt_only else 'prompts and answers'}; "
          f"sessions {a.sessions} loop, think {think:g} s (mean, exponential) after each "
          f"{'answer' if closed else 'send'}", flush=True)
    profiles = [p for p in a.profiles.split(",") if p]
    print(f"{'load':>5} {'rate':>5} {'profile':44} {'achieved':>8} {'TTFT p50':>9} {'p99':>7} {'e2e p50':>8} "
          f"{'p99':>6} {'goodput':>8} {'hit %':>6} {'ideal %':>7} {'uncached':>8} {'prefill':>8} {'rest':>7} "
          f"{'TTFT÷base':>9} {'early %':>7}")
    loads: list[dict[str, Any]] = []
    for load in a.loads:
        rate = load * cap
        runs: dict[str, list[dict[str, Any]]] = {p: [] for p in profiles}
        ideal: list[float] = []
        for seed in a.seeds:
            if closed:
                sessions = session_plan(w, seed=seed, rate=rate, duration_s=duration, think_s=think)
                for p in profiles:
                    runs[p].append(run_affinity(p, specs, None, w, seed=seed, duration_s=duration,
                                                decoded=not a.prompt_only, sessions=sessions))
                continue
            reqs = plan(w, seed=seed, rate=rate, duration_s=duration)
            ideal.append(ideal_hit_rate(reqs, decoded=not a.prompt_only))
            for p in profiles:
                runs[p].append(run_affinity(p, specs, reqs, w, seed=seed, duration_s=duration,
                                            decoded=not a.prompt_only))
        base = runs[profiles[0]]
        rows: dict[str, Any] = {}
        for p in profiles:
            rs = runs[p]
            ratio = _mean([r["ttft_s"]["p50"] / b["ttft_s"]["p50"] for r, b in zip(rs, base, strict=True)])
            row = {"achieved_rps": _mean([r["achieved_rps"] for r in rs]),
                   "ttft_p50": _mean([r["ttft_s"]["p50"] for r in rs]),
                   "ttft_p99": _mean([r["ttft_s"]["p99"] for r in rs]),
                   "e2e_p50": _mean([r["e2e_s"]["p50"] for r in rs]), "e2e_p99": _mean([r["e2e_s"]["p99"] for r in rs]),
                   "goodput_rps": _mean([r["goodput_rps"] for r in rs]),
                   "hit_rate": _mean([r["prefix_cache"]["hit_rate"] for r in rs]),
                   "ideal_hit_rate": _mean([r["ideal_hit_rate"] for r in rs]) if closed else _mean(ideal),
                   "uncached_tokens_p50": _mean([r["ttft_parts"]["uncached_tokens_p50"] for r in rs]),
                   "prefill_s_p50": _mean([r["ttft_parts"]["prefill_s_p50"] for r in rs]),
                   "rest_s_p50": _mean([r["ttft_parts"]["rest_s_p50"] for r in rs]),
                   "ttft_p50_ratio": ratio, "per_seed_ttft_p50": [r["ttft_s"]["p50"] for r in rs],
                   "early_turns": _mean([r["early_turns"] for r in rs]),
                   "abandoned": sum(r.get("abandoned", 0) for r in rs), "cut": sum(r.get("cut", 0) for r in rs),
                   "requests": sum(r["measured"] for r in rs), "not_ok": sum(r["measured"] - r["outcomes"]["ok"]
                                                                            for r in rs)}
            rows[p] = row
            print(f"{load:5.2f} {rate:5.2f} {p:44} {row['achieved_rps']:8.2f} {row['ttft_p50'] * 1e3:7.0f}ms "
                  f"{row['ttft_p99'] * 1e3:5.0f}ms {row['e2e_p50']:7.2f}s {row['e2e_p99']:5.2f}s "
                  f"{row['goodput_rps']:8.2f} {row['hit_rate'] * 100:6.1f} {row['ideal_hit_rate'] * 100:7.1f} "
                  f"{row['uncached_tokens_p50']:8.0f} {row['prefill_s_p50'] * 1e3:6.0f}ms "
                  f"{row['rest_s_p50'] * 1e3:5.0f}ms {ratio:8.2f}× {row['early_turns'] * 100:7.1f}", flush=True)
        loads.append({"load": load, "rate_rps": rate,
                      "ideal_hit_rate": _mean([rows[p]["ideal_hit_rate"] for p in profiles]), "profiles": rows})
    out["affinity"] = {"capacity_rps": cap, "per_node_rps": per_node, "duration_s": duration,
                       "warmup_s": w.warmup_s, "seeds": a.seeds, "sessions": a.sessions,
                       "decoded_cached": not a.prompt_only, "think_s": think, "loads": loads}


def _rtt_part(a: argparse.Namespace, out: dict[str, Any]) -> None:
    w = Workload.model_validate(_EDGE)
    specs = near_far_fleet(a.far_delay, w.model)
    per_node = node_capacity("a100", w, seed=1, offered_rps=40.0)
    cap = per_node * len(specs)
    print(f"\nRTT: 2 near + 2 far a100 (round trip {a.far_delay * 1e3:.0f} ms), {w.name}; fleet capacity "
          f"{cap:.1f} req/s (4 × {per_node:.2f}); near nodes alone: load 0.5; seeds {a.seeds}", flush=True)
    print(f"{'load':>5} {'rate':>5} {'far share, token-aware':>23} {'+ rtt ×1':>9}   {'TTFT p50':>9} {'+ rtt':>7}"
          f"   {'e2e p99':>7} {'+ rtt':>6}   far share with rtt")
    rows: list[dict[str, Any]] = []
    duration = a.duration if a.duration is not None else 120.0
    for load in a.rtt_loads:
        rate = load * cap
        base: list[dict[str, Any]] = []
        rtt: list[dict[str, Any]] = []
        for seed in a.seeds:
            reqs = plan(w, seed=seed, rate=rate, duration_s=duration)
            base.append(run_rtt(specs, reqs, w, seed=seed, duration_s=duration, rtt_weight=0.0))
            rtt.append(run_rtt(specs, reqs, w, seed=seed, duration_s=duration, rtt_weight=1.0))
        row = {"load": load, "rate_rps": rate, "far_share": _mean([r["far_share"] for r in base]),
               "far_share_rtt": _mean([r["far_share"] for r in rtt]),
               "ttft_p50": _mean([r["ttft_s"]["p50"] for r in base]),
               "ttft_p50_rtt": _mean([r["ttft_s"]["p50"] for r in rtt]),
               "e2e_p99": _mean([r["e2e_s"]["p99"] for r in base]),
               "e2e_p99_rtt": _mean([r["e2e_s"]["p99"] for r in rtt])}
        rows.append(row)
        bar = "#" * round(row["far_share_rtt"] * 40)
        print(f"{load:5.2f} {rate:5.1f} {row['far_share'] * 100:22.1f}% {row['far_share_rtt'] * 100:8.1f}%   "
              f"{row['ttft_p50'] * 1e3:7.0f}ms {row['ttft_p50_rtt'] * 1e3:5.0f}ms   {row['e2e_p99']:6.2f}s "
              f"{row['e2e_p99_rtt']:5.2f}s   |{bar:<20}|", flush=True)
    out["rtt"] = {"capacity_rps": cap, "far_delay_s": a.far_delay, "workload": _EDGE, "loads": rows}


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.affinity_des", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", default="token-aware,prefix-affinity", help="the first is the baseline")
    ap.add_argument("--loads", type=_floats, default=[0.5, 0.8], help="shares of the no-cache capacity")
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",") if x], default=[1, 2, 3])
    ap.add_argument("--duration", type=float, default=None,
                    help=f"arrival window, virtual s (default {CLOSED_DURATION_S:g} with closed sessions, else 120)")
    ap.add_argument("--warmup", type=float, default=None,
                    help=f"the affinity part's warm-up, s (default {CLOSED_WARMUP_S:g} closed, the workload's open)")
    ap.add_argument("--sessions", choices=("closed", "open"), default="closed",
                    help="closed: a turn leaves a think time after the previous answer ended; open: after the "
                         "previous send (the workload's plan)")
    ap.add_argument("--rtt-loads", type=_floats, default=[0.2, 0.4, 0.6, 0.8, 0.95])
    ap.add_argument("--far-delay", type=float, default=0.05, help="the far nodes' round trip, s")
    ap.add_argument("--no-rtt", action="store_true", help="skip the RTT part")
    ap.add_argument("--no-affinity", action="store_true", help="skip the affinity part")
    ap.add_argument("--prompt-only", action="store_true",
                    help="the nodes' caches keep prompts only, not the answers they generated (the older model)")
    ap.add_argument("--think", type=float, default=None,
                    help=f"the sessions' mean think time, s (default: {CLOSED_THINK_S:g} closed, the workload's open)")
    ap.add_argument("--json", dest="json_out", type=Path)
    a = ap.parse_args(argv)
    if len(a.seeds) < 1 or (a.duration is not None and a.duration <= 0) or (a.warmup is not None and a.warmup < 0):
        ap.error("at least one seed and a positive duration")
    if a.think is not None and not a.think > 0:
        ap.error("--think must be > 0")
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    if not a.no_affinity:
        _affinity_part(a, out)
    if not a.no_rtt:
        _rtt_part(a, out)
    print(f"\n({time.perf_counter() - t0:.1f} s of wall time)", file=sys.stderr)
    if a.json_out:
        a.json_out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
