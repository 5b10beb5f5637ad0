"""``inferlb serve``: the gateway in front of a fleet file's nodes (and what ``inferlb demo`` runs).

::

    inferlb serve --config fleet.yaml [--watch] [--host H] [--port P] [--database-url URL] [--engine E]
                  [--workers N|auto]

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

With ``--workers N`` (``INFERLB_WORKERS``) above 1 this process is a supervisor instead
(inferlb/server/workers.py): it binds the listeners and checks the files as above, upgrades a
SQLite database once, starts the local coordinator when no ``INFERLB_REDIS_URL`` is set, and runs
N worker processes (``serve --worker I --worker-fds ...``, internal options) that serve on the
sockets it bound; SIGTERM and Ctrl-C drain them all and exit 0. ``--workers 1`` (the default) is
the one process described above, with no supervisor.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferlb.cli.shared import add_gateway_options, settings_from

if TYPE_CHECKING:
    from inferlb.config.settings import Settings

__all__ = ["preflight", "register", "run_loop", "run_workers", "serve_gateway", "worker_argv", "worker_env"]

log = logging.getLogger("inferlb")


def register(sub: Any) -> None:
    """Add ``serve`` to the ``inferlb`` parser's subcommands."""
    s = sub.add_parser("serve", help="run the gateway against a fleet file")
    add_gateway_options(s)
    s.add_argument("--config", type=Path)
    s.add_argument("--watch", action="store_true", help="reload when the fleet file or a process changes")
    s.add_argument("--workers", type=_workers_arg, metavar="N|auto",
                   help="gateway processes on the one port, sharing limits and health (default: "
                        "INFERLB_WORKERS, else 1; auto: one per core)")
    # Internal: how the supervisor starts a worker (server/workers.py); not for operators.
    s.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    s.add_argument("--worker-fds", dest="worker_fds", help=argparse.SUPPRESS)
    s.add_argument("--worker-run-dir", dest="worker_run_dir", type=Path, help=argparse.SUPPRESS)
    s.add_argument("--worker-count", dest="worker_count", type=int, help=argparse.SUPPRESS)
    # uvicorn re-raises the Ctrl-C it handled after a graceful shutdown: a normal stop.
    s.set_defaults(handler=_serve_command, ctrl_c_status=0)


def _workers_arg(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= 256:
        raise argparse.ArgumentTypeError(f"{value!r}: a number of processes from 1 to 256, or auto")
    return n


def _serve_command(args: argparse.Namespace) -> int:
    extra = {} if args.workers is None else {"workers": args.workers}
    settings = settings_from(args, **extra)
    if args.worker is not None:
        from inferlb.server.workers import parse_fds

        peers = None
        if args.worker_run_dir is not None and args.worker_count:
            peers = (args.worker, args.worker_count, args.worker_run_dir)
        run_loop(serve_gateway(settings, watch=args.watch, inherited=parse_fds(args.worker_fds or ""),
                               peers=peers))
        return 0
    n = settings.worker_count()
    if n > 1:
        return run_workers(settings, n, watch=args.watch)
    run_loop(serve_gateway(settings, watch=args.watch))
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
                        node_launcher: Any = None, inherited: list[int | None] | None = None,
                        peers: tuple[int, int, Path] | None = None) -> None:
    """Serve the gateway until it stops; ``banner`` is printed once it listens. SystemExit(1) when
    it never started (the port was taken, say). ``inherited``: a worker's descriptors from its
    supervisor (server/workers.py): the public socket, the admin socket or None, the orphan pipe;
    the worker serves on those instead of binding its own, and stops when the pipe closes.
    ``peers``: a worker's (index, worker count, the supervisor's run directory): ``/metrics``
    answers for every worker (server/worker_metrics.py)."""
    from inferlb.app import create_app, default_processes_dir
    from inferlb.live.triggers import run_triggers
    from inferlb.server import build_server
    from inferlb.server.gc_tuning import tune_gc
    from inferlb.server.listeners import admin_address, bind_public, describe_admin, listener_contexts

    # The port first: a port in use is one line at once, before the database, the processes and the
    # fleet are set up (server/listeners.py); the server listens on this socket once started.
    admin_sock: socket.socket | None = None
    orphan_fd: int | None = None
    if inherited is not None:
        from inferlb.server.workers import inherit_socket

        sock = inherit_socket(_fd(inherited[0]))
        admin_sock = inherit_socket(inherited[1]) if inherited[1] is not None else None
        orphan_fd = inherited[2]
    else:
        sock = bind_public(settings)
    try:
        # A bad file names the file and key path or element, no traceback; so does a certificate or
        # key that does not load (INFERLB_TLS_*, server/listeners.py), before anything is set up.
        admin = admin_address(settings) if admin_sock is None else admin_sock.getsockname()[:2]
        tls = listener_contexts(settings, admin)
        settings = preflight(settings)
    except BaseException:
        sock.close()
        raise
    app = create_app(settings, node_launcher=node_launcher)
    siblings = None
    if peers is not None:
        from inferlb.server.worker_metrics import WorkerMetrics

        def local() -> list[Any] | None:    # this worker's families, as its /metrics collects them
            obs = getattr(app.state, "observability", None)
            return None if obs is None or obs.metrics is None else list(obs.registry.collect())

        siblings = app.state.worker_metrics = WorkerMetrics(peers[0], peers[1], peers[2], local)
        await siblings.start()
    # httptools with header/body timeouts and header limits; SIGTERM drains; the admin listener (server).
    server = build_server(app, settings, admin=admin, tls=tls, admin_sock=admin_sock)
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
    unwatch = None
    if orphan_fd is not None:
        from inferlb.server.workers import watch_supervisor

        # the supervisor gone (even SIGKILLed): drain and stop, as on SIGTERM
        unwatch = watch_supervisor(orphan_fd, lambda: server.handle_exit(signal.SIGTERM, None))
    # SIGHUP (and with --watch, edits to the fleet file or the processes) reload (live/manager.py).
    triggers = asyncio.ensure_future(run_triggers(
        app, started=lambda: bool(server.started), stopping=lambda: bool(server.should_exit), watch=watch,
        config=settings.config, processes_dir=settings.processes_dir or default_processes_dir()))
    try:
        await server.serve(sockets=[sock])
    finally:
        if siblings is not None:
            await siblings.close()
    if unwatch is not None:
        unwatch()
    triggers.cancel()
    task.cancel()
    if not server.started:
        raise SystemExit(1)


