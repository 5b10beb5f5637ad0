"""Figures of one run: goodput, latency percentiles, errors by class, share per node, node figures.

Contract: :func:`summarize` is pure (``RunData`` + ``Workload`` → a JSON-able dict). Definitions:

- *good*: HTTP 200, every expected token, ``e2e ≤ slo.e2e_s`` and, for streams, ``TTFT ≤ slo.ttft_s``;
  goodput = good requests / measured window (the arrival window after ``warmup_s``);
- latency percentiles are over successful requests sent after the warm-up: TTFT (streams; first
  token as the client reads it), TPOT = (e2e − TTFT) / (tokens − 1), e2e;
- ``share``: successful requests per answering node; ``nodes``: per node, the increase of its
  preemptions, OOM crashes and crashes over the run, and the mean / max of its KV use and queue
  from the ``/sim/stats`` samples;
- ``lag_p99_s``: how late the generator sent (high values: the client, not the fleet, was the limit).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from inferlb.bench.loadgen.runner import Outcome, RunData, Sample
from inferlb.bench.loadgen.workload import Workload
from inferlb.store.sla import percentile

__all__ = ["is_good", "node_figures", "pcts", "summarize"]


def _or_nan(v: float | None) -> float:
    """NaN for "no value" (JSON-able, and shown as a dash in the reports)."""
    return float("nan") if v is None else v


def pcts(values: Iterable[float], scale: float = 1.0) -> dict[str, float]:
    """p50 / p90 / p95 / p99 / max / mean (times ``scale``) and the count (NaN when empty)."""
    s = sorted(v * scale for v in values)
    nan = float("nan")
    return {"p50": _or_nan(percentile(s, 0.5)), "p90": _or_nan(percentile(s, 0.9)),
            "p95": _or_nan(percentile(s, 0.95)), "p99": _or_nan(percentile(s, 0.99)),
            "max": s[-1] if s else nan, "mean": sum(s) / len(s) if s else nan, "n": len(s)}


def is_good(o: Outcome, w: Workload) -> bool:
    if not o.ok or o.e2e > w.slo.e2e_s:
        return False
    return not (o.stream and (o.ttft is None or o.ttft > w.slo.ttft_s))


def node_figures(samples: list[Sample]) -> dict[str, dict[str, Any]]:
    """Per node, over the run: what its counters grew by (requests, preemptions, crashes) and its
    mean / max queue, KV use and running count."""
    by: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by[s.node].append(s)
    out: dict[str, dict[str, Any]] = {}
    for node, ss in sorted(by.items()):
        ss.sort(key=lambda s: s.t)
        first, last = ss[0], ss[-1]
        out[node] = {
            "preemptions": last.preemptions - first.preemptions,
            "oom_crashes": last.oom_crashes - first.oom_crashes,
            "crashes": last.crashes - first.crashes,
            "requests": last.requests_total - first.requests_total,
            "kv_usage_mean": sum(s.kv_usage for s in ss) / len(ss),
            "kv_usage_max": max(s.kv_usage for s in ss),
            "waiting_mean": sum(s.waiting for s in ss) / len(ss),
            "waiting_max": max(s.waiting for s in ss),
            "running_mean": sum(s.running for s in ss) / len(ss),
            "loading_samples": sum(1 for s in ss if s.loading),
            "samples": len(ss),
        }
    return out


def _timeline(outcomes: list[Outcome], bucket_s: float) -> dict[str, Any]:
    """Per-node answered requests per time bucket (by send time), for the share-over-time chart."""
    if not outcomes:
        return {"bucket_s": bucket_s, "t": [], "nodes": {}}
    n_buckets = int(max(o.t for o in outcomes) // bucket_s) + 1
    nodes: dict[str, list[int]] = defaultdict(lambda: [0] * n_buckets)
    for o in outcomes:
        if o.ok and o.node:
            nodes[o.node][int(o.t // bucket_s)] += 1
    return {"bucket_s": bucket_s, "t": [i * bucket_s for i in range(n_buckets)], "nodes": dict(sorted(nodes.items()))}


def _steady(data: RunData) -> dict[str, Any]:
    """CPU share of one core per watched process, and streams running on the nodes, over the
    second half of the arrival window (the ramp-up and the drain left out)."""
    lo, hi = data.duration_s * 0.5, data.duration_s
    cpu = [(t, c) for t, c in data.cpu if lo <= t <= hi]
    share: dict[str, float] = {}
    if len(cpu) >= 2:
        (t0, c0), (t1, c1) = cpu[0], cpu[-1]
        share = {k: (c1[k] - c0[k]) / (t1 - t0) for k in c1 if k in c0 and t1 > t0}
    by_t: dict[float, int] = defaultdict(int)
    for s in data.samples:
        if lo <= s.t <= hi:
            by_t[round(s.t)] += s.running
    running = list(by_t.values())
    return {"from_s": lo, "to_s": hi, "cpu_core_share": share,
            "running_mean": sum(running) / len(running) if running else float("nan"),
            "running_max": max(running) if running else 0}


def summarize(data: RunData, w: Workload, *, timeline_bucket_s: float = 5.0) -> dict[str, Any]:
    """The figures of one run (see the module docstring)."""
    measured = [o for o in data.outcomes if o.t >= w.warmup_s]
    window = max(1e-9, data.duration_s - w.warmup_s)
    ok = [o for o in measured if o.ok]
    good = [o for o in measured if is_good(o, w)]
    errors = Counter(o.error for o in measured if o.error is not None)
    ttft = [o.ttft for o in ok if o.ttft is not None]
    tpot = [(o.e2e - o.ttft) / (o.tokens - 1) for o in ok if o.ttft is not None and o.tokens > 1]
    share = Counter(o.node or "?" for o in ok)
    nodes = node_figures(data.samples)
    totals = {k: sum(n[k] for n in nodes.values()) for k in ("preemptions", "oom_crashes", "crashes")}
    lag = [o.lag for o in data.outcomes]
    return {
        "label": data.label,
        "started_at": data.started_at,
        "window_s": window,
        "wall_s": data.wall_s,
        "sent": len(data.outcomes),
        "measured": len(measured),
        "ok": len(ok),
        "good": len(good),
        "errors": dict(errors.most_common()),
        "error_rate": (len(measured) - len(ok)) / len(measured) if measured else float("nan"),
        "offered_rps": len(measured) / window,
        "throughput_rps": len(ok) / window,
        "goodput_rps": len(good) / window,
        "good_share": len(good) / len(measured) if measured else float("nan"),
        "output_tokens_per_s": sum(o.tokens for o in ok) / window,
        "ttft_s": pcts(ttft),
        "tpot_s": pcts(tpot),
        "e2e_s": pcts([o.e2e for o in ok]),
        "share": {k: v / len(ok) for k, v in sorted(share.items())} if ok else {},
        "nodes": nodes,
        "preemptions": totals["preemptions"],
        "oom_crashes": totals["oom_crashes"],
        "crashes": totals["crashes"],
        "lag_p99_s": _or_nan(percentile(sorted(lag), 0.99)),
        "timeline": _timeline(data.outcomes, timeline_bucket_s),
        "steady": _steady(data),
        "slo": w.slo.model_dump(),
    }


def finite(x: Any) -> bool:
    return isinstance(x, int | float) and not (isinstance(x, float) and math.isnan(x))
