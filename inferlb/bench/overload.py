"""``inferlb bench overload``: admission control under overload, on vs off (docs/reliability.md B6, L-02,
L-03, L-05), with an open-loop generator.

What it runs, each piece in its own process so the generator's CPU stays out of the gateway's:

* simulated nodes (one ``inferlb sim`` process on a generated fleet file): vLLM-like engines
  (continuous batching, ``max_num_seqs`` = ``--conc``; excess requests wait inside the engine
  as they do on vLLM);
* the gateway (``inferlb serve``) on a fleet file whose nodes declare ``max_concurrency`` =
  ``--conc``, with ``admission.enabled`` true or false;
* the load generator (:mod:`.loadgen`) in open-loop mode: Poisson arrivals at a fixed rate (a slow
  server does not slow the arrivals; docs/reliability.md §9.1), every request with a client
  deadline (``--deadline-s``, sent as ``x-inferlb-deadline-ms``) and a priority class drawn from
  the mix.

Cells: *unloaded* (0.3 × S) gives the unloaded p99 and the capacity S = nodes × conc ÷ mean
unloaded latency; then 2× and 5× S with admission on and off; then the noisy neighbour (auth on:
tenant A sends 10× its RPM quota, tenant B 50 % of its own) against B alone. Goodput = 2xx
answers inside the deadline, per second. The figures go to stdout (markdown with ``--markdown``)
and, with ``--json FILE``, to a file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from inferlb.bench.loadgen.results import node_figures
from inferlb.bench.loadgen.runner import run_plan
from inferlb.bench.loadgen.stack import Stack
from inferlb.bench.loadgen.workload import PlannedRequest, Workload
from inferlb.store.sla import percentile

__all__ = ["CellResult", "Shot", "main", "plan_cell", "run_cell", "sim_fleet", "summarize_cell"]

MIX = {"critical": 0.1, "interactive": 0.3, "standard": 0.4, "batch": 0.2}
PROMPT_TOKENS = 12


@dataclass
class Shot:
    """One request as the client saw it."""

    cls: str
    tenant: str | None
    status: int
    latency_s: float
    retry_after: bool
    end_s: float = 0.0          # when the answer was complete, from the start of the cell
    code: str | None = None     # error.code of an error answer


@dataclass
class CellResult:
    name: str
    offered_rps: float
    duration_s: float
    shots: list[Shot] = field(default_factory=list)
    node_hits: int = 0


def summarize_cell(c: CellResult, deadline_s: float, capacity_rps: float | None = None,
                   tenant: str | None = None) -> dict[str, Any]:
    """Goodput, accepted / rejected latency, per class; ``tenant`` restricts to one tenant."""
    shots = [s for s in c.shots if tenant is None or s.tenant == tenant]
    ok = [s for s in shots if 200 <= s.status < 300]
    # Goodput counts answers inside the deadline that completed inside the measured window (a
    # backlog drained after the arrivals stop is not throughput of that window).
    good = [s for s in ok if s.latency_s <= deadline_s and s.end_s <= c.duration_s]
    rejected = [s for s in shots if s.status in (429, 503)]
    out: dict[str, Any] = {
        "cell": c.name, "tenant": tenant, "offered_rps": round(c.offered_rps, 2), "n": len(shots),
        "goodput_rps": round(len(good) / c.duration_s, 2),
        "ok_pct": round(100 * len(ok) / len(shots), 2) if shots else None,
        "accepted_p50_ms": _ms(percentile(sorted([s.latency_s for s in ok]), 0.5)),
        "accepted_p99_ms": _ms(percentile(sorted([s.latency_s for s in ok]), 0.99)),
        "rejected": len(rejected),
        "rejected_p99_ms": _ms(percentile(sorted([s.latency_s for s in rejected]), 0.99)),
        "rejected_with_retry_after_pct": round(100 * sum(s.retry_after for s in rejected) / len(rejected), 1)
        if rejected else None,
        "other_errors": len(shots) - len(ok) - len(rejected),
        "rejections_by_code": {code: {"n": len(v), "p50_ms": _ms(percentile(sorted(v), 0.5)),
                                      "p99_ms": _ms(percentile(sorted(v), 0.99)),
                                      "over_50ms": sum(x > 0.05 for x in v)}
                               for code in sorted({s.code or "?" for s in rejected})
                               for v in [[s.latency_s for s in rejected if (s.code or "?") == code]]},
        "raf": round(c.node_hits / len(shots), 3) if shots and c.node_hits and tenant is None else None,
    }
    if capacity_rps:
        out["goodput_pct_of_capacity"] = round(100 * len(good) / c.duration_s / capacity_rps, 1)
    out["classes"] = {}
    for cls in MIX:
        mine = [s for s in shots if s.cls == cls]
        if mine:
            mine_ok = [s.latency_s for s in mine if 200 <= s.status < 300]
            out["classes"][cls] = {"n": len(mine), "ok_pct": round(100 * len(mine_ok) / len(mine), 1),
                                   "p99_ms": _ms(percentile(sorted(mine_ok), 0.99))}
    return out


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 1)


# ---------------------------------------------------------------------------------- generator


def plan_cell(rate: float, duration_s: float, *, seed: int, max_tokens: int,
              streams: list[tuple[float, str | None, str | None]] | None = None) -> list[PlannedRequest]:
    """Poisson arrivals with a priority class drawn from :data:`MIX`. ``streams``: (rate, tenant,
    key) each, instead of one ``rate``."""
    rng = random.Random(seed)
    classes, weights = list(MIX), list(MIX.values())
    out: list[PlannedRequest] = []
    for r, tenant, key in streams or [(rate, None, None)]:
        t = rng.expovariate(r)
        while t < duration_s:
            out.append(PlannedRequest(t=t, prompt_tokens=PROMPT_TOKENS, output_tokens=max_tokens, max_tokens=max_tokens,
                                      stream=False, tenant=tenant, priority=rng.choices(classes, weights)[0],
                                      api_key=key))
            t += rng.expovariate(r)
    out.sort(key=lambda p: p.t)
    return out


async def run_cell(name: str, base: str, rate: float, duration_s: float, *, deadline_s: float, seed: int,
                   streams: list[tuple[float, str | None, str | None]] | None = None, max_tokens: int = 30,
                   nodes: dict[str, str] | None = None) -> CellResult:
    """One cell through the load generator, open loop; ``nodes`` (name → URL) are sampled for the
    requests that reached them."""
    plan = plan_cell(rate, duration_s, seed=seed, max_tokens=max_tokens, streams=streams)
    # The client waits 5 s past the deadline, so a late answer is seen (and not counted as goodput).
    w = Workload(model="m", max_tokens="exact", timeout_s=deadline_s + 5, deadline_s=deadline_s)
    data = await run_plan(plan, w, [base], label=name, nodes=nodes, duration_s=duration_s, sample_s=duration_s)
    cell = CellResult(name, sum(f[0] for f in streams or [(rate, None, None)]), duration_s)
    for o in data.outcomes:
        status = o.status if o.status is not None else 599
        code = o.code if status >= 400 else None
        cell.shots.append(Shot(o.priority or "standard", o.tenant, status, o.e2e, o.retry_after, o.end,
                               code or ("no_answer" if o.status is None else None)))
    cell.node_hits = sum(f["requests"] for f in node_figures(data.samples).values())
    return cell


# ---------------------------------------------------------------------------------- processes


def sim_fleet(n: int, conc: int, tokens: int, step_s: float) -> dict[str, Any]:
    """The simulated-fleet file: vLLM-like engines, continuous batching with ``max_num_seqs`` =
    ``conc``, one step per token."""
    return {"models": ["m"], "nodes": [
        {"name": f"sim{i}", "max_concurrency": 100_000, "default_output_tokens": tokens, "max_num_seqs": conc,
         "step_base_s": step_s, "step_per_seq_s": 0.0, "prefill_s_per_token": 0.0} for i in range(n)]}


def gateway_config(node_urls: dict[str, str], args: argparse.Namespace, *, admission: bool,
                   burst_s: float | None = None) -> dict[str, Any]:
    """The gateway's fleet file: every node declares ``max_concurrency`` = ``--conc``."""
    return {
        "models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": args.tokens}],
        "nodes": [{"name": name, "url": u, "models": ["m"], "kind": "vllm", "max_concurrency": args.conc}
                  for name, u in node_urls.items()],
        "routing": {"profile": "least-connections"},
        "timeouts": {"connect_s": 2, "first_token_s": 30, "idle_s": 30, "total_s": 60},
        "admission": {"enabled": admission, **({"limit_burst_s": burst_s} if burst_s else {})},
    }


