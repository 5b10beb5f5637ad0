"""``inferlb serve``: the gateway in front of a fleet file's nodes (and what ``inferlb demo`` runs).

::

    inferlb serve --config fleet.yaml [--watch] [--host H] [--port P] [--database-url URL] [--engine E]

Contract: the public listener's port is bound first, before any other start-up work (a port in use
is one line on stderr and exit 2 at once); then every start-up file is checked before the app starts
(a bad file is one line on stderr, exit 2, not a traceback from inside the lifespan); SIGTERM
drains; SIGHUP, and with ``--watch`` edits to the fleet file or the processes, reload
(inferlb/live/manager.py). Ctrl-C is a normal stop (exit 0). The admin listener
(``INFERLB_ADMIN_HOST``/``INFERLB_ADMIN_PORT``, inferlb/server/listeners.py) listens beside the
public one, and one log line at start-up says where the admin routes are served and with which key.
With ``INFERLB_TLS_CERT_FILE`` the public listener serves HTTPS (the admin listener per
``INFERLB_ADMIN_TLS``); a certificate, key or CA that does not load is one line and exit 2 before
any other start-up work, like a port in use (server/listeners.py ``listener_contexts``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferlb.cli.shared import add_gateway_options, settings_from

if TYPE_CHECKING:
    from inferlb.config.settings import Settings

__all__ = ["preflight", "register", "run_loop", "serve_gateway"]

log = logging.getLogger("inferlb")


def register(sub: Any) -> None:
    """Add ``serve`` to the ``inferlb`` parser's subcommands."""
    s = sub.add_parser("serve", help="run the gateway against a fleet file")
    add_gateway_options(s)
    s.add_argument("--config", type=Path)
    s.add_argument("--watch", action="store_true", help="reload when the fleet file or a process changes")
    # uvicorn re-raises the Ctrl-C it handled after a graceful shutdown: a normal stop.
    s.set_defaults(handler=_serve_command, ctrl_c_status=0)


def _serve_command(args: argparse.Namespace) -> int:
    run_loop(serve_gateway(settings_from(args), watch=args.watch))
    return 0


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when it is installed (it comes with uvicorn[standard]): the asyncio
    loop written in Python was a measured ~10 % of the gateway's CPU per request."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def preflight(settings: Settings) -> Settings:
    """Every start-up file check before the app starts (a bad file is one line, not a traceback
    from inside the lifespan); returns the settings with the fleet resolved."""
    from inferlb.app import check_startup_files
    from inferlb.live.startup import check_journal_dir

    checked = check_startup_files(settings)
    check_journal_dir(settings.journal_dir)
    return settings.model_copy(update={"fleet": checked.fleet})


async def serve_gateway(settings: Settings, banner: str | None = None, *, watch: bool = False,
                        node_launcher: Any = None) -> None:
    """Serve the gateway until it stops; ``banner`` is printed once it listens. SystemExit(1) when
    it never started (the port was taken, say)."""
    from inferlb.app import create_app, default_processes_dir
    from inferlb.live.triggers import run_triggers
    from inferlb.server import build_server
    from inferlb.server.gc_tuning import tune_gc
    from inferlb.server.listeners import admin_address, bind_public, describe_admin, listener_contexts

    # The port first: a port in use is one line at once, before the database, the processes and the
    # fleet are set up (server/listeners.py); the server listens on this socket once started.
    sock = bind_public(settings)
    try:
        # A bad file names the file and key path or element, no traceback; so does a certificate or
        # key that does not load (INFERLB_TLS_*, server/listeners.py), before anything is set up.
        admin = admin_address(settings)
        tls = listener_contexts(settings, admin)
        settings = preflight(settings)
    except BaseException:
        sock.close()
        raise
    app = create_app(settings, node_launcher=node_launcher)
    # httptools with header/body timeouts and header limits; SIGTERM drains; the admin listener (server).
    server = build_server(app, settings, admin=admin, tls=tls)
    if tls.public is not None:
        log.info("public listener: HTTPS (client certificates: %s)", settings.tls.effective_client_auth())
    log.info("%s", describe_admin(settings, admin, tls=tls.admin is not None))

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
    await server.serve(sockets=[sock])
    triggers.cancel()
    task.cancel()
    if not server.started:
        raise SystemExit(1)
