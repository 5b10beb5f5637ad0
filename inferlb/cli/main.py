"""The ``inferlb`` command.

::

    inferlb demo                      gateway on 127.0.0.1:8080 + 3 simulated nodes, SQLite audit
    inferlb serve --config fleet.yaml gateway in front of real OpenAI-compatible servers
    inferlb validate [FILE] [--config FLEET]  validate a BPMN process and/or a fleet file + the processes
    inferlb db upgrade                apply Alembic migrations to INFERLB_DATABASE_URL
    inferlb db prune --older-than 30d audit retention (drops day partitions on PostgreSQL)
    inferlb report sla|cost           SLA / cost tables from the audit trail (--group-by, --bucket, --csv)
    inferlb report capacity --config F  scaling advice per model and GPU type (inferlb/cli/autoscale.py)
    inferlb demo --autoscale          the demo with the local autoscaler starting emulated nodes
    inferlb autoscale backtest        the autoscaler over simulated days (inferlb/cli/backtest.py)
    inferlb sim [--fleet hetero4]     run simulated GPU nodes only (vLLM-like engines, /metrics)
    inferlb bench overhead            gateway overhead vs direct / floor proxy / nginx
    inferlb bench overload            admission control at 2× / 5× capacity, noisy neighbour (on vs off)
    inferlb bench replicas            1, 2, 3 replicas on one Redis: req/s, CPU per request, admission cost
    inferlb keys create|list|revoke   tenant API keys (stored as SHA-256 digests)
    inferlb bench run|compare|capacity  open-loop load against simulated fleets (routing strategies)
    inferlb fleet [show] --url URL    node states of a running gateway (GET /admin/fleet) as a table
    inferlb fleet add|drain|undrain|set|remove|reload   change the running fleet (inferlb/cli/fleet.py)
    inferlb rollout start|status|abort  canary rollouts of model versions (inferlb/cli/rollout.py)
    inferlb agent [--port 9401]       the GPU node agent: NVML readings over HTTP (GET /gpu)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from inferlb.cli.db import add_db_parser, db_command
from inferlb.config.settings import FleetConfig, Settings, fleet_from_mapping, load_settings
from inferlb.errors import ConfigError, InferlbError, ProcessValidationError

__all__ = ["main"]


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when it is installed (it comes with uvicorn[standard]): the asyncio
    loop written in Python was a measured ~10 % of the gateway's CPU per request."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    over: dict[str, Any] = dict(extra)
    for key in ("host", "port", "config", "database_url", "engine"):
        val = getattr(args, key, None)
        if val is not None:
            over[key] = val
    return load_settings(**over)


def _preflight(settings: Settings) -> Settings:
    """Every start-up file check before the app starts (a bad file is one line, not a traceback
    from inside the lifespan); returns the settings with the fleet resolved."""
    from inferlb.app import check_startup_files
    from inferlb.live.startup import check_journal_dir

    checked = check_startup_files(settings)
    check_journal_dir(settings.journal_dir)
    return settings.model_copy(update={"fleet": checked.fleet})


async def _serve(settings: Settings, banner: str | None = None, *, watch: bool = False,
                 node_launcher: Any = None) -> None:
    from inferlb.app import create_app, default_processes_dir
    from inferlb.live.triggers import run_triggers
    from inferlb.server import build_server
    from inferlb.server.gc_tuning import tune_gc

    # Fail before binding a port: a bad file names the file and key path or element, no traceback.
    settings = _preflight(settings)
    app = create_app(settings, node_launcher=node_launcher)
    # httptools with header/body timeouts and header limits; SIGTERM drains (server).
    server = build_server(app, settings)

    async def _started() -> None:
        while not server.started and not server.should_exit:
            await asyncio.sleep(0.05)
        if server.started:
            # Start-up done: its objects leave the collector's work (INFERLB_GC_*, server/gc_tuning.py).
            tune_gc(freeze=settings.gc_freeze, gen0_threshold=settings.gc_gen0_threshold)
            if banner:
                print(banner, flush=True)
    task = asyncio.ensure_future(_started())
    # SIGHUP (and with --watch, edits to the fleet file or the processes) reload (live/manager.py).
    triggers = asyncio.ensure_future(run_triggers(
        app, started=lambda: bool(server.started), stopping=lambda: bool(server.should_exit), watch=watch,
        config=settings.config, processes_dir=settings.processes_dir or default_processes_dir()))
    await server.serve()
    triggers.cancel()
    task.cancel()
    if not server.started:
        raise SystemExit(1)


def demo_fleet(urls: dict[str, str]) -> FleetConfig:
    """The demo fleet over the simulated nodes (3 speeds; one also serves embeddings). ``demo-llm``
    has two versions on every node: ``v1`` (all traffic) and ``v2`` (none yet; the nodes know it
    as ``demo-llm-v2``), so ``inferlb rollout start --model demo-llm --from v1 --to v2`` works at
    once, with criteria a few minutes of demo traffic can satisfy."""
    return fleet_from_mapping({
        "models": [
            {"name": "demo-llm", "max_context_tokens": 8192, "max_output_tokens": 2048, "default_max_tokens": 64,
             "versions": [{"name": "v1", "weight": 100},
                          {"name": "v2", "weight": 0, "upstream_name": "demo-llm-v2"}]},
            {"name": "demo-embed", "kind": "embedding"},
        ],
        "nodes": [
            {"name": name, "url": url, "models": ["demo-llm", "demo-embed"], "kind": "sim",
             "capacity_tokens": kv, "max_concurrency": 64, "price_per_hour": price}
            # capacity_tokens = each simulated node's KV cache (the h100 / a100 / l4 presets of demo_specs)
            for (name, url), price, kv in zip(urls.items(), (2.5, 1.2, 0.6), (65536, 49152, 12288), strict=False)
        ],
        "routing": {"profile": "token-aware"},
        "slos": [{"model": "demo-llm", "e2e_max_s": 5.0, "ttft_max_s": 1.0}],
        "rollouts": {"steps": [10, 50, 100],
                     "criteria": {"min_requests": 30, "min_step_s": 10, "max_step_s": 600, "window_s": 300,
                                  "max_error_rate_increase": 0.1, "max_slo_miss_increase": 0.1}},
    }, source="demo")


_BANNER = """
inferlb demo is ready: gateway http://{host}:{port}  (simulated nodes: {nodes})
audit database: {db}   engine: INFERLB_ENGINE={engine}

  curl -s http://{host}:{port}/v1/chat/completions -H 'content-type: application/json' \\
       -d '{{"model": "demo-llm", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 16}}'

  python - <<'PY'
  from openai import OpenAI
  client = OpenAI(base_url="http://{host}:{port}/v1", api_key="unused")
  for chunk in client.chat.completions.create(model="demo-llm", stream=True,
          messages=[{{"role": "user", "content": "Hello!"}}], max_tokens=16):
      print(chunk.choices[0].delta.content or "", end="", flush=True)
  PY

  curl -s 'http://{host}:{port}/reports/sla?group_by=node'     # SLA report from the audit trail
  curl -s 'http://{host}:{port}/audit/requests?limit=5'         # the audit trail
  open http://{host}:{port}/dashboard                             # latency, SLO, cost and node-state charts
  curl -s http://{host}:{port}/metrics                              # Prometheus metrics
  inferlb rollout start --url http://{host}:{port} --model demo-llm --from v1 --to v2   # a canary of v2

