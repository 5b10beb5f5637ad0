"""LoRA-adapter affinity measured live: ``inferlb serve`` (a child process, started by the bench's
:class:`~inferlb.bench.loadgen.stack.Stack`) in front of emulated vLLM-like nodes with LoRA
adapters (in this process: inferlb/simulator/lora.py), real HTTP and wall-clock time.

::

    python -m benchmarks.lora_live [--nodes 4] [--adapters 8] [--max-lora 2] [--load-s 0.5] [--rate 20]
                                   [--duration 45] [--seed 1] [--profiles token-aware,lora-affinity]

Each profile gets a fresh emulated fleet (every adapter cold) and a fresh gateway whose fleet
file has one model per adapter (``m-k`` served as adapter ``lora-k``, ``lora:`` in the fleet
file) and scrapes the nodes' ``/metrics`` every second (``vllm:lora_requests_info``). The client
sends streamed chat requests at ``--rate`` a second (Poisson, seeded; the same plan for every
profile), each for an adapter drawn with Zipf popularity (exponent 1), and measures TTFT (to the
first ``data:`` event) and e2e. The nodes are fixed-speed (no batching: 20 ms + 10 ms a token, 32
tokens), so the differences come from adapter loads and slot waits. Figures: the adapter-miss
rate (loads started on the nodes ÷ adapter requests), TTFT p50 / p99, e2e p99, errors; wall-clock
figures on a shared machine, so they move by a few percent from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from inferlb.bench.loadgen.stack import Stack
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.lora import LoraSpec
from inferlb.simulator.spec import NodeSpec

__all__ = ["main"]


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _one(http: aiohttp.ClientSession, url: str, model: str, out: dict[str, list[float]]) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hello " * 20}], "stream": True,
            "max_tokens": 32}
    t0 = time.perf_counter()
    try:
        async with http.post(url + "/v1/chat/completions", json=body) as r:
            if r.status != 200:
                out["errors"].append(1.0)
                await r.read()
                return
            first = None
            async for line in r.content:
                if first is None and line.startswith(b"data: "):
                    first = time.perf_counter() - t0
            out["ttft"].append(first if first is not None else float("nan"))
            out["e2e"].append(time.perf_counter() - t0)
    except (TimeoutError, aiohttp.ClientError):
        out["errors"].append(1.0)


async def run_profile(profile: str, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    adapters = tuple(f"lora-{k}" for k in range(a.adapters))
    lora = LoraSpec(adapters=adapters, max_lora=a.max_lora, load_s=a.load_s)
    specs = [NodeSpec(name=f"n{i}", models=["base"], base_ttft_s=0.02, tpot_s=0.01, default_output_tokens=32,
                      max_concurrency=256, lora=lora) for i in range(a.nodes)]
    rng = random.Random(a.seed)
    weights = [1.0 / (k + 1) for k in range(a.adapters)]
    plan: list[tuple[float, str]] = []
    t = 0.0
    while True:
        t += rng.expovariate(a.rate)
        if t >= a.duration:
            break
        plan.append((t, f"m-{rng.choices(range(a.adapters), weights)[0]}"))
    async with SimFleet(specs) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        stack = Stack(work / profile, "", external=list(urls.values()), model="base")
        (work / profile).mkdir(parents=True, exist_ok=True)
        models = [{"name": f"m-{k}", "default_max_tokens": 32, "lora": {"adapter": adapters[k], "base": "base"}}
                  for k in range(a.adapters)]
        fleet = {"models": models,
                 "nodes": [{"name": n, "url": u, "kind": "sim", "models": [m["name"] for m in models],
                            "capacity_tokens": 32_768, "max_concurrency": 256} for n, u in urls.items()],
                 "routing": {"profile": profile, "seed": a.seed},
                 "health": {"interval_s": 1.0},
                 "timeouts": {"connect_s": 5.0, "first_token_s": 120.0, "idle_s": 120.0, "total_s": 240.0}}
        try:
            base = await asyncio.to_thread(stack.start_gateway_with, f"gateway-{profile}", fleet)
            out: dict[str, list[float]] = {"ttft": [], "e2e": [], "errors": []}
            start = time.perf_counter()
            timeout = aiohttp.ClientTimeout(total=300)
            async with aiohttp.ClientSession(timeout=timeout,
                                             connector=aiohttp.TCPConnector(limit=1000)) as http:
                tasks = []
                for at, model in plan:
                    delay = at - (time.perf_counter() - start)
                    if delay > 0:
                        await asyncio.sleep(delay)
                    tasks.append(asyncio.create_task(_one(http, base, model, out)))
                await asyncio.gather(*tasks)
        finally:
            await asyncio.to_thread(stack.close)
        loads = sum(node.lora_slots.loads for node in sim.nodes.values() if node.lora_slots is not None)
        evictions = sum(node.lora_slots.evictions for node in sim.nodes.values() if node.lora_slots is not None)
    ttft = [x for x in out["ttft"] if x == x]
    return {"profile": profile, "sent": len(plan), "ok": len(out["e2e"]), "errors": len(out["errors"]),
            "miss": loads / max(1, len(plan)), "evictions": evictions, "ttft_p50": _pct(ttft, 0.5),
            "ttft_p99": _pct(ttft, 0.99), "e2e_p99": _pct(out["e2e"], 0.99),
            "e2e_mean": statistics.fmean(out["e2e"]) if out["e2e"] else float("nan")}


async def _main(a: argparse.Namespace) -> int:
    print(f"{a.nodes} emulated nodes, {a.adapters} adapters (Zipf 1), max_lora {a.max_lora}, load_s {a.load_s} s, "
          f"{a.rate:g} req/s for {a.duration:g} s, seed {a.seed}")
    print(f"{'profile':<14} {'sent':>5} {'ok':>5} {'errors':>6} {'miss':>6} {'evict':>6} {'TTFT p50':>9} "
          f"{'TTFT p99':>9} {'e2e p99':>8}")
    with tempfile.TemporaryDirectory(prefix="lora-live-") as tmp:
        for profile in a.profiles.split(","):
            r = await run_profile(profile, a, Path(tmp))
            print(f"{r['profile']:<14} {r['sent']:>5} {r['ok']:>5} {r['errors']:>6} {r['miss']:>6.1%} "
                  f"{r['evictions']:>6} {r['ttft_p50']:>8.3f}s {r['ttft_p99']:>8.3f}s {r['e2e_p99']:>7.3f}s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--max-lora", type=int, default=2)
    ap.add_argument("--load-s", type=float, default=0.5)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--duration", type=float, default=45.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profiles", default="token-aware,lora-affinity")
    return asyncio.run(_main(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
