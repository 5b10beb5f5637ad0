"""``inferlb serve --workers 2`` (inferlb/server/workers.py): two real worker processes behind one
port behave as one gateway, with no Redis server (the supervisor's local coordinator).

Checked in one start-up of the supervisor (one start keeps the test short):

1. global limits: waves of concurrent requests on fresh connections never put more than the
   pool's limit (3) in flight at its node, measured at the node, while the waves reach both
   workers (each worker's write-ahead log in its own journal directory shows requests started);
   a tenant key's ``max_parallel`` (2) and RPM (6) hold in total;
   shared health: a node ejected by the worker that served its failures is ejected on the other
   (``/admin/fleet``, answered by either worker, names the replica it came from);
2. a worker SIGKILLed with a stream in flight is replaced (a new pid under the supervisor),
   requests keep succeeding meanwhile, the supervisor takes it out of the cluster (the survivor
   is told ``left``), its slots come back (the pool's limit runs at once again),
   and its write-ahead log is recovered by the replacement: the cut stream's audit row
   (``unknown_outcome``, the ``x-request-id`` the client saw) reaches the database;
3. SIGTERM to the supervisor drains: a stream in flight completes and the supervisor exits 0.

Then the supervisor alone, on stand-in worker processes: replacement and stop, a worker that will
not stop, the orphan pipe, the restart back-off, and the coordinator's reach.

Every wait is a poll for a condition with a bound (a hang guard), never a sleep for time to pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferlb.admission.store import create_key
from inferlb.server.workers import Coordinator, Supervisor, WorkerSpec, next_backoff, watch_supervisor
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec, NodeSpec
from inferlb.store.db import make_engine, upgrade
from tests.support import ROOT, free_port

ADMIN = "admin-key-for-the-workers-test"
POOL_LIMIT = 3
LEASE_S = 1.5
GUARD_S = 60.0      # hang guard for the start-up only


def _fleet_file(tmp: Path, urls: dict[str, str]) -> Path:
    fleet = {
        "models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8},
                   {"name": "e", "max_output_tokens": 1024, "default_max_tokens": 4}],
        "nodes": [{"name": "p0", "url": urls["p0"], "models": ["m"], "max_concurrency": POOL_LIMIT},
                  {"name": "e0", "url": urls["e0"], "models": ["e"]},
                  {"name": "e1", "url": urls["e1"], "models": ["e"]}],
        "routing": {"profile": "round-robin", "seed": 1},
        "timeouts": {"connect_s": 2.0, "first_token_s": 10.0, "idle_s": 10.0, "total_s": 60.0},
        # health rounds (30 s) and the ejection (60 s) far longer than the test: an ejection seen by
        # the worker that never served e1 came through the coordinator
        "health": {"interval_s": 30, "outlier": {"consecutive_failures": 3, "base_ejection_s": 60}},
        "admission": {"classes": [{"name": "standard", "max_queue_wait_s": 10.0}], "default_class": "standard",
                      "queue": {"wait_factor": 50}},
    }
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    return path


def _children(pid: int) -> set[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    out: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            # the command name may hold spaces: fields after its closing parenthesis
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[1]) == pid:
                out.add(int(entry))
    return out


async def _until(what: str, pred: Callable[[], Awaitable[bool]], deadline_s: float) -> None:
    """Poll ``pred`` until true; fails past ``deadline_s`` (a hang guard, not a timing assertion)."""
    end = time.monotonic() + deadline_s
    while not await pred():
        assert time.monotonic() < end, f"{what}: not within {deadline_s}s"
        await asyncio.sleep(0.05)


def _started_in(journal: Path) -> dict[int, int]:
    """Per worker index: how many requests its write-ahead log saw start (its journal ``w<i>``)."""
    counts: dict[int, int] = {}
    for i in (0, 1):
        n = 0
        for seg in (journal / f"w{i}").glob("wal-*.log"):
            with contextlib.suppress(OSError):
                n += sum(1 for line in seg.read_text().splitlines() if line.startswith('{"k":"s"'))
        counts[i] = n
    return counts


def _wal_with_start(journal: Path, request_id: str) -> tuple[int, int] | None:
    """(worker index, pid) of the worker whose write-ahead log holds ``request_id``'s start entry."""
    for i in (0, 1):
        for seg in (journal / f"w{i}").glob("wal-*.log"):
            with contextlib.suppress(OSError):
                if request_id in seg.read_text():
                    return i, int(seg.name.split("-")[1])
    return None


