"""What a gated routing reload spends judging: :func:`~inferlb.routing.gate.judge` over a
synthetic log of the ``learned`` profile's decisions (5 candidates each, JSON as the audit keeps it).

``python -m benchmarks.policy_gate [--decisions 2000,10000] [--bootstrap 200]``

For each log size: building the log is not timed; then one ``judge`` of ``token-aware`` against
the logging policy (its baseline measured) and one against ``round-robin`` (two estimates), each
timed once with ``time.perf_counter``. The audit read is not in it (learned/audit.py does
one indexed scan). Prints seconds per judgement and per 1,000 decisions.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from inferlb.routing.gate import EvaluationRequirement, judge
from inferlb.routing.ope_replay import LoggedDecision
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeView, RouteRequest

__all__ = ["main", "synthetic_log"]


def synthetic_log(n: int, seed: int = 1) -> list[LoggedDecision]:
    """``n`` decisions of ``learned`` (ε 0.5) on random 5-node contexts, each costed by a fixed law."""
    rng = random.Random(seed)
    router = build_router("learned", seed=seed, predictor={"min_samples": 0},
                          params={"softmax-bandit": {"epsilon": 0.5, "temperature": 0.2}})
    out = []
    for _ in range(n):
        views = [NodeView(name=f"n{k}", models=frozenset({"m"}), capacity_tokens=100_000, max_concurrency=64,
                          inflight_requests=rng.randrange(10), inflight_tokens=rng.randrange(10) * 500,
                          tokens_per_s=rng.uniform(10, 100), ttft_s=rng.uniform(0.05, 0.4)) for k in range(5)]
        req = RouteRequest("m", rng.randrange(50, 500), rng.randrange(50, 300), stream=True)
        d = router.decide(req, views)
        v = next(x for x in views if x.name == d.pick)
        cost = (v.ttft_s or 0.2) * (1 + v.inflight_requests / 5) + req.output_tokens / (v.tokens_per_s or 20)
        out.append(LoggedDecision("m", json.loads(json.dumps(d.to_json()["learned"])), cost))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decisions", default="2000,10000")
    ap.add_argument("--bootstrap", type=int, default=200)
    a = ap.parse_args(argv)
    req = EvaluationRequirement(bootstrap=a.bootstrap)
    print(f"{'decisions':>9} {'baseline':>9} {'seconds':>8} {'s / 1k':>7}  verdict")
    for n in (int(x) for x in a.decisions.split(",")):
        log = synthetic_log(n)
        for name, current, logged in (("measured", "learned", True), ("estimate", "round-robin", False)):
            t0 = time.perf_counter()
            v = judge(log, build_router("token-aware", seed=1), build_router(current, seed=1), req,
                      current_logged=logged)
            dt = time.perf_counter() - t0
            print(f"{n:>9} {name:>9} {dt:>8.2f} {dt * 1000 / n:>7.3f}  {'passed' if v['passed'] else 'refused'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
