"""``inferlb bench replicas``: throughput and gateway CPU per request with 1, 2 and 3 replicas on
one Redis, and what the cluster's admission costs per request.

::

    inferlb bench replicas [--n 1500] [--concurrency 16] [--max-tokens 16] [--replicas 1,2,3]
                           [--fake-server PATH] [--redis-url URL] [--max-seconds 20] [--json OUT]

Part 1, in-process (no HTTP): CPU µs per admission decision + release of the plain controller (one
replica) and of the cluster's (:class:`~inferlb.cluster.admission.SharedAdmission`, shares
read from memory), and, for comparison, a per-request Redis lease (one Lua ``EVALSHA`` to take a
slot and one to give it back, measured against the Redis given): the mechanism the cluster did
*not* choose.

Part 2, end to end: three fake OpenAI nodes (the peer bench's ``fake_openai_server.py`` when
``--fake-server`` names it, else ``inferlb sim`` demo nodes), then for each run ``inferlb serve``
replicas (each its own subprocess, SQLite audit, free port): ``single`` is one replica without
Redis (the single-process code path), ``cluster-N`` is N replicas sharing Redis under a fresh
key prefix. The load generator (closed loop, in its own process, :mod:`.cell`) spreads
``--n`` requests round-robin over the replicas; the table gives req/s, e2e p50/p99, the gateways'
CPU ms per request (``utime + stime`` of every replica's process tree over the measured phase),
and the cluster's Redis syncs per request (from ``/admin/fleet``).

Bounded: every phase stops after ``--max-seconds``; every child is stopped by PID in ``finally``;
Redis keys under the run's prefix are deleted at the end. Run it alone (not next to tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from inferlb.bench.cell import LoadSpec
from inferlb.bench.loadgen.procs import Child, free_port, wait_http, workdir
from inferlb.bench.overhead import _child_env, repo_root

__all__ = ["ReplicaBenchConfig", "main", "measure_admission", "run"]

PY = sys.executable


@dataclass
class ReplicaBenchConfig:
    n: int = 1500
    concurrency: int = 16
    max_tokens: int = 16
    replicas: list[int] = field(default_factory=lambda: [1, 2, 3])
    fake_server: Path | None = None
    redis_url: str = "redis://127.0.0.1:6379/0"
    max_seconds: float = 20.0
    micro_n: int = 20_000
    workdir: Path | None = None


# ---------------------------------------------------------------------------------------------- part 1

_LEASE_TAKE = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(ARGV[1]) then redis.call('DECR', KEYS[1]) return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""


def measure_admission(n: int, redis_url: str | None) -> dict[str, Any]:
    """µs per admit + release, plain vs shared controller; per-request Redis lease for comparison."""
    from inferlb.admission.controller import AdmissionController
    from inferlb.cluster.admission import SharedAdmission
    from inferlb.config.settings import fleet_from_mapping
    from inferlb.fleet.state import Fleet
    from inferlb.store.records import RequestRecord
    from inferlb.types import SystemClock

    cfg = fleet_from_mapping({"models": [{"name": "m"}],
                              "nodes": [{"name": f"n{i}", "url": f"http://127.0.0.1:{9 + i}", "models": ["m"]}
                                        for i in range(3)]})
    ev = {"priority": "standard", "model": "m", "prompt_tokens_est": 10, "output_budget": 16}
    out: dict[str, Any] = {"n": n}
    for name, cls in (("plain", AdmissionController), ("shared", SharedAdmission)):
        clock = SystemClock()
        ctl = cls(cfg.admission, Fleet(cfg, clock), clock, max_inflight=10_000)
        if isinstance(ctl, SharedAdmission):
            ctl.shares.degraded = False
            ctl.shares.grants["pool:m"] = 64
        recs = [RequestRecord(request_id=f"r{i}", received_at=0.0, endpoint="chat", model_requested="m",
                              status="ok") for i in range(n)]
        scopes = [SimpleNamespace(record=r, deadline_at=1e12, model="m", models_tried=[]) for r in recs]
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time()
            for s, r in zip(scopes, recs, strict=True):
                ctl.admit(s, ev, None)
                ctl.release(r)
            best = min(best, time.process_time() - t0)
        out[f"{name}_us"] = round(best / n * 1e6, 2)
    if redis_url:
        out.update(asyncio.run(_redis_lease(redis_url, min(n, 3000))))
        out.update(asyncio.run(_sync_cost(redis_url, cfg, 500)))
    return out


async def _sync_cost(url: str, cfg: Any, n: int) -> dict[str, Any]:
    """One replica's sync (one EVALSHA: heartbeat, pool share, retry claim, health version): µs each."""
    from inferlb.cluster.admission import SharedAdmission
    from inferlb.cluster.service import ClusterService
    from inferlb.config.cluster import ClusterSettings
    from inferlb.fleet.state import Fleet
    from inferlb.types import SystemClock

    clock = SystemClock()
    fleet = Fleet(cfg, clock)
    prefix = f"inferlb-bench:{secrets.token_hex(4)}:"
    svc = ClusterService(ClusterSettings(replica_id="bench"), redis_url=url, prefix=prefix,
                         admission=SharedAdmission(cfg.admission, fleet, clock, max_inflight=100), fleet=fleet,
                         clock=clock, config_hash="bench")
    svc.connect()
    try:
        await svc.sync_once()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            await svc.sync_once()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        await svc.stop()
        await _drop_prefix(url, prefix)
    return {"sync_round_trips": 1, "sync_wall_us": round(wall / n * 1e6, 1),
            "sync_client_cpu_us": round(cpu / n * 1e6, 1)}