class Gateway:
    def __init__(self, proc: asyncio.subprocess.Process, port: int, admin_port: int, log: Path,
                 keys: dict[str, str]) -> None:
        self.proc, self.log, self.keys = proc, log, keys
        self.base = f"http://127.0.0.1:{port}"
        self.admin = f"http://127.0.0.1:{admin_port}"

    def auth(self, key: str = "any") -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[key]}"}

    async def chat(self, max_tokens: int = 8, key: str = "any") -> int:
        # a client (so a connection) per request: the kernel hands each to either worker
        async with httpx.AsyncClient(timeout=30, headers=self.auth(key)) as c:
            r = await c.post(self.base + "/v1/chat/completions",
                             json={"model": "m", "max_tokens": max_tokens,
                                   "messages": [{"role": "user", "content": "hi"}]})
            return r.status_code

    async def fleet(self) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=5, headers={"authorization": f"Bearer {ADMIN}"}) as c:
            r = await c.get(self.admin + "/admin/fleet")
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body


@contextlib.asynccontextmanager
async def supervisor(tmp: Path, fleet: Path) -> AsyncIterator[Gateway]:
    port, admin_port = free_port(), free_port()
    db = f"sqlite:///{tmp / 'audit.db'}"
    await asyncio.to_thread(upgrade, db)
    engine = make_engine(db)
    try:
        limits: dict[str, dict[str, Any]] = {"any": {}, "par": {"max_parallel": 2}, "rpm": {"rpm": 6}}
        keys = {name: create_key(engine, tenant="t", now=time.time(), name=name, **lim)[1]
                for name, lim in limits.items()}
    finally:
        engine.dispose()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "INFERLB_DATABASE_URL": db, "INFERLB_JOURNAL_DIR": str(tmp / "journal"),
           "INFERLB_AUTH": "on", "INFERLB_ADMIN_KEY": ADMIN,
           "INFERLB_ADMIN_PORT": str(admin_port), "INFERLB_CLUSTER_LEASE_S": str(LEASE_S),
           "INFERLB_CLUSTER_LEADER_LEASE_S": str(LEASE_S), "INFERLB_LOG_LEVEL": "WARNING"}
    for var in ("INFERLB_REDIS_URL", "INFERLB_WORKERS", "INFERLB_CLUSTER_MODE", "INFERLB_CLUSTER_REPLICA_ID"):
        env.pop(var, None)
    log = tmp / "gateway.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "inferlb.cli.main", "serve", "--config", str(fleet), "--port", str(port),
            "--workers", "2", cwd=tmp, env=env, stdout=out, stderr=asyncio.subprocess.STDOUT)
    gw = Gateway(proc, port, admin_port, log, keys)
    try:
        async def two_replicas() -> bool:
            assert proc.returncode is None, log.read_text()
            with contextlib.suppress(httpx.TransportError, AssertionError):
                return bool((await gw.fleet())["cluster"]["replicas"] == 2)
            return False

        await _until("both workers in the cluster:\n" + log.read_text(), two_replicas, GUARD_S)
        yield gw
    finally:
        if proc.returncode is None:     # a failed check: stop it as an operator would (its coordinator
            proc.send_signal(signal.SIGTERM)    # directory goes with it), killed if it hangs
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for pid in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_two_workers_behave_as_one_gateway(tmp_path: Path) -> None:
    specs = [NodeSpec(name="p0", models=["m"], base_ttft_s=0.05, tpot_s=0.02, max_concurrency=64),
             NodeSpec(name="e0", models=["e"], base_ttft_s=0.002, tpot_s=0.001),
             NodeSpec(name="e1", models=["e"], base_ttft_s=0.002, tpot_s=0.001)]
    async with SimFleet(specs) as sim:
        fleet = _fleet_file(tmp_path, {n: node.url for n, node in sim.nodes.items()})
        async with supervisor(tmp_path, fleet) as gw:
            workers = _children(gw.proc.pid)
            assert len(workers) == 2, workers
            await _check_global_limit(gw, sim, tmp_path / "journal")
            await _check_shared_ejection(gw, sim)
            await _check_kill(gw, sim, tmp_path)
            await _check_drain(gw, sim)