class _Overload:
    """The benchmark's processes (one :class:`~.loadgen.stack.Stack`): the nodes once, the gateway
    restarted per configuration on one database (the tenant keys are written there first)."""

    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.args = args
        fleet = work / "sim-fleet.yaml"
        fleet.write_text(yaml.safe_dump(sim_fleet(args.nodes, args.conc, args.tokens, args.step_s)))
        self.stack = Stack(work, str(fleet))
        self.node_urls = self.stack.start_nodes()
        self.gdir = work / "gateway"
        self.db = self.gdir / "audit.db"
        self.base = ""

    def start_gateway(self, *, admission: bool, auth: bool = False, burst_s: float | None = None) -> str:
        env = {"INFERLB_AUTH": "on" if auth else "off", "INFERLB_AUDIT_FLUSH_INTERVAL_S": "0.5"}
        self.base = self.stack.start_gateway_with(
            "gateway", gateway_config(self.node_urls, self.args, admission=admission, burst_s=burst_s),
            gdir=self.gdir, env=env)
        return self.base

    def stop_gateway(self) -> None:
        self.stack.stop_gateway()

    def close(self) -> None:
        self.stack.close()


def _keys(db: Path, quotas: dict[str, int]) -> dict[str, str]:
    """Tenant keys with RPM quotas, written before the gateway starts (it loads them at start)."""
    from inferlb.admission.store import create_key
    from inferlb.store.db import make_engine, upgrade

    url = f"sqlite:///{db}"
    upgrade(url)
    engine = make_engine(url)
    try:
        return {t: create_key(engine, tenant=t, now=time.time(), rpm=q)[1] for t, q in quotas.items()}
    finally:
        engine.dispose()


