"""The ``inferlb`` command: one table of commands.

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
    inferlb routing evaluate          off-policy evaluation of a routing profile (inferlb/cli/routing.py)
    inferlb agent [--port 9401]       the GPU node agent: NVML readings over HTTP (GET /gpu)

:data:`COMMANDS` is the one list of commands, a :class:`~inferlb.plugins.Table` like every other
extension point: name → the "module:attr" of the command's ``register(subparsers)``, uvicorn-style,
loaded when the parser is built. ``register`` adds the
command's parser (its subcommands, flags and help) and sets its handler with
``set_defaults(handler=...)``: a function of the parsed arguments that returns the exit status. A
command that serves until stopped also sets ``ctrl_c_status=0``. Importing this module imports
the standard library and inferlb.errors only; a command module imports what its handler needs
when the handler runs, so building the parser (``inferlb --help``) stays cheap.
"""

from __future__ import annotations

import argparse
import logging
import sys

from inferlb.cli.shared import one_line
from inferlb.errors import ConfigError, InferlbError
from inferlb.plugins import Table

__all__ = ["COMMANDS", "build_parser", "main"]

#: command → "module:attr" of its ``register(subparsers) -> None``, in the order ``--help`` lists them.
COMMANDS = Table("command", {
    "demo": "inferlb.cli.demo:register",
    "serve": "inferlb.cli.serve:register",
    "validate": "inferlb.cli.validate:register",
    "db": "inferlb.cli.db:register",
    "report": "inferlb.cli.report:register",
    "sim": "inferlb.cli.sim:register",
    "fleet": "inferlb.cli.fleet:register",
    "autoscale": "inferlb.cli.backtest:register",
    "agent": "inferlb.cli.agent:register",
    "keys": "inferlb.cli.keys:register",
    "routing": "inferlb.cli.routing:register",
    "rollout": "inferlb.cli.rollout:register",
    "bench": "inferlb.cli.bench:register",
}, custom=False)

# Exit status of a command stopped by Ctrl-C unless it says otherwise (128 + SIGINT, as shells do).
_CTRL_C_STATUS = 130


def build_parser() -> argparse.ArgumentParser:
    """The ``inferlb`` parser: every command of :data:`COMMANDS` registered on one set of subcommands."""
    p = argparse.ArgumentParser(prog="inferlb", description="Model-aware inference load balancer.")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in COMMANDS:
        COMMANDS.load(name)(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's arguments) and run the command's handler; returns the
    exit status. An error in the operator's input (any :class:`~inferlb.errors.InferlbError`) is one
    line on stderr and status 2."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Per-probe request lines (every health interval) and migration chatter drown the useful log.
    for noisy in ("httpx", "httpcore", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return int(args.handler(args))
    except (ConfigError, InferlbError) as exc:
        # One line, whatever went wrong in the operator's files: file, key path / element, problem.
        print(f"inferlb: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # uvicorn re-raises the Ctrl-C it handled after a graceful shutdown: a server's normal stop.
        return int(getattr(args, "ctrl_c_status", _CTRL_C_STATUS))


if __name__ == "__main__":
    sys.exit(main())
