"""``inferlb demo``: the gateway on 127.0.0.1:8080 in front of 3 simulated nodes, SQLite audit.

::

    inferlb demo [--autoscale] [--model-server sim|llamacpp] [--host H] [--port P] [--database-url URL]
                 [--engine E]

The simulated nodes (inferlb/simulator) run in the same process; ``--model-server llamacpp`` puts
two real llama.cpp servers (inferlb/modelserver/llamacpp.py: SmolLM2-135M-Instruct on one CPU
thread each, the ``engines`` extra) behind the gateway instead, for real answers; the audit database is a SQLite
file in the working directory unless INFERLB_DATABASE_URL or ``--database-url`` says otherwise.
Once the gateway listens, the banner (:func:`demo_banner`) says how to use it: the admin routes
(audit, reports, dashboard data, rollouts) are on the admin listener, the gateway's port + 1 on
127.0.0.1, without a key unless INFERLB_ADMIN_KEY is set. ``--autoscale``
adds the local autoscaler, which starts emulated nodes that join the fleet
(inferlb/cli/autoscale.py). Ctrl-C is a normal stop (exit 0).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from inferlb.cli.serve import run_loop, serve_gateway
from inferlb.cli.shared import add_gateway_options, settings_from

if TYPE_CHECKING:
    from inferlb.config.settings import FleetConfig, Settings

__all__ = ["demo_banner", "demo_fleet", "llamacpp_fleet", "register"]


def register(sub: Any) -> None:
    """Add ``demo`` to the ``inferlb`` parser's subcommands."""
    d = sub.add_parser("demo", help="gateway + 3 simulated nodes, SQLite audit in the working directory")
    add_gateway_options(d)
    d.add_argument("--autoscale", action="store_true", help="run the local autoscaler (emulated nodes join the fleet)")
    d.add_argument("--model-server", dest="model_server", choices=["sim", "llamacpp"], default="sim",
                   help="sim: 3 simulated nodes (default); llamacpp: 2 real llama.cpp servers with a small "
                        "model on the CPU (pip install 'inferlb[engines]')")
    # uvicorn re-raises the Ctrl-C it handled after a graceful shutdown: a normal stop.
    d.set_defaults(handler=_demo_command, ctrl_c_status=0)


def _demo_command(args: argparse.Namespace) -> int:
    run_loop(_demo(args))
    return 0


def demo_fleet(urls: dict[str, str]) -> FleetConfig:
    """The demo fleet over the simulated nodes (3 speeds; one also serves embeddings). ``demo-llm``
    has two versions on every node: ``v1`` (all traffic) and ``v2`` (none yet; the nodes know it
    as ``demo-llm-v2``), so ``inferlb rollout start --model demo-llm --from v1 --to v2`` works at
    once, with criteria a few minutes of demo traffic can satisfy."""
    from inferlb.config.settings import fleet_from_mapping

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


def llamacpp_fleet(urls: dict[str, str], alias: str) -> FleetConfig:
    """The demo fleet over real llama.cpp servers: ``demo-llm`` is the small model they serve as
    ``alias``; the servers hold 2,048 tokens of context and decode one request at a time."""
    from inferlb.config.settings import fleet_from_mapping

    return fleet_from_mapping({
        "models": [{"name": "demo-llm", "upstream_name": alias, "max_context_tokens": 2048,
                    "max_output_tokens": 512, "default_max_tokens": 64}],
        "nodes": [{"name": name, "url": url, "models": ["demo-llm"], "kind": "llamacpp-python"}
                  for name, url in urls.items()],
        "routing": {"profile": "token-aware"},
        "timeouts": {"connect_s": 2.0, "first_token_s": 60.0, "idle_s": 30.0, "total_s": 300.0},
        "slos": [{"model": "demo-llm", "e2e_max_s": 20.0, "ttft_max_s": 5.0}],
    }, source="demo --model-server llamacpp")