# ---------------------------------------------------------------------------------- main


def _cell(stack: _Overload, name: str, rate: float, args: argparse.Namespace, seed: int, **kw: Any) -> CellResult:
    cell = asyncio.run(run_cell(name, stack.base, rate, args.duration, deadline_s=args.deadline_s, seed=seed,
                                max_tokens=args.tokens, nodes=stack.node_urls, **kw))
    time.sleep(args.settle_s)          # let the nodes drain before the next cell
    return cell


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="inferlb-overload-"))
    stack = _Overload(work, args)
    out: dict[str, Any] = {"args": vars(args), "cells": []}
    try:
        stack.start_gateway(admission=True)
        unloaded_rate = 0.3 * args.nodes * args.conc / (args.tokens * args.step_s)
        base = _cell(stack, "unloaded", unloaded_rate, args, 1)
        ok = [s.latency_s for s in base.shots if s.status == 200]
        mean = sum(ok) / len(ok)
        capacity = args.nodes * args.conc / mean
        out["capacity_rps"] = round(capacity, 2)
        out["unloaded_p99_ms"] = _ms(percentile(sorted(ok), 0.99))
        out["cells"].append(summarize_cell(base, args.deadline_s, capacity))
        for mode in ("on", "off"):
            if mode == "off":       # "on" goes on with the gateway that served the unloaded cell
                stack.start_gateway(admission=False)
            for m in args.multipliers:
                c = _cell(stack, f"{m:g}x admission {mode}", m * capacity, args, 10 + int(m))
                out["cells"].append(summarize_cell(c, args.deadline_s, capacity))
        if args.noisy:
            quota_a, quota_b = 0.25 * capacity, 0.5 * capacity            # requests per second
            for mode in ("on", "off"):
                stack.stop_gateway()
                stack.db.unlink(missing_ok=True)
                stack.gdir.mkdir(parents=True, exist_ok=True)
                keys = _keys(stack.db, {"A": max(1, round(quota_a * 60)), "B": max(1, round(quota_b * 60))})
                stack.start_gateway(admission=mode == "on", auth=True, burst_s=args.burst_s)
                if mode == "on":
                    alone = _cell(stack, "B alone", 0, args, 40, streams=[(0.5 * quota_b, "B", keys["B"])])
                    out["cells"].append(summarize_cell(alone, args.deadline_s, capacity, tenant="B"))
                both = _cell(stack, f"noisy A + B, admission {mode}", 0, args, 41,
                             streams=[(0.5 * quota_b, "B", keys["B"]), (10 * quota_a, "A", keys["A"])])
                for t in ("B", "A"):
                    out["cells"].append(summarize_cell(both, args.deadline_s, capacity, tenant=t))
    finally:
        stack.close()
    return out


def render(report: dict[str, Any]) -> str:
    """A markdown table of the cells."""
    lines = [f"capacity S = {report['capacity_rps']} req/s (nodes × max_num_seqs ÷ mean unloaded latency); "
             f"unloaded p99 = {report['unloaded_p99_ms']} ms", "",
             "| cell | tenant | offered req/s | goodput req/s (% of S) | ok % | accepted p99 ms | rejected "
             "| rejected p99 ms | with Retry-After % | other errors | RAF | critical ok % / p99 ms | batch ok % |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in report["cells"]:
        crit = c["classes"].get("critical", {})
        batch = c["classes"].get("batch", {})
        lines.append(
            f"| {c['cell']} | {c['tenant'] or 'all'} | {c['offered_rps']} | {c['goodput_rps']} "
            f"({c.get('goodput_pct_of_capacity', '–')} %) | {c['ok_pct']} | {c['accepted_p99_ms']} | {c['rejected']} "
            f"| {c['rejected_p99_ms'] or '–'} | {c['rejected_with_retry_after_pct'] or '–'} | {c['other_errors']} "
            f"| {c['raf'] or '–'} | {crit.get('ok_pct', '–')} / {crit.get('p99_ms', '–')} "
            f"| {batch.get('ok_pct', '–')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="inferlb bench overload", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--conc", type=int, default=4, help="max_num_seqs per node (the gateway's max_concurrency)")
    p.add_argument("--tokens", type=int, default=30, help="output tokens per request")
    p.add_argument("--step-s", dest="step_s", type=float, default=0.02, help="engine step (seconds per token)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per cell")
    p.add_argument("--deadline-s", dest="deadline_s", type=float, default=5.0)
    p.add_argument("--multipliers", type=lambda s: [float(x) for x in s.split(",")], default=[2.0, 5.0])
    p.add_argument("--no-noisy", dest="noisy", action="store_false")
    p.add_argument("--burst-s", dest="burst_s", type=float, default=1.0,
                   help="admission.limit_burst_s for the noisy-neighbour cells")
    p.add_argument("--settle-s", dest="settle_s", type=float, default=3.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    report = run(args)
    print(render(report), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
