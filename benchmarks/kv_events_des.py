"""Cache routing fed by the engines' KV events against the gateway-side hash affinity, in the
discrete-event simulator (virtual time: deterministic, no host noise).

::

    python -m benchmarks.kv_events_des [--loads 0.5,0.8] [--seeds 1,2,3] [--lag 0.05] [--think 7]
                                       [--variants hash,kv,...] [--json OUT]

The fleet, the workload and the load are those of ``benchmarks.affinity_des`` (``cache4``: 4
``a100`` nodes with the emulator's prefix cache; ``chat-sessions`` closed loop, think 7 s, 240 s
with a 90 s warm-up; the load a share of the fleet's capacity without a cache). Every variant
routes with the ``affinity`` picker (profile ``prefix-affinity``); they differ in what it knows:

* ``hash``: the gateway-side hash only (the session id's HRW node, else the prompt's block 16);
* ``kv``: the caches publish their KV events (inferlb/simulator/prefix_cache.py ``sink``), which
  reach the gateway's index (inferlb/routing/kvindex.py) ``--lag`` seconds later; routing ranks
  by the leading blocks each node holds, HRW among equals (inferlb/simulator/des/kvfeed.py);
* ``kv-lag1``: the same with 1 s of lag (under the index's 2 s ``max_lag_s``: used, but late);
* ``kv-lag3``: 3 s of lag, over ``max_lag_s``: the index calls the streams lagging (or silent) and
  the decisions fall back to the hash;
* ``kv-drop``: node ``a100-0``'s stream dies at 120 s: its requests' decisions fall back to the
  hash once the index sees it silent (2 s after a request was sent there with no batch since);
* ``hash-nosession`` / ``kv-nosession``: clients that send no session id (the affinity key is
  then the prompt's own block 16: the shared system prompt's).

Nothing here is tuned: the index's defaults (``max_lag_s`` 2 s, ``recover_s`` 30 s) are fixed
before the run, and every seed is a test seed. Per variant and load, means over the seeds:
TTFT p50 / p99, e2e p99, the caches' hit rate (cached prompt tokens ÷ prompt tokens in full
blocks), the ideal hit rate (one unbounded cache), the decisions that used the index and those
that fell back (by reason), and TTFT p50 ÷ ``hash``'s (per seed, averaged).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.affinity_des import CLOSED_DURATION_S, CLOSED_THINK_S, CLOSED_WARMUP_S, run_affinity
from benchmarks.learned_goals import node_capacity
from inferlb.bench.loadgen.sessions import session_plan
from inferlb.bench.loadgen.workload import load_workload
from inferlb.routing.kvindex import KVIndex
from inferlb.simulator.des.kvfeed import KVFeed
from inferlb.simulator.presets import fleet_specs

__all__ = ["VARIANTS", "main", "run_variant"]

#: variant → (profile spec, feed: None or its (lag_s or None for --lag, drop_at, drop_nodes))
VARIANTS: dict[str, tuple[str, tuple[float | None, float | None, tuple[str, ...] | None] | None]] = {
    "hash": ("prefix-affinity", None),
    "kv": ("prefix-affinity", (None, None, None)),
    "kv-lag1": ("prefix-affinity", (1.0, None, None)),
    "kv-lag3": ("prefix-affinity", (3.0, None, None)),
    "kv-drop": ("prefix-affinity", (None, 120.0, ("a100-0",))),
    "hash-nosession": ("prefix-affinity:session=false", None),
    "kv-nosession": ("prefix-affinity:session=false", (None, None, None)),
}


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def run_variant(name: str, specs: Any, sessions: Any, w: Any, *, seed: int, duration_s: float,
                lag_s: float) -> dict[str, Any]:
    """One seeded closed-loop run of ``name`` (:data:`VARIANTS`); the summary of
    ``run_affinity`` plus the feed's counters (``kv``: None without a feed)."""
    spec, feed_args = VARIANTS[name]
    feed = None
    if feed_args is not None:
        lag, drop_at, drop_nodes = feed_args
        feed = KVFeed(KVIndex(), lag_s=lag_s if lag is None else lag, drop_at=drop_at, drop_nodes=drop_nodes)
    s = run_affinity(spec, specs, None, w, seed=seed, duration_s=duration_s, sessions=sessions, kv_feed=feed)
    s["kv"] = None if feed is None else {"used": feed.used, "fallbacks": dict(feed.fallbacks),
                                         "applied": feed.applied, "index_blocks": feed.index.total}
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kv_events_des", description=__doc__.split("\n")[0])
    ap.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 0.8])
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    ap.add_argument("--lag", type=float, default=0.05, help="seconds from an engine's event to the index")
    ap.add_argument("--think", type=float, default=CLOSED_THINK_S)
    ap.add_argument("--duration", type=float, default=CLOSED_DURATION_S)
    ap.add_argument("--variants", default="hash,kv,kv-lag1,kv-lag3,kv-drop,hash-nosession,kv-nosession")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; known: {', '.join(VARIANTS)}")
    w = load_workload("chat-sessions")
    w = w.model_copy(update={"warmup_s": CLOSED_WARMUP_S})
    specs = fleet_specs("cache4", [w.model])
    per_node = node_capacity("a100", w, seed=1, offered_rps=30.0)
    cap = per_node * len(specs)
    print(f"chat-sessions on cache4, closed loop, think {a.think:g} s; capacity without a cache {cap:.2f} req/s; "
          f"arrivals {a.duration:g} s, warm-up {w.warmup_s:g} s; seeds {a.seeds} (all test: nothing tuned); "
          f"index lag {a.lag:g} s", flush=True)
    print(f"{'load':>5} {'variant':15} {'TTFT p50':>9} {'p99':>7} {'e2e p99':>8} {'hit %':>6} {'ideal %':>7} "
          f"{'index used':>10} {'fallbacks':>22} {'TTFT÷hash':>9}")
    out: dict[str, Any] = {"capacity_rps": cap, "seeds": a.seeds, "lag_s": a.lag, "think_s": a.think, "loads": []}
    t0 = time.perf_counter()
    for load in a.loads:
        rate = load * cap
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for seed in a.seeds:
            sessions = session_plan(w, seed=seed, rate=rate, duration_s=a.duration, think_s=a.think)
            for v in variants:
                runs[v].append(run_variant(v, specs, sessions, w, seed=seed, duration_s=a.duration, lag_s=a.lag))
        base = runs[variants[0]]
        rows: dict[str, Any] = {}
        for v in variants:
            rs = runs[v]
            fb: dict[str, int] = {}
            used = 0
            for r in rs:
                if r["kv"] is not None:
                    used += r["kv"]["used"]
                    for k, n in r["kv"]["fallbacks"].items():
                        fb[k] = fb.get(k, 0) + n
            row = {"ttft_p50": _mean([r["ttft_s"]["p50"] for r in rs]),
                   "ttft_p99": _mean([r["ttft_s"]["p99"] for r in rs]),
                   "e2e_p99": _mean([r["e2e_s"]["p99"] for r in rs]),
                   "hit_rate": _mean([r["prefix_cache"]["hit_rate"] for r in rs]),
                   "ideal_hit_rate": _mean([r["ideal_hit_rate"] for r in rs]),
                   "index_used": used, "fallbacks": fb,
                   "ttft_p50_ratio": _mean([r["ttft_s"]["p50"] / b["ttft_s"]["p50"]
                                            for r, b in zip(rs, base, strict=True)]),
                   "not_ok": sum(r["measured"] - r["outcomes"]["ok"] for r in rs),
                   "requests": sum(r["measured"] for r in rs)}
            rows[v] = row
            fbs = ",".join(f"{k} {n}" for k, n in sorted(fb.items())) or "-"
            print(f"{load:5.2f} {v:15} {row['ttft_p50'] * 1e3:7.0f}ms {row['ttft_p99'] * 1e3:5.0f}ms "
                  f"{row['e2e_p99']:7.2f}s {row['hit_rate'] * 100:6.1f} {row['ideal_hit_rate'] * 100:7.1f} "
                  f"{used if runs[v][0]['kv'] is not None else '-':>10} {fbs:>22} {row['ttft_p50_ratio']:8.2f}×",
                  flush=True)
        out["loads"].append({"load": load, "rate_rps": rate, "variants": rows})
    print(f"({time.perf_counter() - t0:.1f} s of wall time)")
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