{auth} Ctrl-C stops it.
"""
_AUTH_ON = ("Authentication is ON: the OpenAI routes want a tenant key (inferlb keys create), the others\n"
            "the admin key (INFERLB_ADMIN_KEY), sent as 'Authorization: Bearer <key>'.")
_AUTH_OFF = "Authentication is OFF: every route above answers anyone (INFERLB_AUTH=on turns it on)."


def demo_banner(settings: Settings, nodes: list[str]) -> str:
    """The demo's start-up text; its last line says whether tenant auth is on (env or fleet file)."""
    auth = settings.admission.auth or (settings.fleet is not None and settings.fleet.admission.auth)
    return _BANNER.format(host=settings.host, port=settings.port, nodes=", ".join(nodes), db=settings.database_url,
                          engine=settings.engine, auth=_AUTH_ON if auth else _AUTH_OFF)


async def _demo(args: argparse.Namespace) -> None:
    from inferlb.simulator.emulator import SimFleet
    from inferlb.simulator.spec import demo_specs

    async with SimFleet(demo_specs()) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        fleet, launcher = demo_fleet(urls), None
        if getattr(args, "autoscale", False):
            from inferlb.cli.autoscale import SimLauncher, demo_autoscale_fleet

            fleet, launcher = demo_autoscale_fleet(fleet), SimLauncher()
        settings = _settings(args, fleet=fleet)
        await _serve(settings, demo_banner(settings, list(urls.values())), node_launcher=launcher)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _print_problems(exc: ProcessValidationError | ConfigError) -> None:
    """One line per problem on stderr: file, element id or key path, problem."""
    if isinstance(exc, ProcessValidationError):
        for eid, msg in exc.problems:
            print(f"inferlb: error: {_one_line(f'{exc.source}: {eid}: {msg}')}", file=sys.stderr)
    else:
        print(f"inferlb: error: {_one_line(str(exc))}", file=sys.stderr)


