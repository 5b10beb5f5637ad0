"""What prefix / session affinity costs per routing decision, at 10 / 100 / 1,000 nodes.

::

    python -m benchmarks.affinity_cost [--sizes 10,100,1000] [--budget-s 1.0] [--seed 1]

Per fleet size, ``Router.decide`` + ``Decision.to_json`` (what ``routing/select`` does per
request, apart from ``Fleet.views``) in microseconds (p50 / p99), over 8 prebuilt snapshots with
random loads (5 % of nodes unhealthy, capacities 16k-128k tokens), for:

- ``token-aware``: the default profile, the baseline of the same run;
- ``prefix-affinity, no key``: a short prompt without a session (ranked by score);
- ``prefix-affinity, session (hit)``: 64 sessions in turn, so a key's top-k HRW nodes are
  remembered (a conversation's next turn);
- ``prefix-affinity, new key``: a fresh session every decision (HRW over the model's whole pool);

and, once, ``block_hashes`` of a 16-block (1,024-character) prompt: what ``begin_request`` adds
per request when the router reads prefixes. Each case runs for about ``budget-s`` seconds
(at most 50,000 decisions). Single thread, GC on, as in the gateway.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable

from inferlb.routing.prefix import block_hashes, text_key
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeList, NodeView, RouteRequest

__all__ = ["main"]


def _views(n: int, rng: random.Random) -> NodeList:
    out = []
    for i in range(n):
        cap = rng.choice([16384, 32768, 65536, 131072])
        healthy = rng.random() >= 0.05
        out.append(NodeView(
            name=f"node{i:04d}", models=frozenset({"m0"}), capacity_tokens=cap, max_concurrency=64,
            inflight_requests=rng.randint(0, 40), inflight_tokens=rng.randint(0, cap // 2),
            waiting=rng.choice([None, rng.randint(0, 8)]), kv_usage=rng.choice([None, rng.random()]),
            healthy=healthy, unhealthy_reason=None if healthy else "ejected",
            tokens_per_s=rng.choice([None, rng.uniform(20, 120)]), rtt_ms=rng.uniform(0.2, 5.0)))
    return NodeList(out, {"m0": list(out)})


def _pct(ns: list[int], q: float) -> float:
    s = sorted(ns)
    return s[min(len(s) - 1, int(q * len(s)))] / 1e3


def _time(fn: Callable[[int], object], budget_s: float) -> tuple[float, float, int]:
    for i in range(200):   # warm-up
        fn(i)
    ns: list[int] = []
    end = time.perf_counter() + budget_s
    i = 0
    while i < 50_000 and time.perf_counter() < end:   # bounded in count and time
        t0 = time.perf_counter_ns()
        fn(i)
        ns.append(time.perf_counter_ns() - t0)
        i += 1
    return _pct(ns, 0.5), _pct(ns, 0.99), len(ns)


def _views_set(n: int, rng: random.Random) -> list[NodeList]:
    return [_views(n, rng) for _ in range(8)]


def _cases(snaps: list[NodeList], sessions: list[int], rng: random.Random,
           seed: int) -> list[tuple[str, Callable[[int], object]]]:
    base = build_router("token-aware", seed=seed)
    aff = build_router("prefix-affinity", seed=seed)
    short = RouteRequest("m0", 400, 256)
    return [
        ("token-aware", lambda i: base.decide(short, snaps[i % 8]).to_json()),
        ("prefix-affinity, no key", lambda i: aff.decide(short, snaps[i % 8]).to_json()),
        ("prefix-affinity, session (hit)", lambda i: aff.decide(
            RouteRequest("m0", 400, 256, session=sessions[i % 64]), snaps[i % 8]).to_json()),
        ("prefix-affinity, new key", lambda i: aff.decide(
            RouteRequest("m0", 400, 256, session=rng.getrandbits(64)), snaps[i % 8]).to_json()),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.affinity_cost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--budget-s", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    sessions = [text_key(f"session-{k}") for k in range(64)]
    print(f"{'case':34} {'nodes':>5} {'p50 µs':>8} {'p99 µs':>8} {'n':>7}")
    for n in (int(x) for x in a.sizes.split(",")):
        for name, fn in _cases(_views_set(n, rng), sessions, rng, a.seed):
            p50, p99, count = _time(fn, a.budget_s)
            print(f"{name:34} {n:5d} {p50:8.1f} {p99:8.1f} {count:7d}", flush=True)
    text = "You are a helpful assistant. " * 40
    p50, p99, count = _time(lambda i: block_hashes(text, 16), a.budget_s)
    print(f"{'block_hashes, 16 blocks':34} {'-':>5} {p50:8.1f} {p99:8.1f} {count:7d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