# The Python snippet is a heredoc whose lines start at column 0, so it pastes and runs as printed:
# Python refuses an indented first line, and the shell ends a <<'PY' heredoc only at a line that
# is exactly PY (tests/integration/test_demo_banner.py runs it).
_BANNER = """
inferlb demo is ready: gateway http://{host}:{port}  ({kind} nodes: {nodes})
{admin_line}
audit database: {db}   engine: INFERLB_ENGINE={engine}

  curl -s http://{host}:{port}/v1/chat/completions -H 'content-type: application/json' \\
       -d '{{"model": "demo-llm", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 16}}'

  pip install openai    # the OpenAI Python SDK, for the snippet below
python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="http://{host}:{port}/v1", api_key="unused")
for chunk in client.chat.completions.create(model="demo-llm", stream=True,
        messages=[{{"role": "user", "content": "Hello!"}}], max_tokens=16):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
PY

  curl -s{h} '{admin}/reports/sla?group_by=node'     # SLA report from the audit trail
  curl -s{h} '{admin}/audit/requests?limit=5'         # the audit trail
  open {admin}/dashboard                             # latency, SLO, cost and node-state charts
  curl -s http://{host}:{port}/metrics                              # Prometheus metrics
{rollout}
{auth} Ctrl-C stops it.
"""
_AUTH_ON = ("Authentication is ON: the OpenAI routes want a tenant key (inferlb keys create), the others\n"
            "the admin key (INFERLB_ADMIN_KEY), sent as 'Authorization: Bearer <key>'.")
_AUTH_OFF = "Authentication is OFF: the OpenAI routes above answer anyone (INFERLB_AUTH=on turns it on)."
_KEY = " -H \"authorization: Bearer $INFERLB_ADMIN_KEY\""
_ROLLOUT = "  inferlb rollout start --url {admin} --model demo-llm --from v1 --to v2   # a canary of v2\n"


def demo_banner(settings: Settings, nodes: list[str], kind: str = "simulated") -> str:
    """The demo's start-up text: the gateway, its ``kind`` of nodes (``simulated``: the fleet has a
    v2 to roll out; ``llama.cpp``: real servers, one version), where the admin routes are (the admin
    listener, keyless on loopback while no INFERLB_ADMIN_KEY is set: server/listeners.py) and whether
    tenant auth is on (env or fleet file), on its last line."""
    from inferlb.config.netpolicy import redact_url  # here: building the parser imports no pydantic
    from inferlb.server.listeners import admin_address

    auth = settings.admission.auth or (settings.fleet is not None and settings.fleet.admission.auth)
    address = admin_address(settings)
    keyed = settings.admission.admin_key is not None
    admin = f"http://{address[0]}:{address[1]}" if address else f"http://{settings.host}:{settings.port}"
    if address is None and not keyed:
        admin_line = "admin routes: off (INFERLB_ADMIN_PORT=0 and no INFERLB_ADMIN_KEY)"
    elif keyed:
        admin_line = f"admin routes: {admin} (with INFERLB_ADMIN_KEY; also on the gateway's port)"
    else:
        admin_line = f"admin routes: {admin} (loopback only, no key; the gateway's port answers them 404)"
    # The database URL may carry a password (INFERLB_DATABASE_URL=postgresql://user:pw@…): redacted.
    return _BANNER.format(host=settings.host, port=settings.port, nodes=", ".join(nodes),
                          db=redact_url(settings.database_url),
                          engine=settings.engine, auth=_AUTH_ON if auth else _AUTH_OFF, admin=admin,
                          admin_line=admin_line, h=_KEY if keyed else "", kind=kind,
                          rollout=_ROLLOUT.format(admin=admin) if kind == "simulated" else "")


async def _demo(args: argparse.Namespace) -> None:
    if getattr(args, "model_server", "sim") == "llamacpp":
        await _demo_llamacpp(args)
        return
    from inferlb.simulator.emulator import SimFleet
    from inferlb.simulator.spec import demo_specs

    async with SimFleet(demo_specs()) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        fleet, launcher = demo_fleet(urls), None
        if getattr(args, "autoscale", False):
            from inferlb.cli.autoscale import SimLauncher, demo_autoscale_fleet

            fleet, launcher = demo_autoscale_fleet(fleet), SimLauncher()
        settings = settings_from(args, fleet=fleet)
        await serve_gateway(settings, demo_banner(settings, list(urls.values())), node_launcher=launcher)


async def _demo_llamacpp(args: argparse.Namespace) -> None:
    import asyncio

    from inferlb.modelserver.llamacpp import LlamaServer, free_port, unavailable

    why = unavailable()
    if why is not None:
        raise SystemExit(f"inferlb: error: {why}")
    servers = {f"llama-{i}": LlamaServer(port=free_port(), alias="smollm2") for i in range(2)}
    try:
        for s in servers.values():
            await asyncio.to_thread(s.start)
        urls = {name: s.url for name, s in servers.items()}
        settings = settings_from(args, fleet=llamacpp_fleet(urls, "smollm2"))
        await serve_gateway(settings, demo_banner(settings, list(urls.values()), "llama.cpp"))
    finally:
        for s in servers.values():
            s.stop()