def _cmd_validate(args: argparse.Namespace) -> int:
    from inferlb.app import check_startup_files
    from inferlb.tasks import HEALTH_CONTRACT, REQUEST_CONTRACT, ROLLOUT_CONTRACT, SERVICES
    from inferlb.workflow.definition import load_process

    if args.file is None and args.config is None:
        print("inferlb: error: validate needs a BPMN FILE, --config FLEET, or both", file=sys.stderr)
        return 2
    failed = False
    if args.file is not None:
        contract = REQUEST_CONTRACT
        engine = args.engine or "auto"
        text = Path(args.file).read_text(errors="replace") if Path(args.file).is_file() else ""
        if "health/probe" in text or "rollout/observe" in text:
            # A node-health or rollout process: its own required tasks and start data; always on SpiffWorkflow.
            contract = HEALTH_CONTRACT if "health/probe" in text else ROLLOUT_CONTRACT
            engine = args.engine or "spiff"
        try:
            d = load_process(args.file, SERVICES, engine=engine,
                             required={} if args.no_required else dict(contract.required),
                             start_data=contract.start_data)
        except ProcessValidationError as exc:
            _print_problems(exc)
            failed = True
        else:
            print(f"OK {d.path} (process {d.process_id}): executor {d.mode}")
            for eid, why in d.compiled_problems:
                print(f"  runs on spiff because {eid} is outside the compiled subset ({why})")
    if args.config is not None:
        try:
            settings = _settings(args)
            checked = check_startup_files(settings)
        except (ConfigError, ProcessValidationError) as exc:
            _print_problems(exc)
            failed = True
        else:
            print(f"OK {args.config}: {len(checked.fleet.nodes)} node(s), {len(checked.fleet.models)} model(s); "
                  f"{checked.request_process.path} (executor {checked.request_process.mode}), "
                  f"{checked.health_process.path} (executor {checked.health_process.mode})"
                  + (f", {checked.rollout_process.path} (executor {checked.rollout_process.mode})"
                     if checked.rollout_process is not None else ""))
    return 1 if failed else 0


def _cmd_report(args: argparse.Namespace) -> int:
    from inferlb.cli.audit import report_cost, report_sla
    from inferlb.cost import node_prices

    settings = _settings(args)
    fleet = settings.resolved_fleet() if settings.config is not None else None
    common: dict[str, Any] = {"since": args.since, "until": args.until, "bucket": args.bucket, "fmt": args.format,
                              "csv_path": args.csv}
    if args.kind == "capacity":
        from inferlb.cli.autoscale import capacity_command

        return capacity_command(args, settings.database_url, fleet)
    if args.kind == "cost":
        if fleet is None:
            print("inferlb: note: no --config: node prices are unknown, every cost is 0", file=sys.stderr)
        prices = node_prices(fleet.nodes, fleet.observability.finops) if fleet is not None else {}
        currency = fleet.observability.finops.currency if fleet is not None else "USD"
        print(report_cost(settings.database_url, prices=prices, currency=currency,
                          group_by=args.group_by or "tenant", **common))
    else:
        print(report_sla(settings.database_url, group_by=args.group_by or "model",
                         slos=list(fleet.slos) if fleet is not None else [], **common))
    return 0


