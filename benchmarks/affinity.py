"""Prefix and session affinity against token-aware routing, at equal load, on multi-turn chat.

::

    python -m benchmarks.affinity [--profiles token-aware,prefix-affinity] [--rate 6] [--duration 45]
                                     [--fleet cache4] [--workload chat-sessions] [--seed 1] [--json OUT]

A profile may carry ``affinity`` picker parameters: ``prefix-affinity:epsilon=0.25+min_bound=1``.

Each profile gets a fresh node process (cold prefix caches: ``cache4`` is 4 ``a100``-like nodes
with a prefix cache each, inferlb/simulator/prefix_cache.py) and its own gateway; the same seeded
plan of the ``chat-sessions`` workload (shared system prompts, multi-turn sessions resending their
history, the session id in ``user``) is sent open loop to each, so the load is equal. Printed per
profile: TTFT p50 / p90 / p99, e2e p50 / p99, errors, and the nodes' prefix-cache hit rate (cached
prompt tokens ÷ prompt tokens in full blocks, from ``/sim/stats``); then TTFT p50 ÷ the first
profile's (the baseline, in the same run). Bounded: ``duration`` of arrivals per profile plus at
most the workload's timeout for the last answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from inferlb.bench.loadgen.procs import workdir
from inferlb.bench.loadgen.results import summarize
from inferlb.bench.loadgen.runner import run_plan
from inferlb.bench.loadgen.stack import Stack, gateway_fleet, node_overrides
from inferlb.bench.loadgen.workload import load_workload, plan

__all__ = ["main", "prefix_cache_totals"]


def prefix_cache_totals(node_urls: dict[str, str]) -> dict[str, Any]:
    """Sum of the nodes' prefix-cache counters (``/sim/stats`` → ``engine.prefix_cache``)."""
    q = h = 0
    for url in node_urls.values():
        with urllib.request.urlopen(url + "/sim/stats", timeout=5) as r:
            cache = json.loads(r.read()).get("engine", {}).get("prefix_cache") or {}
        q += int(cache.get("queries_tokens", 0))
        h += int(cache.get("hits_tokens", 0))
    return {"queries_tokens": q, "hits_tokens": h, "hit_rate": h / q if q else float("nan")}


def _target(spec: str) -> tuple[str, dict[str, Any]]:
    """``profile[:k=v+...]`` → (profile, affinity params)."""
    profile, _, rest = spec.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split("+")):
        k, _, v = item.partition("=")
        params[k] = float(v) if "." in v else int(v) if v.isdigit() else v
    return profile, params


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.affinity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", default="token-aware,prefix-affinity", help="the first is the baseline")
    ap.add_argument("--workload", default="chat-sessions")
    ap.add_argument("--fleet", default="cache4")
    ap.add_argument("--rate", type=float, default=6.0, help="requests per second (sessions × turns)")
    ap.add_argument("--duration", type=float, default=None, help="arrival window, s (default: the workload's)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stream-interval", type=int, default=8, help="tokens per SSE event (CPU of a small host)")
    ap.add_argument("--json", dest="json_out", type=Path)
    ap.add_argument("--workdir", type=Path)
    a = ap.parse_args(argv)
    w = load_workload(a.workload)
    duration = a.duration if a.duration is not None else w.duration_s
    reqs = plan(w, seed=a.seed, rate=a.rate, duration_s=duration)
    profiles = [p for p in a.profiles.split(",") if p]
    results: list[dict[str, Any]] = []
    with workdir(a.workdir) as wd:
        stack = Stack(wd, a.fleet, sim_args=node_overrides(None, a.stream_interval),
                      log=lambda m: print(time.strftime("%H:%M:%S"), m, file=sys.stderr, flush=True))
        try:
            for spec in profiles:
                profile, params = _target(spec)
                nodes = stack.start_nodes()
                fleet = gateway_fleet(stack.specs, nodes, profile, w, a.seed)
                if params:
                    fleet["routing"]["params"] = {"affinity": params}
                url = stack.start_gateway_with(f"gateway-{profile}", fleet)
                data = asyncio.run(run_plan(reqs, w, [url], label=spec, nodes=nodes, duration_s=duration))
                s = summarize(data, w)
                s["prefix_cache"] = prefix_cache_totals(nodes)
                results.append(s)
                print(f"{spec}: TTFT p50 {s['ttft_s']['p50'] * 1e3:.0f} ms, hit rate "
                      f"{s['prefix_cache']['hit_rate'] * 100:.1f} %", file=sys.stderr, flush=True)
                stack.stop_gateway()
        finally:
            stack.close()
    base = results[0]["ttft_s"]["p50"] if results else float("nan")
    measured = results[0]["measured"] if results else 0
    print(f"workload {w.name}, fleet {a.fleet}, rate {a.rate:g}/s, {duration:g} s, seed {a.seed}: "
          f"{len(reqs)} requests, {measured} measured (after {w.warmup_s:g} s warm-up)")
    print(f"{'profile':40} {'TTFT p50':>9} {'p90':>8} {'p99':>8} {'e2e p50':>8} {'e2e p99':>8} "
          f"{'ok':>5} {'errors':>7} {'hit %':>6} {'TTFT p50 ÷ base':>16}")
    for s in results:
        t, e, pc = s["ttft_s"], s["e2e_s"], s["prefix_cache"]
        print(f"{s['label']:40} {t['p50'] * 1e3:7.0f}ms {t['p90'] * 1e3:6.0f}ms {t['p99'] * 1e3:6.0f}ms "
              f"{e['p50']:7.2f}s {e['p99']:7.2f}s {s['ok']:5d} {sum(s['errors'].values()):7d} "
              f"{pc['hit_rate'] * 100:6.1f} {t['p50'] / base:15.2f}×")
    if a.json_out:
        a.json_out.write_text(json.dumps({"rate": a.rate, "duration_s": duration, "seed": a.seed,
                                          "fleet": a.fleet, "workload": w.name, "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
