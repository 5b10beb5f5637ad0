"""The ``inferlb`` command.

::

    inferlb demo                      gateway on 127.0.0.1:8080 + 3 simulated nodes, SQLite audit
    inferlb serve --config fleet.yaml gateway in front of real OpenAI-compatible servers
    inferlb validate FILE             parse + validate a BPMN process, show its executor
    inferlb db upgrade                apply Alembic migrations to INFERLB_DATABASE_URL
    inferlb report sla                SLA table from the audit trail
    inferlb sim                       run simulated nodes only
    inferlb bench overhead            gateway overhead vs direct / floor proxy / nginx
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from .errors import ConfigError, InferlbError, ProcessValidationError
from .settings import FleetConfig, Settings, fleet_from_mapping, load_settings

__all__ = ["main"]


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    over: dict[str, Any] = dict(extra)
    for key in ("host", "port", "config", "database_url", "engine"):
        val = getattr(args, key, None)
        if val is not None:
            over[key] = val
    return load_settings(**over)


async def _serve(settings: Settings, banner: str | None = None) -> None:
    import uvicorn

    from .app import create_app

    # Fail before binding a port: a bad fleet file names the file and key path, no traceback.
    settings = settings.model_copy(update={"fleet": settings.resolved_fleet()})
    app = create_app(settings)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                            access_log=False, loop="asyncio", http="httptools", timeout_graceful_shutdown=25)
    server = uvicorn.Server(config)
    if banner:
        async def _announce() -> None:
            while not server.started and not server.should_exit:
                await asyncio.sleep(0.05)
            if server.started:
                print(banner, flush=True)
        task = asyncio.ensure_future(_announce())
    await server.serve()
    if banner:
        task.cancel()
    if not server.started:
        raise SystemExit(1)


def demo_fleet(urls: dict[str, str]) -> FleetConfig:
    """The demo fleet over the simulated nodes (3 speeds; one also serves embeddings)."""
    return fleet_from_mapping({
        "models": [
            {"name": "demo-llm", "max_context_tokens": 8192, "max_output_tokens": 2048, "default_max_tokens": 64},
            {"name": "demo-embed", "kind": "embedding"},
        ],
        "nodes": [
            {"name": name, "url": url, "models": ["demo-llm", "demo-embed"], "kind": "sim",
             "capacity_tokens": 16384, "max_concurrency": 64, "price_per_hour": price}
            for (name, url), price in zip(urls.items(), (2.5, 1.2, 0.6), strict=False)
        ],
        "routing": {"profile": "token-aware"},
        "slos": [{"model": "demo-llm", "e2e_max_s": 5.0, "ttft_max_s": 1.0}],
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

Authentication is OFF in the demo (tenant API keys are not configured). Ctrl-C stops it.
"""


async def _demo(args: argparse.Namespace) -> None:
    from inferlb.simulator import SimFleet, demo_specs

    async with SimFleet(demo_specs()) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        settings = _settings(args, fleet=demo_fleet(urls))
        banner = _BANNER.format(host=settings.host, port=settings.port, nodes=", ".join(urls.values()),
                                db=settings.database_url, engine=settings.engine)
        await _serve(settings, banner)


def _cmd_validate(args: argparse.Namespace) -> int:
    from inferlb.tasks import REQUIRED_TASKS, SERVICES

    from .workflow import load_process

    required = {} if args.no_required else REQUIRED_TASKS
    try:
        d = load_process(args.file, SERVICES, engine=args.engine or "auto", required=required)
    except ProcessValidationError as exc:
        print(f"INVALID {exc.source}")
        for eid, msg in exc.problems:
            print(f"  {eid}: {msg}")
        return 1
    print(f"OK {d.path} (process {d.process_id}): executor {d.mode}")
    for eid, why in d.compiled_problems:
        print(f"  runs on spiff because {eid} is outside the compiled subset ({why})")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .store.commands import report_sla

    settings = _settings(args)
    slos = []
    if settings.config is not None:
        slos = list(settings.resolved_fleet().slos)
    print(report_sla(settings.database_url, since=args.since, until=args.until, group_by=args.group_by,
                     slos=slos, fmt=args.format))
    return 0


def _cmd_db(args: argparse.Namespace) -> int:
    from .store.commands import db_upgrade

    settings = _settings(args)
    db_upgrade(settings.database_url)
    print(f"database at head: {settings.database_url}")
    return 0


async def _sim(args: argparse.Namespace) -> None:
    from inferlb.simulator import serve_sim

    def ready(urls: dict[str, str]) -> None:
        print(json.dumps(urls, indent=2), flush=True)

    await serve_sim(host=args.host or "127.0.0.1", ports=args.ports, on_ready=ready)


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
    s = sub.add_parser("serve", help="run the gateway against a fleet file")
    common(s)
    s.add_argument("--config", type=Path)
    v = sub.add_parser("validate", help="parse and validate a BPMN process")
    v.add_argument("file", type=Path)
    v.add_argument("--engine", choices=["auto", "spiff", "compiled"])
    v.add_argument("--no-required", action="store_true", help="do not require the request-process tasks")
    db = sub.add_parser("db", help="database maintenance")
    db.add_argument("action", choices=["upgrade"])
    db.add_argument("--database-url", dest="database_url")
    r = sub.add_parser("report", help="reports from the audit trail")
    r.add_argument("kind", choices=["sla"])
    r.add_argument("--since")
    r.add_argument("--until")
    r.add_argument("--group-by", dest="group_by", default="model", choices=["model", "node", "tenant"])
    r.add_argument("--format", default="table", choices=["table", "json", "csv"])
    r.add_argument("--database-url", dest="database_url")
    r.add_argument("--config", type=Path)
    sm = sub.add_parser("sim", help="run the simulated demo nodes only")
    sm.add_argument("--host")
    sm.add_argument("--ports", type=int, nargs="*")
    b = sub.add_parser("bench", help="benchmarks")
    b.add_argument("what", choices=["overhead"])
    b.add_argument("rest", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.cmd == "demo":
            asyncio.run(_demo(args))
        elif args.cmd == "serve":
            asyncio.run(_serve(_settings(args)))
        elif args.cmd == "validate":
            return _cmd_validate(args)
        elif args.cmd == "db":
            return _cmd_db(args)
        elif args.cmd == "report":
            return _cmd_report(args)
        elif args.cmd == "sim":
            asyncio.run(_sim(args))
        elif args.cmd == "bench":
            from inferlb.simulator.bench_overhead import main as bench_main

            return bench_main(args.rest)
    except (ConfigError, InferlbError) as exc:
        print(f"inferlb: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # uvicorn re-raises the Ctrl-C it handled after a graceful shutdown: a normal stop.
        return 0 if args.cmd in ("demo", "serve", "sim") else 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