async def _check_global_limit(gw: Gateway, sim: SimFleet, journal: Path) -> None:
    p0 = sim.nodes["p0"]
    # Waves until both workers took some (which the kernel decides); each wave must hold the limit.
    for _ in range(6):
        before = _started_in(journal)
        p0.reset()
        statuses = await asyncio.gather(*(gw.chat() for _ in range(4 * POOL_LIMIT)))
        assert p0.stats.max_live <= POOL_LIMIT, p0.stats.max_live    # per worker it would be 3 each: 6
        assert statuses.count(200) >= POOL_LIMIT and set(statuses) <= {200, 503}, statuses
        after = _started_in(journal)
        if all(after[i] > before[i] for i in (0, 1)):
            break
    else:
        raise AssertionError(f"the waves never reached both workers: {_started_in(journal)}")
    # A key's max_parallel (2) holds in total, whichever worker takes each connection.
    p0.reset()
    statuses = await asyncio.gather(*(gw.chat(key="par") for _ in range(8)))
    assert p0.stats.max_live <= 2, p0.stats.max_live
    # at least one: a burst that lands on one worker may find only its share (1) there before a
    # sync moves the other's to it, and max_parallel answers 429 at once (docs/replicas.md)
    assert statuses.count(200) >= 1 and set(statuses) <= {200, 429}, statuses
    # A key's RPM (6) acts on every worker: 12 requests one after the other, each on a fresh
    # connection. Not "at most 6": between two syncs a worker decides on its own view of the shared
    # bucket, so the total may pass the limit by what a worker admits while its view is stale
    # (admission/buckets.py, docs/replicas.md), and how stale depends on the machine's load. The
    # exact sharing of one bucket by two limiters is tested on real Redis in
    # tests/admission/test_redis_limits.py.
    statuses = [await gw.chat(key="rpm") for _ in range(12)]
    assert 1 <= statuses.count(200) < 12 and set(statuses) == {200, 429}, statuses


