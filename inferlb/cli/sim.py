"""``inferlb sim``: simulated GPU nodes over HTTP; ``inferlb sim des``: the discrete-event mode.

::

    inferlb sim [--host H] [--ports P ...] [--fleet NAME|FILE] [--on-kv-full preempt|oom] [--stream-interval N]
                [--get-load sglang|vllm-router]
    inferlb sim des [--workload NAME|FILE | --trace FILE] [--nodes N [--presets h100,a100,l4] | --fleet NAME|FILE]
                    [--profile token-aware] [--rate R] [--duration S] [--seed 1] [--admission gateway|off]
                    [--output-length off|mean|p50|p90] [--json]

``inferlb sim`` serves vLLM-like engines with ``/metrics`` (inferlb/simulator) and prints their
URLs as JSON once they listen; Ctrl-C is a normal stop (exit 0). ``--get-load`` picks the shape
of ``GET /get_load`` for the peer router in front (see inferlb/simulator/control.py).

``sim des`` replays a workload or trace in virtual time and prints its figures. The workloads and
traces are those of ``inferlb bench run`` (:mod:`inferlb.bench.loadgen`), the
routing profiles those of the gateway, the nodes the simulator's presets / fleets; the figures
follow ``bench run``'s definitions (:mod:`inferlb.bench.des_report`). Nothing listens on a socket
and nothing sleeps: the run takes as long as the computer needs, not as long as the traffic lasts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["des_command", "nodes_command", "register"]


def register(sub: Any) -> None:
    """Add ``sim`` to the ``inferlb`` parser's subcommands, with ``des`` under it (``inferlb sim``
    alone runs the HTTP nodes)."""
    sm = sub.add_parser("sim", help="run the simulated demo nodes only")
    sm.add_argument("--host")
    sm.add_argument("--ports", type=int, nargs="*")
    sm.add_argument("--fleet", help="hetero4, uniform4, large16, cache4 or a fleet file (default: the demo nodes)")
    sm.add_argument("--on-kv-full", dest="on_kv_full", choices=["preempt", "oom"])
    sm.add_argument("--stream-interval", dest="stream_interval", type=int)
    sm.add_argument("--get-load", dest="get_load", choices=["sglang", "vllm-router"],
                    help="shape of GET /get_load: sglang's list (default) or vllm-router's {\"load\": N}")
    # Ctrl-C is how the nodes stop: a normal stop (and `sim des` inherits it, as it always did).
    sm.set_defaults(handler=nodes_command, ctrl_c_status=0)
    modes = sm.add_subparsers(dest="sim_mode")
    d = modes.add_parser("des", help="discrete-event mode: replay a workload in virtual time, print the figures")
    d.add_argument("--workload", default="chat", help="built-in name or YAML/JSON file (chat)")
    d.add_argument("--trace", type=Path, help="replay a trace file (JSONL / CSV / audit export) instead")
    d.add_argument("--trace-time-scale", type=float, default=1.0, help="replay speed (2: twice as fast)")
    d.add_argument("--nodes", type=int, help="this many preset nodes (default 4), presets in turn")
    d.add_argument("--presets", default="h100,a100,l4", help="presets the --nodes cycle through")
    d.add_argument("--fleet", help="hetero4, uniform4, large16 or a fleet file (instead of --nodes)")
    d.add_argument("--profile", default="token-aware", help="routing profile (token-aware)")
    d.add_argument("--rate", type=float, help="mean arrival rate, req/s (default: the workload's)")
    d.add_argument("--duration", type=float, help="arrival window, virtual seconds (default: the workload's)")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--scrape-s", type=float, default=5.0, help="metrics scrape period of the gateway (5)")
    d.add_argument("--admission", choices=["gateway", "off"], default="gateway",
                   help="the gateway's admission rules (default policy), or none")
    d.add_argument("--max-inflight", type=int, default=None, help="gateway-wide cap (default: none)")
    d.add_argument("--output-length", choices=["off", "mean", "p50", "p90"], default="mean",
                   help="route on the output-length predictor's estimate (that statistic), trained from the "
                        "completions, as the gateway does by default (routing.output_length); off: the "
                        "declared max_tokens / 256 (default: mean)")
    d.add_argument("--json", action="store_true", help="print the figures as JSON")
    d.set_defaults(handler=des_command)


def nodes_command(args: argparse.Namespace) -> int:
    """Run ``inferlb sim``: serve the simulated nodes until Ctrl-C; a bad ``--fleet`` is a ConfigError."""
    asyncio.run(_serve_nodes(args))
    return 0


async def _serve_nodes(args: argparse.Namespace) -> None:
    from inferlb.errors import ConfigError
    from inferlb.simulator.emulator import serve_sim
    from inferlb.simulator.presets import cli_specs

    def ready(urls: dict[str, str]) -> None:
        print(json.dumps(urls, indent=2), flush=True)

    try:
        specs = cli_specs(args.fleet, on_kv_full=args.on_kv_full, stream_interval=args.stream_interval,
                           get_load=args.get_load)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if specs is None:
        from inferlb.simulator.spec import demo_specs

        specs = demo_specs()
    if args.ports is not None and len(args.ports) != len(specs):
        # serve_sim refuses it too, but from inside the running loop: a traceback, not one line.
        names = ", ".join(s.name for s in specs)
        raise ConfigError(f"--ports: {len(args.ports)} port(s) for {len(specs)} node(s) ({names}): give one port "
                          "per node, space-separated, or leave --ports out for free ports")
    await serve_sim(specs, host=args.host or "127.0.0.1", ports=args.ports, on_ready=ready)


def _specs(args: argparse.Namespace) -> list[Any]:
    from inferlb.simulator.presets import PRESETS, fleet_specs, preset_spec

    if args.fleet is not None:
        if args.nodes is not None:
            raise ValueError("use --nodes or --fleet, not both")
        return fleet_specs(args.fleet)
    n = 4 if args.nodes is None else args.nodes
    if n < 1:
        raise ValueError("--nodes must be >= 1")
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PRESETS]
    if not presets or unknown:
        raise ValueError(f"--presets: unknown {', '.join(unknown) or '(none given)'} (known: {', '.join(PRESETS)})")
    return [preset_spec(f"{presets[i % len(presets)]}-{i:04d}", presets[i % len(presets)]) for i in range(n)]


def des_command(args: argparse.Namespace) -> int:
    """Run ``inferlb sim des`` (see the module docstring); 2 with one line on bad input."""
    from inferlb.bench.des_report import des_summary
    from inferlb.bench.loadgen.trace import load_trace
    from inferlb.bench.loadgen.workload import load_workload, plan
    from inferlb.errors import ConfigError
    from inferlb.simulator.des.admission import OpenAdmission
    from inferlb.simulator.des.sim import Simulation

    try:
        w = load_workload(args.workload)
        specs = _specs(args)
        duration = args.duration if args.duration is not None else w.duration_s
        if args.trace is not None:
            reqs = load_trace(args.trace, model=w.model, time_scale=args.trace_time_scale, rate=args.rate,
                              stream=w.stream >= 0.5)
            if args.duration is not None:
                reqs = [r for r in reqs if r.t < duration]
            duration = reqs[-1].t if reqs else 0.0
        else:
            reqs = plan(w, seed=args.seed, rate=args.rate, duration_s=duration)
        if args.admission == "gateway":
            from inferlb.bench.des_admission import GatewayAdmission
            from inferlb.config.admission import AdmissionPolicy

            admission: Any = GatewayAdmission(AdmissionPolicy(), max_inflight=args.max_inflight)
        else:
            admission = OpenAdmission(args.max_inflight)
        from inferlb.routing.length import LengthPredictor

        lengths = LengthPredictor(budget=args.output_length) if args.output_length != "off" else None
        sim = Simulation(specs, profile=args.profile, seed=args.seed, admission=admission, model=w.model,
                         scrape_s=args.scrape_s, timeout_s=w.timeout_s, lengths=lengths)
    except (ValueError, ConfigError) as exc:
        print(f"inferlb: error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    res = sim.run(reqs)
    wall = time.perf_counter() - t0
    summary = des_summary(res, w, duration_s=duration if duration > 0 else None, wall_s=wall)
    if lengths is not None:
        summary["output_length"] = lengths.summary()
    summary.update({"profile": args.profile, "workload": w.name, "trace": str(args.trace) if args.trace else None,
                    "seed": args.seed, "fleet": {s.name: s.preset for s in specs} if len(specs) <= 16
                    else f"{len(specs)} nodes", "events": sim.events})
    if args.json:
        print(json.dumps(summary, indent=1, default=_nan_none))
    else:
        _print(summary)
    return 0


def _nan_none(x: Any) -> Any:
    return None


def _f(v: Any, fmt: str = ".3f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _print(s: dict[str, Any]) -> None:
    o = s["outcomes"]
    print(f"inferlb sim des: {s['workload']} · {s['profile']} · {s['requests']} requests over "
          f"{s['virtual_s']:.1f} virtual s in {s['wall_s']:.2f} s of wall time ({s['events']} events)")
    print(f"  outcomes      {', '.join(f'{k} {v}' for k, v in o.items())}")
    print(f"  SLO           TTFT ≤ {s['slo']['ttft_s']:g} s, e2e ≤ {s['slo']['e2e_s']:g} s: "
          f"attainment {_f(s['slo_attainment'] * 100, '.2f')} %, goodput {_f(s['goodput_rps'], '.2f')} req/s "
          f"of {_f(s['offered_rps'], '.2f')} offered")
    for key, label in (("ttft_s", "TTFT"), ("e2e_s", "e2e")):
        p = s[key]
        print(f"  {label:13} p50 {_f(p['p50'])}  p90 {_f(p['p90'])}  p99 {_f(p['p99'])}  mean {_f(p['mean'])} s")
    gh = ", ".join(f"{k} {v:.3f}" for k, v in s["gpu_hours"].items())
    print(f"  GPU-hours     {s['gpu_hours_total']:.3f} ({gh})")
    nodes = sorted(s["nodes"].items(), key=lambda kv: -kv[1]["requests"])
    shown = nodes[:8]
    print("  node           preset  requests  busy  preemptions")
    for name, n in shown:
        print(f"  {name:14} {n['preset'] or '-':7} {n['requests']:8d}  {n['busy_share']:4.0%}  {n['preemptions']:11d}")
    if len(nodes) > len(shown):
        print(f"  … {len(nodes) - len(shown)} more nodes")