def _fd(fd: int | None) -> int:
    if fd is None:
        raise ValueError("--worker-fds: no public socket")
    return fd


def worker_argv(index: int, fds: tuple[int | None, ...], *, watch: bool = False, run_dir: Path | None = None,
                count: int = 0) -> list[str]:
    """Worker ``index``'s command line: this interpreter, ``serve --worker I --worker-fds ...``
    (with the supervisor's run directory and the worker count: the workers' metrics sockets;
    and ``--watch``); every setting travels in the environment (:func:`worker_env`), never here."""
    from inferlb.server.workers import fds_arg

    argv = [sys.executable, "-m", "inferlb.cli.main", "serve", "--worker", str(index), "--worker-fds", fds_arg(fds)]
    if run_dir is not None and count:
        argv += ["--worker-run-dir", str(run_dir), "--worker-count", str(count)]
    return [*argv, "--watch"] if watch else argv


# On the local coordinator the supervisor removes a dead worker's shares and role at once
# (cluster/leave.py), so the leases only bound a worker that hangs: an idle worker renews every
# 10 s instead of every 1.7 s, the elected one every 20 s instead of 3.3 s (docs/replicas.md).
LOCAL_IDLE_LEASE_S = "30"
LOCAL_LEADER_LEASE_S = "60"


def replica_id(replica_base: str, index: int) -> str:
    """Worker ``index``'s cluster replica id (the same for each process of that worker)."""
    return f"{replica_base}-w{index}"


def worker_env(settings: Settings, index: int, *, port: int, admin_port: int, replica_base: str,
               redis_url: str | None, base: dict[str, str] | None = None, local: bool = False) -> dict[str, str]:
    """Worker ``index``'s environment: ``base`` (default this process's) with the settings the
    supervisor resolved (so ``--host``/``--port``/``--database-url``/``--engine``/``--config``
    reach it without its command line, where ``ps`` would show a database password), one worker
    (it never supervises), its own journal directory and cluster replica id, and the coordinator.
    ``local``: ``redis_url`` is the supervisor's own coordinator; then the idle and leader leases
    default to :data:`LOCAL_IDLE_LEASE_S` and :data:`LOCAL_LEADER_LEASE_S` (a value in ``base``
    wins)."""
    env = dict(os.environ if base is None else base)
    env.update({
        "INFERLB_WORKERS": "1",
        "INFERLB_HOST": settings.host,
        "INFERLB_PORT": str(port),
        "INFERLB_ADMIN_PORT": str(admin_port),
        "INFERLB_DATABASE_URL": settings.database_url,
        "INFERLB_ENGINE": settings.engine,
        "INFERLB_JOURNAL_DIR": str(settings.journal_dir / f"w{index}"),
        "INFERLB_CLUSTER_REPLICA_ID": replica_id(replica_base, index),
    })
    if local:
        env.setdefault("INFERLB_CLUSTER_IDLE_LEASE_S", LOCAL_IDLE_LEASE_S)
        env.setdefault("INFERLB_CLUSTER_LEADER_LEASE_S", LOCAL_LEADER_LEASE_S)
    if settings.config is not None:
        env["INFERLB_CONFIG"] = str(settings.config)
    if redis_url is not None:
        env["INFERLB_REDIS_URL"] = redis_url
    return env


