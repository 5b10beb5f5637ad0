"""What prediction adds to one routing decision: the peer bench's routing measurement with the
``learned`` profile's predictor active, against ``token-aware``, in the same run.

``python -m benchmarks.learned_cost --routing-bench PATH/TO/routing_bench.py
[--nodes 100] [--iters 5000]``

Loads that script's ``bench(profile, n, iters)`` (decide alone, and select = ``Fleet.views()`` +
decide + ``Decision.to_json()``) and runs it for ``token-aware``, ``learned`` with its predictor
active (``min_samples`` 0: every decision predicts, explores and logs its propensity and context)
(the shipped setting: adaptive tail reservation, size-aware and prefill interference), ``learned``
while the predictor warms up (the token-aware fallback plus the pick's prediction), and ``learned``
with no term, with the interference term alone and with a fixed-cut tail reservation alone.
Prints p50 / p99 µs per decision.
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from inferlb.routing.profiles import LEARNED_LATENCY, build_router

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routing-bench", required=True)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--iters", type=int, default=5000)
    a = ap.parse_args(argv)
    spec = importlib.util.spec_from_file_location("routing_bench", a.routing_bench)
    assert spec is not None and spec.loader is not None
    rb: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rb)
    # Each variant's predicted-latency params in full (merged over the profile's own, so the
    # terms a variant leaves out are off rather than the shipped ones).
    off = {"reserve": 0.0, "interference": 0.0, "interference_max_output": None, "prefill_interference": 0.0,
           "reserve_quantile": None}
    variants: dict[str, tuple[str, Any, Any]] = {
        "token-aware": ("token-aware", None, None),
        # the shipped profile: adaptive tail reservation, size-aware and prefill interference
        "learned (active)": ("learned", {"min_samples": 0}, {"predicted-latency": dict(LEARNED_LATENCY)}),
        "learned (warming)": ("learned", {"min_samples": 10**9}, None),
        # the predictor alone, no term (the profile before docs/benchmarks.md's "sixth pass")
        "learned (no terms)": ("learned", {"min_samples": 0}, {"predicted-latency": off}),
        # the interference term alone, with the predictor's learned elasticity
        "learned+interference": ("learned", {"min_samples": 0},
                                 {"predicted-latency": {**off, "interference": 1.0, "elasticity": None}}),
        # the tail reservation alone, a fixed cut; the request is short, so it is charged
        "learned+reserve": ("learned", {"min_samples": 0},
                            {"predicted-latency": {**off, "reserve": 0.7, "reserve_min_output": 700,
                                                   "reserve_fast": 0.1}})}
    print(f"{'variant':20} {'nodes':>5} {'decide p50':>10} {'p99':>7} {'select p50':>10} {'p99':>7}  µs")
    for label, (profile, predictor, params) in variants.items():
        def make(p: str, seed: int | None = None, _pred: Any = predictor, _params: Any = params, **kw: Any) -> Any:
            return build_router(p, seed=seed, predictor=_pred, params=_params, **kw)

        rb.build_router = make
        r = rb.bench(profile, a.nodes, a.iters)
        d, s = r["decide"], r["select"]
        print(f"{label:20} {a.nodes:5d} {d['p50_us']:10.1f} {d['p99_us']:7.1f} {s['p50_us']:10.1f} "
              f"{s['p99_us']:7.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