async def _check_shared_ejection(gw: Gateway, sim: SimFleet) -> None:
    await sim.nodes["e1"].set_faults(FaultSpec(status=503))
    views: dict[str, dict[str, Any]] = {}     # replica id -> its view of e1

    async def look() -> None:
        body = await gw.fleet()               # a fresh connection: either worker answers
        views[body["cluster"]["replica"]] = {n["name"]: n for n in body["nodes"]}["e1"]

    # One keep-alive connection, so one worker serves every request (and sees e1 fail); retried on
    # e0, the client never sees e1's 503s.
    async with httpx.AsyncClient(timeout=10, headers=gw.auth()) as one:
        for _ in range(30):
            r = await one.post(gw.base + "/v1/chat/completions",
                               json={"model": "e", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
            await look()
            if any(v["state"] == "ejected" for v in views.values()):
                break
        else:
            raise AssertionError(f"e1 never ejected: {views}")

    async def both_see_it() -> bool:
        await look()
        return len(views) == 2 and all(v["state"] == "ejected" for v in views.values())

    await _until("e1 ejected on both workers", both_see_it, 20.0)
    ids = set(views)
    assert any(v["evidence"].get("shared_from") in ids - {rid} for rid, v in views.items()), views
    assert all(v["ejections"] == 1 for v in views.values()), views      # one shared ejection, not two
    await sim.nodes["e1"].set_faults(FaultSpec())


async def _stream_until_first_chunk(gw: Gateway, client: httpx.AsyncClient, max_tokens: int
                                    ) -> tuple[str, asyncio.Task[list[str]]]:
    """Start a stream; returns its request id (once the first chunk came) and the task reading the rest."""
    first: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def read() -> list[str]:
        lines: list[str] = []
        async with client.stream("POST", gw.base + "/v1/chat/completions",
                                 json={"model": "m", "max_tokens": max_tokens, "stream": True,
                                       "messages": [{"role": "user", "content": "hi"}]}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data:") and not first.done():
                    first.set_result(r.headers["x-request-id"])
                lines.append(line)
        return lines

    task = asyncio.ensure_future(read())
    waits: set[asyncio.Future[Any]] = {task, first}
    done, _ = await asyncio.wait(waits, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    assert first in done, task.exception() if task in done else "no first chunk"
    return first.result(), task


async def _check_kill(gw: Gateway, sim: SimFleet, tmp: Path) -> None:
    journal = tmp / "journal"
    async with httpx.AsyncClient(timeout=30, headers=gw.auth()) as client:
        rid, stream = await _stream_until_first_chunk(gw, client, max_tokens=400)   # 8 s long
        located = _wal_with_start(journal, rid)
        assert located is not None, rid
        index, victim = located
        assert victim in _children(gw.proc.pid)
        os.kill(victim, signal.SIGKILL)
        with contextlib.suppress(httpx.HTTPError):
            await stream      # cut by the kill

    async def replaced() -> bool:
        kids = _children(gw.proc.pid)
        return victim not in kids and len(kids) == 2

    await _until("the killed worker replaced", replaced, 30.0)

    # The supervisor saw it die and took it out of the cluster at once (cluster/leave.py): the
    # survivor got the "left" message (its /admin/fleet says so; either worker may answer).
    async def survivor_told() -> bool:
        return int((await gw.fleet())["cluster"].get("left_received", 0)) >= 1

    await _until("the survivor told the killed worker left", survivor_told, 30.0)
    # Requests keep succeeding, whichever worker (survivor or replacement) takes them.
    statuses = [await gw.chat() for _ in range(6)]
    assert statuses == [200] * 6, statuses

    # The replacement (same index, same journal directory) recovered the cut stream's start entry:
    # its row, unknown_outcome, is in the database.
    def row_status() -> str | None:
        with contextlib.closing(sqlite3.connect(tmp / "audit.db")) as db:
            row = db.execute("SELECT status FROM requests WHERE request_id = ?", (rid,)).fetchone()
        return None if row is None else str(row[0])

    async def recovered() -> bool:
        return await asyncio.to_thread(row_status) is not None

    await _until(f"worker w{index}'s WAL recovered", recovered, 30.0)
    assert row_status() == "unknown_outcome"

    # Its slots came back (removed by the supervisor): the pool's limit runs at once again.
    p0 = sim.nodes["p0"]

    async def pool_whole() -> bool:
        p0.reset()
        statuses = await asyncio.gather(*(gw.chat(max_tokens=40) for _ in range(POOL_LIMIT)))
        return statuses == [200] * POOL_LIMIT and p0.stats.max_live == POOL_LIMIT

    await _until("the dead worker's slots returned", pool_whole, LEASE_S + 30.0)


async def _check_drain(gw: Gateway, sim: SimFleet) -> None:
    async with httpx.AsyncClient(timeout=30, headers=gw.auth()) as client:
        _, stream = await _stream_until_first_chunk(gw, client, max_tokens=60)     # about 1.2 s
        gw.proc.send_signal(signal.SIGTERM)
        lines = await stream
    assert lines[-1] == "data: [DONE]" or "data: [DONE]" in lines, lines[-3:]
    events = [json.loads(line[5:]) for line in lines if line.startswith("data: {")]
    assert not any("error" in e for e in events), events[-1]
    assert await asyncio.wait_for(gw.proc.wait(), 60) == 0, gw.log.read_text()


# -- the supervisor on stand-in workers (no gateway: quick) -------------------------------------------

# A stand-in worker: marks itself ready (a file named on its command line) and waits for SIGTERM.
STUB = ("import pathlib, signal, sys\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
        "pathlib.Path(sys.argv[1]).touch()\n"
        "signal.sigwait({signal.SIGTERM})\n")
# One that ignores SIGTERM (a worker stuck in its drain).
STUCK = ("import pathlib, signal, sys\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "pathlib.Path(sys.argv[1]).touch()\n"
         "signal.pause()\n")


async def _until_true(what: str, pred: Callable[[], bool], deadline_s: float = 30.0) -> None:
    async def check() -> bool:
        return pred()
    await _until(what, check, deadline_s)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def test_the_supervisor_replaces_a_killed_worker_and_stops_them_all(tmp_path: Path) -> None:
    def spec(i: int, _orphan_fd: int) -> WorkerSpec:
        return WorkerSpec(i, [sys.executable, "-c", STUB, str(tmp_path / f"ready-{i}-{time.monotonic_ns()}")],
                          dict(os.environ))

    sup = Supervisor(2, spec, stop_timeout_s=30.0, restart_min_s=0.0)
    run = asyncio.ensure_future(sup.run(handle_signals=False))
    await _until_true("both workers ready", lambda: len(list(tmp_path.glob("ready-*"))) == 2)
    first = sup.pids[0]
    assert first is not None and all(sup.pids)
    os.kill(first, signal.SIGKILL)
    await _until_true("worker 0 replaced", lambda: sup.pids[0] not in (None, first) and sup.restarts == [1, 0])
    await _until_true("the replacement ready", lambda: len(list(tmp_path.glob("ready-0-*"))) == 2)
    pids = [p for p in sup.pids if p is not None]
    sup.stop()
    assert await asyncio.wait_for(run, 30) == 0
    assert not any(_alive(p) for p in pids)


async def test_a_worker_that_does_not_stop_is_killed_and_the_status_says_so(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    sup = Supervisor(1, lambda i, _fd: WorkerSpec(i, [sys.executable, "-c", STUCK, str(ready)], dict(os.environ)),
                     stop_timeout_s=0.0)
    run = asyncio.ensure_future(sup.run(handle_signals=False))
    await _until_true("the worker ready", ready.exists)
    pid = sup.pids[0]
    assert pid is not None
    sup.stop()
    assert await asyncio.wait_for(run, 30) == 1
    assert not _alive(pid)


# One that records a SIGHUP (a reload) and exits on SIGTERM.
HUP = ("import pathlib, signal, sys\n"
       "signal.signal(signal.SIGHUP, lambda *_: pathlib.Path(sys.argv[2]).touch())\n"
       "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
       "pathlib.Path(sys.argv[1]).touch()\n"
       "while True:\n"
       "    signal.pause()\n")


async def test_the_supervisors_signals_sighup_to_every_worker_and_sigterm_stops(tmp_path: Path) -> None:
    def spec(i: int, _fd: int) -> WorkerSpec:
        return WorkerSpec(i, [sys.executable, "-c", HUP, str(tmp_path / f"ready-{i}"), str(tmp_path / f"hup-{i}")],
                          dict(os.environ))

    sup = Supervisor(2, spec, stop_timeout_s=30.0)
    run = asyncio.ensure_future(sup.run())          # with its signal handlers, as `serve` runs it
    await _until_true("both workers ready", lambda: len(list(tmp_path.glob("ready-*"))) == 2)
    os.kill(os.getpid(), signal.SIGHUP)
    await _until_true("SIGHUP passed to both", lambda: len(list(tmp_path.glob("hup-*"))) == 2)
    assert not run.done()
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(run, 30) == 0
    assert sup.restarts == [0, 0]


async def test_a_worker_stops_when_its_supervisor_is_gone() -> None:
    r, w = os.pipe()
    stopped = asyncio.Event()
    unwatch = watch_supervisor(r, stopped.set)
    try:
        assert not stopped.is_set()
        os.close(w)                     # the supervisor's end: closed when it dies, SIGKILL included
        await asyncio.wait_for(stopped.wait(), 10)
    finally:
        unwatch()
        os.close(r)


def test_restart_back_off_doubles_to_its_ceiling_and_resets_after_a_stable_run() -> None:
    waits: list[float] = []
    prev = 0.0
    for _ in range(7):
        prev = next_backoff(prev, 1.0, low=0.5, high=10.0, stable_s=30.0)
        waits.append(prev)
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert next_backoff(10.0, 30.0, low=0.5, high=10.0, stable_s=30.0) == 0.5


async def test_the_coordinator_is_reachable_by_this_user_only_and_cleans_up() -> None:
    import redis.asyncio as aioredis

    coord = Coordinator(idle_s=3600.0)     # no poll in the test: only a wake-up delivers a message
    try:
        assert coord.url.startswith("unix://")
        assert os.stat(os.path.dirname(coord.path)).st_mode & 0o077 == 0
        client = aioredis.from_url(coord.url, socket_timeout=5)
        try:
            assert await client.ping()
            script = client.register_script("redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000) "
                                            "return redis.call('GET', KEYS[1])")
            assert await script(keys=["k"], args=["v"]) == b"v"     # Lua (the cluster's scripts need it)
            # pub/sub (the cluster's health fast path): a message reaches a subscriber that is idle
            # in its read, woken by the publish, not by a poll
            listener = aioredis.from_url(coord.url)
            ps = listener.pubsub()
            try:
                await ps.subscribe("ch")
                # the confirmation first: SUBSCRIBE is sent without waiting for it, and a publish
                # before the server has it reaches nobody
                confirmed = await ps.get_message(timeout=10)
                assert confirmed is not None and confirmed["type"] == "subscribe", confirmed
                assert await client.publish("ch", "hello") == 1
                msg = await ps.get_message(timeout=10)
                assert msg is not None and msg["data"] == b"hello", msg
            finally:
                await ps.aclose()  # type: ignore[no-untyped-call]
                await listener.aclose()
        finally:
            await client.aclose()
    finally:
        coord.close()
    assert not os.path.exists(os.path.dirname(coord.path))


def test_the_port_is_reserved_past_time_wait_but_not_past_a_listener() -> None:
    from inferlb.errors import ConfigError
    from inferlb.server.workers import reserve_port

    # a connection the server side closed first: its port sits in TIME_WAIT, as after a restart
    # (the listener set SO_REUSEADDR, as a gateway's does)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()
    listener.close()
    client.close()
    reserved = reserve_port("127.0.0.1", port)
    try:
        assert reserved.getsockname()[1] == port
    finally:
        reserved.close()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ConfigError, match="cannot listen"):
            reserve_port("127.0.0.1", busy.getsockname()[1])