def _forgetter(settings: Settings, url: str) -> Callable[[str], None]:
    """What the supervisor calls with a dead worker's replica id: its shares, heartbeat and database
    role given back at once (cluster/leave.py). The engine is made on first use."""
    from inferlb.cluster.leave import forget_replica
    from inferlb.store.db import make_engine

    engines: list[Any] = []

    def forget(replica: str) -> None:
        if not engines:
            engines.append(make_engine(settings.database_url))
        if forget_replica(url, settings.admission.redis_prefix, replica, engine=engines[0]):
            log.info("workers: %s left the cluster (its shares and role given back)", replica)
    return forget


def run_workers(settings: Settings, n: int, *, watch: bool = False) -> int:
    """``serve --workers N``: the supervisor (module docstring, server/workers.py); returns the exit status."""
    from inferlb.server.listeners import admin_address, listener_contexts
    from inferlb.server.workers import Coordinator, Supervisor, WorkerSpec, bind_admin, bind_reuseport, reserve_port
    from inferlb.store.db import is_sqlite, upgrade

    sock = reserve_port(settings.host, settings.port)     # the port first, as with one process
    admin_sock: socket.socket | None = None
    public: dict[int, socket.socket] = {}    # worker index -> the public socket its process has
    coordinator: Coordinator | None = None
    run_dir = Path(tempfile.mkdtemp(prefix="inferlb-run-"))    # 0700: the workers' metrics sockets
    try:
        admin = admin_address(settings)
        if admin is not None:
            admin_sock = bind_admin(admin)      # both ports before the files: a port in use is one line
        listener_contexts(settings, admin)
        preflight(settings)
        if is_sqlite(settings.database_url):
            # once here, not N migrations racing on one file (PostgreSQL expects `inferlb db upgrade`)
            upgrade(settings.database_url)
        redis_url = settings.admission.redis_url
        if redis_url is None and settings.cluster.mode != "off" and settings.admission.limits != "memory":
            coordinator = Coordinator()
            log.info("workers: %d on %s:%d, sharing limits and health through the local coordinator %s",
                     n, settings.host, sock.getsockname()[1], coordinator.url)
        elif redis_url is None:
            log.warning("workers: %d on %s:%d with limits per worker (INFERLB_CLUSTER_MODE=off or "
                        "INFERLB_LIMITS=memory): each worker admits up to every limit", n, settings.host,
                        sock.getsockname()[1])
        else:
            log.info("workers: %d on %s:%d, sharing limits and health through INFERLB_REDIS_URL", n,
                     settings.host, sock.getsockname()[1])
        port = int(sock.getsockname()[1])
        admin_port = int(admin_sock.getsockname()[1]) if admin_sock is not None else 0
        replica_base = settings.cluster.replica_id or f"{socket.gethostname()}-{os.getpid()}"
        admin_fd = admin_sock.fileno() if admin_sock is not None else None
        if admin_fd is not None:
            os.set_inheritable(admin_fd, True)
        url = coordinator.url if coordinator is not None else None
        forget = _forgetter(settings, url) if url is not None else None

        def spec_for(i: int, orphan_fd: int) -> WorkerSpec:
            # a fresh public socket for each process of worker i (server/workers.py: SO_REUSEPORT)
            old = public.pop(i, None)
            if old is not None:
                old.close()
            own = public[i] = bind_reuseport(settings.host, port)
            os.set_inheritable(own.fileno(), True)

            def release() -> None:      # the process is gone: its socket leaves the port at once
                if public.get(i) is own:
                    del public[i]
                    own.close()
                if forget is not None:    # and its shares and role leave the cluster (cluster/leave.py)
                    forget(replica_id(replica_base, i))

            fds = (own.fileno(), admin_fd)
            argv = worker_argv(i, (*fds, orphan_fd), watch=watch, run_dir=run_dir, count=n)
            env = worker_env(settings, i, port=port, admin_port=admin_port, replica_base=replica_base,
                             redis_url=url, local=coordinator is not None)
            return WorkerSpec(i, argv, env, tuple(f for f in fds if f is not None), on_exit=release)

        # a worker drains for up to drain_timeout_s, then its stop grace and the audit flush
        supervisor = Supervisor(n, spec_for, stop_timeout_s=settings.drain_timeout_s + 30.0)
        return asyncio.run(supervisor.run())
    finally:
        for own in public.values():
            own.close()
        sock.close()
        if admin_sock is not None:
            admin_sock.close()
        if coordinator is not None:
            coordinator.close()
        shutil.rmtree(run_dir, ignore_errors=True)