async def _redis_lease(url: str, n: int) -> dict[str, Any]:
    import redis.asyncio as aioredis

    client = aioredis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    key = f"inferlb-bench:{secrets.token_hex(4)}:lease"
    try:
        take = client.register_script(_LEASE_TAKE)
        await take(keys=[key], args=[1_000_000, 5000])     # load the script
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            await take(keys=[key], args=[1_000_000, 5000])
            await client.decr(key)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"redis_lease_round_trips": 2, "redis_lease_wall_us": round(wall / n * 1e6, 1),
                "redis_lease_client_cpu_us": round(cpu / n * 1e6, 1)}
    finally:
        await client.delete(key)
        await client.aclose()


# ---------------------------------------------------------------------------------------------- part 2

def _admin(url: str, key: str) -> dict[str, Any]:
    """``GET /admin/fleet`` on a replica's public listener, with the admin key it was started with."""
    req = urllib.request.Request(url + "/admin/fleet", headers={"authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        body: dict[str, Any] = json.loads(r.read())
    return body


class _Run:
    def __init__(self, cfg: ReplicaBenchConfig, wd: Path) -> None:
        self.cfg, self.dir = cfg, wd
        self.children: list[Child] = []
        # the replicas' admin key (no admin listener: INFERLB_ADMIN_PORT=0, so consecutive free ports never collide)
        self.admin_key = secrets.token_urlsafe(32)
        self.node_urls: list[str] = []
        self.model = "fake-chat"
        self.nodes = ""

    def spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> Child:
        c = Child(name, cmd, self.dir / f"{name}.log", env=env or _child_env(), cwd=self.dir,
                  stop_signal=signal.SIGTERM)
        self.children.append(c)
        return c

    def close(self) -> None:
        for c in reversed(self.children):
            c.stop()
        self.children.clear()

    def start_nodes(self) -> None:
        ports = [free_port() for _ in range(3)]
        self.node_urls = [f"http://127.0.0.1:{p}" for p in ports]
        fake = self.cfg.fake_server
        if fake is not None and fake.is_file():
            self.nodes = f"{fake.name} (20 ms TTFT + 2 ms/token)"
            kids = [self.spawn(f"node{i}", [PY, str(fake), "--host", "127.0.0.1", "--port", str(p),
                                            "--ttft-ms", "20", "--tpot-ms", "2", "--id", f"node{i}"])
                    for i, p in enumerate(ports)]
        else:
            self.model, self.nodes = "demo-llm", "inferlb sim demo nodes"
            sim = self.spawn("sim", [PY, "-m", "inferlb.cli.main", "sim", "--ports", *map(str, ports)])
            kids = [sim] * 3
        for url, kid in zip(self.node_urls, kids, strict=True):
            wait_http(url + "/health", kid, 60)

    def start_replicas(self, label: str, count: int, redis_prefix: str | None) -> list[tuple[str, Child]]:
        fleet = {"models": [{"name": self.model, "max_output_tokens": 4096, "default_max_tokens": self.cfg.max_tokens}],
                 "nodes": [{"name": f"node{i}", "url": u, "models": [self.model]}
                           for i, u in enumerate(self.node_urls)]}
        out = []
        for i in range(count):
            d = self.dir / f"{label}-{i}"
            d.mkdir()
            (d / "fleet.yaml").write_text(yaml.safe_dump(fleet, sort_keys=False))
            port = free_port()
            env = _child_env(INFERLB_HOST="127.0.0.1", INFERLB_PORT=str(port), INFERLB_LOG_LEVEL="WARNING",
                             INFERLB_DATABASE_URL=f"sqlite:///{d / 'audit.db'}", INFERLB_JOURNAL_DIR=str(d / "journal"),
                             INFERLB_ADMIN_PORT="0", INFERLB_ADMIN_KEY=self.admin_key)
            if redis_prefix is not None:
                env.update(INFERLB_REDIS_URL=self.cfg.redis_url, INFERLB_REDIS_PREFIX=redis_prefix,
                           INFERLB_CLUSTER_REPLICA_ID=f"{label}-{i}")
            child = self.spawn(f"{label}-{i}",
                               [PY, "-m", "inferlb.cli.main", "serve", "--config", str(d / "fleet.yaml")],
                               env=env)
            out.append((f"http://127.0.0.1:{port}", child))
        for url, child in out:
            wait_http(url + "/readyz", child, 90)
        return out

    def measure(self, label: str, count: int, clustered: bool) -> dict[str, Any]:
        prefix = f"inferlb-bench:{secrets.token_hex(4)}:" if clustered else None
        reps = self.start_replicas(label, count, prefix)
        try:
            urls = [u for u, _ in reps]
            syncs0 = self._syncs(urls) if clustered else 0
            spec = LoadSpec(urls=urls, n=self.cfg.n, concurrency=self.cfg.concurrency, stream=False,
                            max_tokens=self.cfg.max_tokens, model=self.model, warmup=max(50, 2 * self.cfg.concurrency),
                            max_seconds=self.cfg.max_seconds, watch={f"r{i}": c.pid for i, (_, c) in enumerate(reps)})
            r = subprocess.run([PY, "-m", "inferlb.bench.cell", "--spec", json.dumps(asdict(spec))],
                               capture_output=True, text=True, timeout=3 * self.cfg.max_seconds + 120,
                               env=_child_env(), check=False)
            if r.returncode != 0 or not r.stdout.strip():
                raise RuntimeError(f"load generator failed: {r.stderr[-1500:]}")
            res: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
            syncs = (self._syncs(urls) - syncs0) if clustered else 0
        finally:
            for _, c in reps:
                c.stop()
            if prefix is not None:
                asyncio.run(_drop_prefix(self.cfg.redis_url, prefix))
        done = max(1, res["n_done"])
        cpu = sum(v for v in res["cpu_s"].values() if v is not None)
        return {"run": label, "replicas": count, "n": res["n_done"], "errors": res["errors"],
                "rps": round(res["rps"], 1), "e2e_p50_ms": round(res["e2e_ms"]["p50"], 2),
                "e2e_p99_ms": round(res["e2e_ms"]["p99"], 2), "gateway_cpu_ms_per_req": round(cpu * 1000 / done, 3),
                "redis_syncs_per_req": round(syncs / done, 4) if clustered else None,
                "system_busy": round(res["system_busy_frac"] or 0, 3)}

    def _syncs(self, urls: list[str]) -> int:
        return sum(int((_admin(u, self.admin_key).get("cluster") or {}).get("syncs") or 0) for u in urls)


async def _drop_prefix(url: str, prefix: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.from_url(url, socket_timeout=2)
    try:
        keys = [k async for k in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def run(cfg: ReplicaBenchConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"config": {k: str(v) for k, v in asdict(cfg).items()},
                           "admission": measure_admission(cfg.micro_n, cfg.redis_url), "runs": []}
    with workdir(cfg.workdir) as wd:
        r = _Run(cfg, wd)
        try:
            r.start_nodes()
            out["nodes"] = r.nodes
            if 1 in cfg.replicas:
                out["runs"].append(r.measure("single", 1, clustered=False))
            for count in cfg.replicas:
                out["runs"].append(r.measure(f"cluster-{count}", count, clustered=True))
        finally:
            r.close()
    return out


def _table(res: dict[str, Any]) -> str:
    a = res["admission"]
    lines = [f"nodes: {res.get('nodes')}",
             f"admission decision + release, in-process: plain {a['plain_us']} µs, shared {a['shared_us']} µs "
             f"(0 Redis round trips on the request path); a per-request Redis lease instead: "
             f"{a.get('redis_lease_round_trips')} round trips, {a.get('redis_lease_wall_us')} µs wall, "
             f"{a.get('redis_lease_client_cpu_us')} µs client CPU; one cluster sync: "
             f"{a.get('sync_round_trips')} round trip, {a.get('sync_wall_us')} µs wall, "
             f"{a.get('sync_client_cpu_us')} µs client CPU",
             "",
             "| run | replicas | requests | errors | req/s | e2e p50 ms | e2e p99 ms | gateway CPU ms/req "
             "| Redis syncs/req | machine busy |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["runs"]:
        lines.append(f"| {r['run']} | {r['replicas']} | {r['n']} | {r['errors']} | {r['rps']} | {r['e2e_p50_ms']} | "
                     f"{r['e2e_p99_ms']} | {r['gateway_cpu_ms_per_req']} | {r['redis_syncs_per_req']} | "
                     f"{r['system_busy']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inferlb bench replicas", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--replicas", default="1,2,3")
    ap.add_argument("--fake-server", type=Path, default=repo_root().parent / "shared" / "peer-bench"
                    / "fake_openai_server.py")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--max-seconds", type=float, default=20.0)
    ap.add_argument("--micro-n", type=int, default=20_000)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    cfg = ReplicaBenchConfig(n=a.n, concurrency=a.concurrency, max_tokens=a.max_tokens,
                             replicas=[int(x) for x in a.replicas.split(",") if x], fake_server=a.fake_server,
                             redis_url=a.redis_url, max_seconds=a.max_seconds, micro_n=a.micro_n)
    res = run(cfg)
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=2))
    print(_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
