"""``inferlb bench run | compare | capacity``: open-loop load against simulated (or real) fleets.

::

    inferlb bench run      [--profile token-aware|…|direct] [--url URL] [common options]
    inferlb bench compare  [--targets direct,round-robin,least-connections,token-aware] [--reference P]
                           [--vllm-router PATH] [--sglang-python PATH] [--litellm-bin PATH] [--nodes URL,URL]
    inferlb bench capacity [--profile token-aware] [--start-rate R] [--factor 1.3] [--step-s 40]

Common options: ``--workload NAME|FILE`` (chat, heavy-tail, bursty, diurnal, step, long-streams,
chat-sessions) or ``--trace FILE`` (JSONL / CSV / audit export), ``--fleet NAME|FILE`` (hetero4,
uniform4, large16, cache4),
``--on-kv-full preempt|oom``, ``--rate R`` or ``--load F --capacity C`` (R = F × C), ``--duration``,
``--seed``, ``--json OUT``, ``--markdown``, ``--plot DIR``, ``--workdir DIR``, ``--quiet``.

Each target of a comparison gets a fresh node process (every target starts from the same cold
fleet) and, unless it is ``direct`` (the client round-robins over the nodes itself), its own
gateway process; the same seeded plan is sent to each, back to back. The capacity search steps the
rate by ``--factor`` from ``--start-rate`` until the e2e p99 passes 2× the unloaded p99 (measured
first, at ``--base-rate``) or more than 5 % of requests fail, and reports the last rate that passed.
Steps send the first requests of one seeded stream (the baseline exactly the first step's), so with
heavy-tailed lengths the p99s compare load, not which long requests a sample happened to draw.

A target of ``compare`` may also be a peer router, ``KIND:POLICY`` (inferlb/bench/loadgen/peers.py):
``vllm-router:cache_aware``, ``vllm-router:power_of_two``, ``sglang-router:cache_aware``,
``sglang-router:power_of_two``, ``litellm:least-busy``; ``inferlb:PROFILE`` is the same as
``PROFILE``. Each peer gets the same fresh fleet as every other target, its nodes answering
``/get_load`` in the shape it reads; a peer that is not installed is skipped with one line. The
table's "router CPU ms/req" is the gateway's (or peer's) CPU over the run per request sent.
``--nodes URL,URL`` routes to running nodes (e.g. real engines) instead of starting emulated ones;
they are not restarted between targets.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from inferlb.bench.loadgen.peers import PeerExes, TargetSpec, get_load_shape, new_master_key, parse_target
from inferlb.bench.loadgen.procs import system_busy, tree_cpu_seconds, workdir
from inferlb.bench.loadgen.report import capacity_lines, compare_rows, node_rows, plot_runs, print_table
from inferlb.bench.loadgen.results import summarize
from inferlb.bench.loadgen.runner import RunData, run_plan
from inferlb.bench.loadgen.stack import Stack, node_overrides
from inferlb.bench.loadgen.trace import load_trace
from inferlb.bench.loadgen.workload import PlannedRequest, Workload, load_workload, plan

__all__ = ["main"]

_TARGETS = "direct,round-robin,least-connections,token-aware"


def _log(quiet: bool) -> Any:
    def log(msg: str) -> None:
        if not quiet:
            print(time.strftime("%H:%M:%S"), msg, file=sys.stderr, flush=True)
    return log


def _parser(what: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"inferlb bench {what}", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="heavy-tail", help="built-in name or YAML/JSON file (heavy-tail)")
    ap.add_argument("--trace", type=Path, help="replay a trace file instead of the workload's arrivals/lengths")
    ap.add_argument("--trace-time-scale", type=float, default=1.0, help="replay speed (2: twice as fast)")
    ap.add_argument("--fleet", default="hetero4", help="hetero4, uniform4, large16, cache4 or a fleet file (hetero4)")
    ap.add_argument("--on-kv-full", choices=["preempt", "oom"], help="override every node's KV-full behaviour")
    ap.add_argument("--stream-interval", type=int, help="tokens per SSE event on every node")
    ap.add_argument("--rate", type=float, help="mean arrival rate, req/s (default: the workload's)")
    ap.add_argument("--load", type=float, help="arrival rate as a share of --capacity (0.85)")
    ap.add_argument("--capacity", type=float, help="the fleet's capacity in req/s (from bench capacity)")
    ap.add_argument("--duration", type=float, help="arrival window, seconds (default: the workload's)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", dest="json_out", type=Path, help="write every figure to this file")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    ap.add_argument("--plot", type=Path, help="write PNG charts here (needs the plot extra)")
    ap.add_argument("--workdir", type=Path, help="keep logs and fleet files here")
    ap.add_argument("--quiet", action="store_true", help="no progress output")
    if what == "run":
        ap.add_argument("--profile", default="token-aware", help="routing profile, or direct (token-aware)")
        ap.add_argument("--url", help="send to this running endpoint instead of a simulated stack")
    elif what == "compare":
        ap.add_argument("--targets", default=_TARGETS, help=f"comma-separated ({_TARGETS})")
        ap.add_argument("--reference", default="token-aware", help="ratios against this target (token-aware)")
        ap.add_argument("--vllm-router", help="vllm-router executable (default: next to this Python, or PATH)")
        ap.add_argument("--sglang-python", help="a Python with sglang-router installed (default: this one, or "
                                                "the one of sglang-router on PATH)")
        ap.add_argument("--litellm-bin", help="LiteLLM proxy executable, e.g. from its own venv (default: PATH)")
        ap.add_argument("--nodes", help="comma-separated base URLs of running nodes to use instead of emulated ones")
    else:
        ap.add_argument("--profile", default="token-aware", help="routing profile, or direct (token-aware)")
        ap.add_argument("--start-rate", type=float, default=1.0, help="first loaded step, req/s (1.0)")
        ap.add_argument("--base-rate", type=float, help="rate of the unloaded baseline (start-rate / 2)")
        ap.add_argument("--factor", type=float, default=1.3, help="rate multiplier per step (1.3)")
        ap.add_argument("--step-s", type=float, default=40.0,
                        help="arrival window per step, seconds (40; the baseline sends as many requests "
                             "as the first step)")
        ap.add_argument("--max-steps", type=int, default=12)
    return ap


def _requests(args: argparse.Namespace, w: Workload, rate: float | None, duration: float) -> list[PlannedRequest]:
    if args.trace is not None:
        reqs = load_trace(args.trace, model=w.model, time_scale=args.trace_time_scale, rate=rate,
                          stream=w.stream >= 0.5)
        return [r for r in reqs if r.t < duration] if args.duration else reqs
    return plan(w, seed=args.seed, rate=rate, duration_s=duration)


def _rate(args: argparse.Namespace) -> float | None:
    if args.load is not None:
        if args.capacity is None:
            raise ValueError("--load needs --capacity (req/s, as bench capacity reports it)")
        return float(args.load * args.capacity)
    return float(args.rate) if args.rate is not None else None


def _target(stack: Stack, target: TargetSpec, w: Workload, seed: int, exes: PeerExes | None = None,
            master_key: str = "") -> list[str]:
    stack.start_nodes(get_load_shape(target))
    if target.kind == "direct":
        stack.stop_gateway()
        return list(stack.node_urls.values())
    if target.is_peer:
        return [stack.start_peer(target, exes or PeerExes.find(), w, master_key=master_key)]
    return [stack.start_gateway(target.policy or target.label, w, seed)]


def _one_run(stack: Stack | None, targets: list[str], label: str, reqs: list[PlannedRequest], w: Workload,
             duration: float, args: argparse.Namespace) -> tuple[dict[str, Any], RunData]:
    nodes = stack.node_urls if stack is not None and stack.emulated else None
    watch = {}
    if stack is not None and stack.sim is not None:
        watch["sim"] = stack.sim.pid
    if stack is not None and stack.gateway is not None:
        watch["gateway"] = stack.gateway.pid
    cpu0 = {k: tree_cpu_seconds(pid) for k, pid in watch.items()}
    sys0, self0, t0 = system_busy(), os.times(), time.monotonic()
    data = asyncio.run(run_plan(reqs, w, targets, label=label, nodes=nodes, progress=not args.quiet,
                                duration_s=duration, cpu_watch=watch))
    wall = time.monotonic() - t0
    cpu1 = {k: tree_cpu_seconds(pid) for k, pid in watch.items()}
    sys1, self1 = system_busy(), os.times()
    summary = summarize(data, w)
    # CPU share of one core over the run, per process (the machine's other load shows in system_busy).
    cpu: dict[str, float | None] = {}
    for k in watch:
        a, b = cpu0.get(k), cpu1.get(k)
        cpu[k] = (b - a) / wall if a is not None and b is not None and wall > 0 else None
    cpu["loadgen"] = ((self1.user - self0.user) + (self1.system - self0.system)) / wall if wall > 0 else None
    if sys0 is not None and sys1 is not None and sys1[1] > sys0[1]:
        cpu["system_busy"] = (sys1[0] - sys0[0]) / (sys1[1] - sys0[1])
    summary["cpu_core_share"] = cpu
    gw = cpu.get("gateway")
    # The router's CPU per request sent: the figure that compares a Python gateway with the Rust ones.
    summary["router_cpu_ms_per_req"] = gw * wall * 1000 / len(reqs) if gw is not None and reqs else None
    return summary, data


def _compact(data: RunData) -> list[list[Any]]:
    return [[o.t, o.node, o.ok, o.e2e, o.ttft, o.error, o.prompt_tokens, o.output_tokens] for o in data.outcomes]


def _finish(args: argparse.Namespace, report: dict[str, Any], reference: str | None = None) -> None:
    runs = report["runs"]
    md = args.markdown
    if report.get("capacity"):
        head, rows = capacity_lines(report["capacity"])
        print_table(f"capacity search ({report['capacity']['profile']})", head, rows, markdown=md)
        print(f"\ncapacity: {_fmt(report['capacity']['capacity_rps'])} req/s "
              f"(unloaded e2e p99 {_fmt(report['capacity']['unloaded_p99_s'])} s)")
    for label, why in report.get("skipped", {}).items():
        print(f"skipped {label}: {why}")
    if runs:
        head, rows = compare_rows(runs, reference)
        title = "client-side figures" + (f" (ref = {reference})" if reference else "")
        print_table(title, head, rows, markdown=md)
        for s in runs:
            nh, nr = node_rows(s)
            print_table(f"nodes — {s['label']}", nh, nr, markdown=md)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=1, default=str))
    if args.plot is not None:
        paths = plot_runs(runs, report.get("outcomes", {}), args.plot, report.get("capacity"))
        print("\ncharts: " + ", ".join(str(p) for p in paths), file=sys.stderr)


def _reference(ref: str, labels: list[str]) -> str:
    """The label of the reference run: ``ref`` itself, or the run of the same inferlb profile
    spelt the other way (``token-aware`` and ``inferlb:token-aware`` are one target)."""
    if ref in labels:
        return ref
    want = parse_target(ref)
    for label in labels:
        t = parse_target(label)
        if t.kind == want.kind and t.policy == want.policy:
            return label
    return ref


def _fmt(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def _meta(args: argparse.Namespace, w: Workload, rate: float | None, duration: float, n: int) -> dict[str, Any]:
    return {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:], "workload": w.model_dump(),
            "rate": rate if rate is not None else w.arrival.rate, "duration_s": duration, "seed": args.seed,
            "fleet": args.fleet, "on_kv_full": args.on_kv_full, "requests": n,
            "trace": str(args.trace) if args.trace else None}


def _run_or_compare(what: str, args: argparse.Namespace) -> dict[str, Any]:
    log = _log(args.quiet)
    w = load_workload(args.workload)
    rate = _rate(args)
    duration = args.duration or w.duration_s
    reqs = _requests(args, w, rate, duration)
    if not reqs:
        raise ValueError("the plan has no requests (rate × duration too small, or an empty trace)")
    names = [args.profile] if what == "run" else [t.strip() for t in args.targets.split(",") if t.strip()]
    targets = [parse_target(t) for t in names]
    report: dict[str, Any] = {"meta": _meta(args, w, rate, duration, len(reqs)), "runs": [], "outcomes": {},
                              "skipped": {}}
    log(f"{len(reqs)} requests over {duration:g} s ({len(reqs) / duration:.2f} req/s) → {', '.join(names)}")
    exes = PeerExes.find(vllm_router=getattr(args, "vllm_router", None),
                         sglang_python=getattr(args, "sglang_python", None),
                         litellm=getattr(args, "litellm_bin", None))
    for t in targets:
        why = exes.missing(t.kind) if t.is_peer else None
        if why is not None:
            report["skipped"][t.label] = why     # one line in the output (_finish), the row left out
    targets = [t for t in targets if t.label not in report["skipped"]]
    external = [u.strip() for u in (getattr(args, "nodes", None) or "").split(",") if u.strip()]
    if what == "run" and args.url:
        s, data = _one_run(None, [args.url], args.url, reqs, w, duration, args)
        report["runs"].append(s)
        report["outcomes"][s["label"]] = _compact(data)
        return report
    with workdir(args.workdir) as wd:
        stack = Stack(wd, args.fleet, sim_args=node_overrides(args.on_kv_full, args.stream_interval), log=log,
                      external=external, model=w.model)
        try:
            for target in targets:
                key = new_master_key() if target.kind == "litellm" else ""
                urls = _target(stack, target, w, args.seed, exes, key)
                # LiteLLM answers only its master key: the load generator sends it as the bearer token.
                sent = [dataclasses.replace(r, api_key=key) for r in reqs] if key else reqs
                s, data = _one_run(stack, urls, target.label, sent, w, duration, args)
                report["runs"].append(s)
                report["outcomes"][target.label] = _compact(data)
                log(f"{target.label}: goodput {s['goodput_rps']:.2f} req/s, e2e p99 {_fmt(s['e2e_s']['p99'])} s, "
                    f"TTFT p99 {_fmt(s['ttft_s']['p99'])} s, errors {s['errors']}, "
                    f"preemptions {s['preemptions']}, OOM {s['oom_crashes']}")
                stack.stop_gateway()
        finally:
            stack.close()
    return report


def _capacity(args: argparse.Namespace) -> dict[str, Any]:
    log = _log(args.quiet)
    # Every step sends the first requests of one seeded stream (the same lengths in the same order),
    # so a faster step sends a superset of a slower one's, and the baseline sends exactly the first
    # step's requests: with heavy tails, the p99 of unrelated samples would measure which long
    # requests each drew rather than the load. Steps last long enough to reach a steady state; no
    # warm-up is dropped (it would drop different requests at different rates).
    w = load_workload(args.workload).model_copy(update={"warmup_s": 0.0})
    step_s = args.step_s
    base_rate = args.base_rate or args.start_rate / 2
    base_s = step_s * args.start_rate / base_rate
    steps: list[dict[str, Any]] = []
    cap: dict[str, Any] = {"profile": args.profile, "steps": steps, "capacity_rps": None, "unloaded_p99_s": None,
                           "step_s": step_s,
                           "rule": "last rate whose e2e p99 ≤ 2 × the unloaded p99 and errors ≤ 5 %"}
    report: dict[str, Any] = {"meta": _meta(args, w, base_rate, base_s, 0), "runs": [], "outcomes": {},
                              "capacity": cap}
    with workdir(args.workdir) as wd:
        stack = Stack(wd, args.fleet, sim_args=node_overrides(args.on_kv_full, args.stream_interval), log=log)
        try:
            urls = _target(stack, parse_target(args.profile), w, args.seed)
            rates = [base_rate] + [args.start_rate * args.factor ** k for k in range(args.max_steps)]
            for k, rate in enumerate(rates):   # bounded by --max-steps
                window = base_s if k == 0 else step_s
                reqs = _requests(args, w, rate, window)
                s, _ = _one_run(stack, urls, f"{rate:.2f} req/s", reqs, w, window, args)
                step: dict[str, Any] = {"name": "unloaded" if k == 0 else f"step {k}", "rate": rate, "summary": s}
                p99 = s["e2e_s"]["p99"]
                if k == 0:
                    cap["unloaded_p99_s"] = p99
                    step["verdict"] = "baseline"
                else:
                    ratio = p99 / cap["unloaded_p99_s"] if cap["unloaded_p99_s"] else float("nan")
                    step["p99_ratio"] = ratio
                    passed = ratio <= 2.0 and s["error_rate"] <= 0.05
                    step["verdict"] = "ok" if passed else "over"
                    if passed:
                        cap["capacity_rps"] = rate
                steps.append(step)
                log(f"{step['name']}: {rate:.2f} req/s → e2e p99 {_fmt(p99)} s, errors {s['errors']} "
                    f"({step['verdict']})")
                if step["verdict"] == "over":
                    break
                stack.wait_idle(60)
        finally:
            stack.close()
    return report


def main(what: str, argv: list[str] | None = None) -> int:
    """Entry point of ``inferlb bench run|compare|capacity``; 2 on a setup error."""
    args = _parser(what).parse_args(argv)

    def _on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt   # unwinds through the finally blocks that stop every child by PID

    prev = signal.signal(signal.SIGTERM, _on_term)
    try:
        if what == "capacity":
            report = _capacity(args)
            _finish(args, report)
        else:
            report = _run_or_compare(what, args)
            ref = _reference(args.reference, [s["label"] for s in report["runs"]]) if what == "compare" else None
            _finish(args, report, ref)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"inferlb bench {what}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"inferlb bench {what}: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, prev)
    return 0