async def _sim(args: argparse.Namespace) -> None:
    from inferlb.simulator.emulator import serve_sim
    from inferlb.simulator.presets import cli_specs

    def ready(urls: dict[str, str]) -> None:
        print(json.dumps(urls, indent=2), flush=True)

    try:
        specs = cli_specs(args.fleet, on_kv_full=args.on_kv_full, stream_interval=args.stream_interval)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    await serve_sim(specs, host=args.host or "127.0.0.1", ports=args.ports, on_ready=ready)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inferlb", description="Model-aware inference load balancer.")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--host")
        sp.add_argument("--port", type=int)
        sp.add_argument("--database-url", dest="database_url")
        sp.add_argument("--engine", choices=["auto", "spiff", "compiled"])

    d = sub.add_parser("demo", help="gateway + 3 simulated nodes, SQLite audit in the working directory")
    common(d)
    d.add_argument("--autoscale", action="store_true", help="run the local autoscaler (emulated nodes join the fleet)")
    s = sub.add_parser("serve", help="run the gateway against a fleet file")
    common(s)
    s.add_argument("--config", type=Path)
    s.add_argument("--watch", action="store_true", help="reload when the fleet file or a process changes")
    v = sub.add_parser("validate", help="parse and validate a BPMN process")
    v.add_argument("file", type=Path, nargs="?", help="a BPMN process file")
    v.add_argument("--config", type=Path, help="a fleet file: validated with the processes the gateway would load")
    v.add_argument("--engine", choices=["auto", "spiff", "compiled"])
    v.add_argument("--no-required", action="store_true", help="do not require the request-process tasks")
    add_db_parser(sub)
    r = sub.add_parser("report", help="reports from the audit trail")
    r.add_argument("kind", choices=["sla", "cost", "capacity"])
    r.add_argument("--since")
    r.add_argument("--until")
    r.add_argument("--group-by", dest="group_by", help="model, version, node, tenant, priority (comma-separated) "
                   "or none; default model (sla), tenant (cost)")
    r.add_argument("--bucket", help="time buckets, e.g. 5m, 1h, 1d")
    r.add_argument("--csv", type=Path, help="also write the report as CSV to this file")
    r.add_argument("--format", default="table", choices=["table", "json", "csv"])
    r.add_argument("--database-url", dest="database_url")
    r.add_argument("--config", type=Path)
    sm = sub.add_parser("sim", help="run the simulated demo nodes only")
    sm.add_argument("--host")
    sm.add_argument("--ports", type=int, nargs="*")
    sm.add_argument("--fleet", help="hetero4, uniform4, large16, cache4 or a fleet file (default: the demo nodes)")
    sm.add_argument("--on-kv-full", dest="on_kv_full", choices=["preempt", "oom"])
    sm.add_argument("--stream-interval", dest="stream_interval", type=int)
    from inferlb.cli.sim import register as register_sim_des

    register_sim_des(sm)   # inferlb sim des: the discrete-event mode
    from inferlb.cli.fleet import register as register_fleet

    register_fleet(sub)
    from inferlb.cli.backtest import register as register_backtest

    register_backtest(sub)   # inferlb autoscale backtest
    ag = sub.add_parser("agent", help="GPU node agent: NVML readings over HTTP (needs the agent extra)")
    ag.add_argument("--host", default="127.0.0.1")
    ag.add_argument("--port", type=int, default=9401)
    from inferlb.cli.keys import add_keys_parser

    add_keys_parser(sub)
    from inferlb.cli.routing import add_routing_parser

    add_routing_parser(sub)
    from inferlb.cli.rollout import register as add_rollout_parser

    add_rollout_parser(sub)
    b = sub.add_parser("bench", help="benchmarks")
    b.add_argument("what", choices=["overhead", "run", "compare", "capacity", "overload", "replicas"])
    b.add_argument("rest", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Per-probe request lines (every health interval) and migration chatter drown the useful log.
    for noisy in ("httpx", "httpcore", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if args.cmd == "demo":
            _run_loop(_demo(args))
        elif args.cmd == "serve":
            _run_loop(_serve(_settings(args), watch=args.watch))
        elif args.cmd == "validate":
            return _cmd_validate(args)
        elif args.cmd == "db":
            return db_command(args, _settings(args))
        elif args.cmd == "report":
            return _cmd_report(args)
        elif args.cmd == "sim" and getattr(args, "sim_handler", None) is not None:
            return int(args.sim_handler(args))
        elif args.cmd == "sim":
            asyncio.run(_sim(args))
        elif args.cmd == "routing":
            from inferlb.cli.routing import routing_command

            return routing_command(args, _settings(args).database_url)
        elif args.cmd == "autoscale":
            return int(args.autoscale_handler(args))
        elif args.cmd == "fleet":
            from inferlb.cli.fleet import fleet_main

            return fleet_main(args)
        elif args.cmd == "agent":
            from inferlb.health.agent import serve_agent

            asyncio.run(serve_agent(args.host, args.port,
                                    on_ready=lambda url: print(f"inferlb agent serving {url}/gpu", flush=True)))
        elif args.cmd == "rollout":
            from inferlb.cli.rollout import rollout_command

            return rollout_command(args)
        elif args.cmd == "keys":
            from inferlb.cli.keys import keys_command

            return keys_command(args, _settings(args).database_url)
        elif args.cmd == "bench" and args.what == "replicas":
            from inferlb.bench.replicas import main as replicas_main

            return replicas_main(args.rest)
        elif args.cmd == "bench" and args.what == "overload":
            from inferlb.bench.overload import main as overload_main

            return overload_main(args.rest)
        elif args.cmd == "bench":
            if args.what != "overhead":
                from inferlb.bench.loadgen.cli import main as loadgen_main

                return loadgen_main(args.what, args.rest)
            from inferlb.bench.overhead import main as bench_main

            return bench_main(args.rest)
    except (ConfigError, InferlbError) as exc:
        # One line, whatever went wrong in the operator's files: file, key path / element, problem.
        print(f"inferlb: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # uvicorn re-raises the Ctrl-C it handled after a graceful shutdown: a normal stop.
        return 0 if args.cmd in ("demo", "serve", "sim", "agent") else 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
