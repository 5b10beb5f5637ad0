"""One measured cell of ``inferlb bench overhead``: the load generator in closed-loop mode, with the CPU
of the processes under test read around the measured phase.

Exactly ``concurrency`` requests are in flight (:func:`~.loadgen.runner.run_plan` with
``concurrency``): after ``warmup`` unmeasured requests, ``n`` measured ones run (or fewer: none
starts after ``max_seconds``). Several base URLs are used round-robin from the client side (the
"direct" baseline). Every response is validated by the generator: HTTP 200, the expected number of
output tokens and, for streams, a final ``data: [DONE]``; anything else is an error.

CPU seconds of watched process trees (``watch``: name → PID) are read from ``/proc`` right before
and right after the measured phase, so start-up and warm-up are not counted; so are the busy and
total CPU seconds of the whole machine (``/proc/stat``), which tell how much else was running.

``bench overhead`` runs it as a subprocess (``python -m inferlb.bench.cell --spec JSON``; one JSON
object on stdout) so the generator's own CPU stays out of the measured process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any

from inferlb.bench.loadgen.procs import system_busy, tree_cpu_seconds
from inferlb.bench.loadgen.results import pcts
from inferlb.bench.loadgen.runner import RunData, run_plan
from inferlb.bench.loadgen.workload import PlannedRequest, Workload

__all__ = ["LoadSpec", "main", "run_load"]

PROMPT_TOKENS = 60      # about the size of a short chat turn with a system prompt


@dataclass
class LoadSpec:
    """One load run (one cell of the benchmark table)."""

    urls: list[str]                      # base URLs, round-robin
    n: int = 2000
    concurrency: int = 16
    stream: bool = False
    max_tokens: int = 32
    model: str = "fake-chat"
    warmup: int = 100
    max_seconds: float = 30.0            # cap on the measured phase (and, separately, the warm-up)
    timeout_s: float = 60.0              # per request
    watch: dict[str, int] = field(default_factory=dict)


def _requests(spec: LoadSpec, count: int) -> list[PlannedRequest]:
    return [PlannedRequest(t=0.0, prompt_tokens=PROMPT_TOKENS, output_tokens=spec.max_tokens,
                           max_tokens=spec.max_tokens, stream=spec.stream)
            for _ in range(count)]


async def run_load(spec: LoadSpec) -> dict[str, Any]:
    """Run ``spec``; returns the figures (latencies in ms, CPU in seconds)."""
    w = Workload(model=spec.model, max_tokens="exact", timeout_s=spec.timeout_s)

    async def phase(count: int, label: str) -> RunData:
        return await run_plan(_requests(spec, count), w, spec.urls, label=label, concurrency=spec.concurrency,
                              max_seconds=spec.max_seconds)

    if spec.warmup > 0:
        await phase(spec.warmup, "warmup")
    cpu0 = {k: tree_cpu_seconds(p) for k, p in spec.watch.items()}
    sys0 = system_busy()
    self0 = os.times()
    t0 = time.perf_counter()
    results = (await phase(spec.n, "measured")).outcomes
    wall = time.perf_counter() - t0
    self1 = os.times()
    sys1 = system_busy()
    cpu1 = {k: tree_cpu_seconds(p) for k, p in spec.watch.items()}

    ok = [r for r in results if r.ok]
    errs: dict[str, int] = {}
    for r in results:
        if not r.ok:
            kind = r.error or "unknown"
            errs[kind] = errs.get(kind, 0) + 1
    done = len(results)
    cpu_s: dict[str, float | None] = {}
    for k in spec.watch:
        a, b = cpu0.get(k), cpu1.get(k)
        cpu_s[k] = (b - a) if a is not None and b is not None else None
    busy = busy_s = total_s = None
    if sys0 is not None and sys1 is not None and sys1[1] > sys0[1]:
        busy_s, total_s = sys1[0] - sys0[0], sys1[1] - sys0[1]
        busy = busy_s / total_s
    return {
        "spec": asdict(spec),
        "n_done": done, "n_ok": len(ok), "errors": done - len(ok),
        "error_kinds": dict(sorted(errs.items(), key=lambda kv: -kv[1])[:5]),
        "wall_s": wall, "rps": done / wall if wall > 0 else float("nan"),
        "e2e_ms": pcts((r.e2e for r in ok), 1e3),
        # per base URL (request i went to urls[i % len(urls)]): two gateways measured in one run
        "e2e_ms_by_url": [pcts((r.e2e for r in ok if r.i % len(spec.urls) == k), 1e3)
                          for k in range(len(spec.urls))] if len(spec.urls) > 1 else None,
        "ttft_ms": pcts((r.ttft for r in ok if r.ttft is not None), 1e3) if spec.stream else None,
        "cpu_s": cpu_s,
        "cpu_s_per_1k": {k: (v * 1000.0 / done if v is not None and done else None)
                         for k, v in cpu_s.items()},
        "loadgen_cpu_s": (self1.user - self0.user) + (self1.system - self0.system),
        "system_busy_frac": busy, "system_busy_cpu_s": busy_s, "system_total_cpu_s": total_s,
    }


def _run(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run on uvloop when it is installed (as the peer bench's generator does)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> int:
    """``--spec JSON`` (a :class:`LoadSpec` as JSON) → one JSON result line on stdout."""
    ap = argparse.ArgumentParser(prog="python -m inferlb.bench.cell", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="LoadSpec as a JSON object")
    args = ap.parse_args(argv)
    spec = LoadSpec(**json.loads(args.spec))
    out = _run(run_load(spec))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
