"""Several gateway processes on one listening port: ``inferlb serve --workers N`` (``INFERLB_WORKERS``).

One ``inferlb serve`` process is one event loop on one core. With ``--workers N`` (N > 1) the
command becomes a *supervisor* (inferlb/cli/serve.py) that binds the public and admin listeners
once and starts N worker processes, each a full gateway (its own app, lifespan, drain) serving the
application on the inherited sockets. Contract of this module:

* **One port, a socket per worker (``SO_REUSEPORT``).** The supervisor reserves the port
  (:func:`reserve_port`: a port in use is one error at start-up, before any worker runs) and
  binds a socket of its own to it for each worker start (:func:`bind_reuseport`), passed to the
  worker (``pass_fds``), which listens on it once its app has started; the kernel spreads new
  connections over the listening sockets by their address hash. Chosen over one shared socket
  after measuring it: with one accept queue the worker that woke first took 54 of a client's 64
  connections opened at once, and the other 10, so one worker did most of the work. A worker
  that dies takes its socket with it (the supervisor closes its copy at once): the connections
  still waiting in that socket's queue are reset (moved to another worker where the kernel's
  ``net.ipv4.tcp_migrate_req`` is on), new ones go to the other workers, and the replacement
  listens on a fresh socket once it has started. The admin listener, little used, is one socket
  bound once and shared by every worker.
* **One gateway.** The workers are replicas of one cluster (inferlb/cluster/, docs/replicas.md):
  each gets its own ``INFERLB_CLUSTER_REPLICA_ID`` (``<id>-w<i>``) and, when no
  ``INFERLB_REDIS_URL`` is set, the address of a :class:`Coordinator` the supervisor runs: an
  in-process Redis emulation (fakeredis with Lua) on a Unix socket only this user can reach. So pool and key limits,
  the retry budget and health state (ejections, 429 cool-downs) are shared by the existing cluster
  protocol over a local transport, with no Redis server to run; with ``INFERLB_REDIS_URL`` set the
  workers use that Redis, and so join the replicas of other hosts. Node overrides, rollouts and
  tenant keys are shared through the one database, as between replicas; the learned latency
  predictor, the output-length predictor and the reward bandit through the cluster too
  (learned/share.py, learned/share_length.py, learned/share_reward.py: the elected worker trains,
  the others install its snapshots).
* **One /metrics.** The supervisor makes a run directory (``inferlb-run-*``, 0700) and passes it
  with the worker count (``--worker-run-dir``, ``--worker-count``); each worker serves its metrics
  on ``w<i>.sock`` there, and the one that takes a scrape merges its siblings'
  (server/worker_metrics.py).
* **Audit.** Each worker journals into its own directory ``<journal_dir>/w<i>``; a replacement
  worker has the same index, so it recovers the WAL its predecessor left (store/wal.py recovers
  every segment no live process holds) before it serves.
* **Supervision.** A worker that exits while the supervisor is not stopping is started again after
  a back-off (``restart_min_s`` doubling to ``restart_max_s``, back to the minimum once a worker ran
  ``stable_s``), one log line each. Its slots in the shared limits, its heartbeat and its
  elected role (if it held it) are given back at once (the supervisor's exit hook,
  inferlb/cluster/leave.py, on the local coordinator), so the workers' leases bound only a worker
  that hangs: there idle workers renew with a 30 s lease and the leader with a 60 s one
  (inferlb/cli/serve.py; an operator's ``INFERLB_CLUSTER_*`` value wins). With
  ``INFERLB_REDIS_URL`` the leases of docs/replicas.md apply unchanged. SIGTERM or SIGINT to the
  supervisor sends SIGTERM to every worker, which drains (server/lifecycle.py), and waits for all of
  them (``stop_timeout_s``, then SIGKILL); the supervisor then returns 0. SIGHUP is passed to every
  worker (each reloads its files). Workers run in their own process group, so a Ctrl-C in a terminal
  reaches the supervisor only, which stops them in order.
* **Orphans.** Each worker holds the read end of a pipe whose write end only the supervisor keeps:
  when the supervisor dies (SIGKILL included) the pipe reads end-of-file and the worker drains and
  stops (:func:`watch_supervisor`), so no worker outlives it. No polling: the loop wakes only then.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import queue
import select
import shutil
import signal
import socket
import socketserver
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Coordinator", "Supervisor", "WorkerSpec", "bind_admin", "bind_reuseport", "fds_arg", "inherit_socket",
           "next_backoff", "parse_fds", "reserve_port", "watch_supervisor"]

log = logging.getLogger("inferlb")


class Coordinator:
    """A Redis emulation (fakeredis, with Lua through ``lupa``) in threads of the supervisor: the
    workers' cluster store when no ``INFERLB_REDIS_URL`` is set. It listens on a Unix socket in a
    directory only this user may enter (``0700``; :attr:`url` is ``unix://…``), not on a loopback
    TCP port: fakeredis does not enforce a password, and any local user could reach a TCP port and
    hand itself slots or eject nodes. Its state lives as long as the supervisor; a replaced worker
    finds it as it was.

    Each client connection is served by a thread (fakeredis's request handler). fakeredis's own loop
    wakes every 10 ms to pass on what other connections push to it (pub/sub messages): 13 ms of CPU
    a second for two idle workers' connections, measured. Here the thread sleeps in ``select`` until
    its client sends a command or something is queued for it (a byte on a wake-up socket pair, sent
    by the queue itself), and at least every ``idle_s`` to notice the shutdown."""

    def __init__(self, *, idle_s: float = 5.0) -> None:
        try:
            import lupa  # noqa: F401  (the cluster's Lua scripts need it; fail here, not in a worker)
            from fakeredis._clients import _tcp_server
            from fakeredis._core import FakeServer
            from fakeredis._typing import RaiseErrorTypes
        except ImportError as exc:   # pragma: no cover - the dependency is a core one
            from inferlb.errors import ConfigError
            raise ConfigError(f"--workers needs fakeredis[lua] for its local coordinator ({exc}); install "
                              "it, or set INFERLB_REDIS_URL", source="environment", path="INFERLB_WORKERS") from exc
        ids = itertools.count(1)

        class WakingQueue(queue.Queue[Any]):
            """A connection's reply queue that wakes its thread when something is put in it."""

            def __init__(self, wake: socket.socket) -> None:
                super().__init__()
                self._wake = wake

            def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
                super().put(item, block, timeout)
                with contextlib.suppress(OSError):     # full: it is readable already
                    self._wake.send(b"\0")

        class Handler(_tcp_server.TCPFakeRequestHandler):
            def setup(self) -> None:
                # fakeredis keys its connections by the client's address, which a Unix socket's
                # clients all share (""): give each its own.
                self.client_address = ("unix", next(ids))
                super().setup()
                self._wake_r, self._wake_w = socket.socketpair()
                self._wake_r.setblocking(False)
                self._wake_w.setblocking(False)
                fake = self.current_client.get_socket()
                if fake.responses is not None:
                    fake.responses = WakingQueue(self._wake_w)

            def handle(self) -> None:
                # fakeredis's loop (fakeredis/_clients/_tcp_server.py), its 10 ms poll replaced by
                # the wake-up socket (class docstring).
                client, conn = self.current_client, self.connection
                while not self.server._shutdown_event.is_set():
                    try:
                        if client.can_read():
                            try:
                                response = client.read_response()
                            except RaiseErrorTypes as e:
                                response = e
                            self.writer.dump(response)
                            continue
                        data = self.rfile.readline()
                        if data == b"":
                            readable, _, _ = select.select([conn, self._wake_r], [], [], idle_s)
                            if self._wake_r in readable:
                                with contextlib.suppress(OSError):
                                    self._wake_r.recv(4096)
                            if conn not in readable:
                                continue
                            data = self.rfile.readline()
                            if data == b"":
                                break      # readable yet empty: the client closed
                        client.get_socket().sendall(data)
                    except ConnectionError:
                        break
                    except Exception as e:
                        self.writer.dump(e)
                        break

            def finish(self) -> None:
                try:
                    super().finish()
                finally:
                    self._wake_r.close()
                    self._wake_w.close()

        class Server(socketserver.ThreadingUnixStreamServer):
            daemon_threads = True

            def __init__(self, path: str) -> None:
                self._shutdown_event = threading.Event()
                super().__init__(path, Handler)
                self.fake_server = FakeServer(server_type="redis", version=(8, 0))
                self.clients: dict[Any, Any] = {}

            def shutdown(self) -> None:
                self._shutdown_event.set()
                super().shutdown()

        self._dir = tempfile.mkdtemp(prefix="inferlb-coord-")    # 0700: this user only
        self.path = os.path.join(self._dir, "redis.sock")
        self._server = Server(self.path)
        self.url = f"unix://{self.path}?db=0"
        # (the accept loop itself wakes twice a second, socketserver's default, to notice shutdown())
        self._thread = threading.Thread(target=self._server.serve_forever, name="inferlb-coordinator", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving, close the listener and remove its socket and directory."""
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._dir, ignore_errors=True)


@dataclass
class WorkerSpec:
    """How to start worker ``index``: its command line and environment (:class:`Supervisor` adds
    nothing but the file descriptors it passes, named in ``argv`` by the caller)."""

    index: int
    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...] = ()
    on_exit: Callable[[], None] | None = None    # called once the process has exited (its socket closed)


@dataclass
class _Slot:
    spec: WorkerSpec
    proc: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    backoff_s: float = 0.0
    restarts: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class Supervisor:
    """Runs the workers until stopped (module docstring). ``spec_for(i, orphan_fd)`` is worker
    ``i``'s :class:`WorkerSpec` (asked before each start of it, replacements included), given the
    read end of its orphan pipe to pass on; ``clock`` is
    the loop's monotonic time unless a test injects one."""

    def __init__(self, n: int, spec_for: Callable[[int, int], WorkerSpec], *, stop_timeout_s: float,
                 restart_min_s: float = 0.5, restart_max_s: float = 10.0, stable_s: float = 30.0,
                 clock: Callable[[], float] | None = None) -> None:
        if n < 1:
            raise ValueError("n must be at least 1")
        self.n = n
        self._spec_for = spec_for
        self.stop_timeout_s = stop_timeout_s
        self.restart_min_s, self.restart_max_s, self.stable_s = restart_min_s, restart_max_s, stable_s
        self._clock = clock
        self._stopping = asyncio.Event()
        self._slots: list[_Slot] = []
        # The orphan pipe: workers get the read end; only this process holds the write end.
        self._orphan_r, self._orphan_w = os.pipe()
        os.set_inheritable(self._orphan_r, True)

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    @property
    def pids(self) -> list[int | None]:
        """Each worker's current pid (None while it is being replaced)."""
        return [s.proc.pid if s.proc is not None and s.proc.returncode is None else None for s in self._slots]

    @property
    def restarts(self) -> list[int]:
        """How many times each worker was replaced."""
        return [s.restarts for s in self._slots]

    def stop(self) -> None:
        """Begin the stop: every worker is sent SIGTERM (safe from a signal handler on the loop)."""
        if self._stopping.is_set():
            return
        log.info("workers: stopping %d worker(s) (SIGTERM, they drain)", self.n)
        self._stopping.set()
        self._signal_all(signal.SIGTERM)

    def _signal_all(self, sig: int) -> None:
        for slot in self._slots:
            if slot.proc is not None and slot.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(sig)

    async def _start(self, slot: _Slot) -> None:
        spec = slot.spec = self._spec_for(slot.spec.index, self._orphan_r)   # asked again for each process
        slot.proc = await asyncio.create_subprocess_exec(
            *spec.argv, env=spec.env, pass_fds=(*spec.pass_fds, self._orphan_r), process_group=0)
        slot.started_at = self._now()

    async def _run_slot(self, slot: _Slot) -> None:
        """Keep worker ``slot`` running until the stop; restart it with back-off when it exits."""
        while True:
            assert slot.proc is not None
            code = await slot.proc.wait()
            if slot.spec.on_exit is not None:
                slot.spec.on_exit()
            if self._stopping.is_set():
                return
            lived = self._now() - slot.started_at
            slot.backoff_s = next_backoff(slot.backoff_s, lived, low=self.restart_min_s, high=self.restart_max_s,
                                          stable_s=self.stable_s)
            slot.restarts += 1
            how = f"signal {-code}" if code < 0 else f"status {code}"
            log.warning("workers: worker w%d (pid %d) exited with %s after %.1f s; replacing it in %.1f s",
                        slot.spec.index, slot.proc.pid, how, lived, slot.backoff_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), slot.backoff_s)
            if self._stopping.is_set():
                return
            try:
                await self._start(slot)
            except Exception as exc:    # a socket or a process that could not be made: try again later
                log.error("workers: worker w%d could not be started again: %s", slot.spec.index, exc)
                slot.started_at = self._now()
                continue
            log.info("workers: worker w%d replaced (pid %d)", slot.spec.index, slot.proc.pid)

    async def run(self, *, handle_signals: bool = True) -> int:
        """Start the workers, supervise them, and after :meth:`stop` (SIGTERM/SIGINT when
        ``handle_signals``) wait for them; returns 0 (1 when one had to be killed past the timeout)."""
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
            loop.add_signal_handler(signal.SIGHUP, lambda: self._signal_all(signal.SIGHUP))
        try:
            self._slots = [_Slot(self._spec_for(i, self._orphan_r)) for i in range(self.n)]
            for slot in self._slots:
                await self._start(slot)
            log.info("workers: %d started (pids %s)", self.n, ", ".join(str(p) for p in self.pids))
            for slot in self._slots:
                slot.task = asyncio.ensure_future(self._run_slot(slot))
            await self._stopping.wait()
            return await self._wait_stopped()
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(sig)
            for slot in self._slots:
                if slot.task is not None:
                    slot.task.cancel()
                # still running only when the supervisor itself failed or was cancelled: no orphans
                if slot.proc is not None and slot.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        slot.proc.kill()
            os.close(self._orphan_r)
            os.close(self._orphan_w)

    async def _wait_stopped(self) -> int:
        procs = [s.proc for s in self._slots if s.proc is not None]
        self._signal_all(signal.SIGTERM)   # a worker started while the stop began
        waits = [asyncio.ensure_future(p.wait()) for p in procs]
        _, pending = await asyncio.wait(waits, timeout=self.stop_timeout_s) if waits else (set(), set())
        status = 0
        for p in procs:
            if p.returncode is None:
                log.error("workers: worker pid %d did not stop within %.0f s: killed", p.pid, self.stop_timeout_s)
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
                status = 1
        for w in pending:
            w.cancel()
        log.info("workers: all stopped")
        return status


def next_backoff(previous: float, lived_s: float, *, low: float, high: float, stable_s: float) -> float:
    """The wait before a worker that exited after ``lived_s`` seconds is started again: ``low``
    for its first exit or after it ran ``stable_s``, else twice the ``previous`` wait, at most ``high``."""
    if previous <= 0 or lived_s >= stable_s:
        return low
    return min(high, previous * 2)


def watch_supervisor(fd: int, stop: Callable[[], Any]) -> Callable[[], None]:
    """In a worker: call ``stop`` once when the supervisor's orphan pipe ``fd`` reads end-of-file
    (the supervisor is gone); returns the function that stops watching. Must run on the loop."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)

    def readable() -> None:
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            log.warning("workers: the supervisor is gone; stopping")
            stop()

    loop.add_reader(fd, readable)

    def unwatch() -> None:
        with contextlib.suppress(Exception):
            loop.remove_reader(fd)
    return unwatch


def inherit_socket(fd: int) -> socket.socket:
    """The listening socket the supervisor passed as ``fd`` (family and type read from it)."""
    return socket.socket(fileno=fd)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def reserve_port(host: str, port: int) -> socket.socket:
    """The public port, reserved for the workers: a socket bound to ``host:port`` with
    ``SO_REUSEPORT`` that never listens (the kernel hands connections only to listening sockets),
    so the workers' sockets can join it. It first binds a socket without ``SO_REUSEPORT`` there,
    which fails whoever listens on the port (another gateway, with or without it): a
    :class:`~inferlb.errors.ConfigError` at once, as for one process. Port 0: a free port."""
    from inferlb.errors import ConfigError

    probe = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        # as bind_public: connections of a gateway just stopped, in TIME_WAIT, do not hold the port
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        port = int(probe.getsockname()[1])
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", source="environment",
                          path="INFERLB_HOST/INFERLB_PORT") from exc
    finally:
        probe.close()
    return bind_reuseport(host, port)


def bind_reuseport(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` (and ``SO_REUSEADDR``, as uvicorn's),
    not listening: one worker's public socket, or the supervisor's reservation. OSError when it
    cannot be bound."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def bind_admin(address: tuple[str, int]) -> socket.socket:
    """The admin listener's socket, bound once by the supervisor for every worker (a port in use is
    a :class:`~inferlb.errors.ConfigError` at once, as for the public port)."""
    from inferlb.server.listeners import bind_tcp

    return bind_tcp(address[0], address[1], "INFERLB_ADMIN_HOST/INFERLB_ADMIN_PORT")


def fds_arg(fds: Sequence[int | None]) -> str:
    """The ``--worker-fds`` value: the descriptors in order, ``-`` for none."""
    return ",".join("-" if f is None else str(f) for f in fds)


def parse_fds(value: str) -> list[int | None]:
    """Inverse of :func:`fds_arg`."""
    return [None if part == "-" else int(part) for part in value.split(",")]
