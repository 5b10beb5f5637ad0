"""``inferlb agent``: the GPU node agent, NVML readings over HTTP (inferlb/health/agent.py).

::

    inferlb agent [--host 127.0.0.1] [--port 9401]

Prints ``inferlb agent serving URL/gpu`` once it listens and serves until Ctrl-C, a normal stop
(exit 0). Needs the ``agent`` extra for NVML; without it the agent still serves and says NVML is
unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

__all__ = ["agent_command", "register"]


def register(sub: Any) -> None:
    """Add ``agent`` to the ``inferlb`` parser's subcommands."""
    ag = sub.add_parser("agent", help="GPU node agent: NVML readings over HTTP (needs the agent extra)")
    ag.add_argument("--host", default="127.0.0.1")
    ag.add_argument("--port", type=int, default=9401)
    ag.set_defaults(handler=agent_command, ctrl_c_status=0)


def agent_command(args: argparse.Namespace) -> int:
    """Run the agent on ``--host``:``--port`` until Ctrl-C."""
    from inferlb.health.agent import serve_agent

    asyncio.run(serve_agent(args.host, args.port,
                            on_ready=lambda url: print(f"inferlb agent serving {url}/gpu", flush=True)))
    return 0
