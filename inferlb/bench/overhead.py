"""``inferlb bench overhead``: what the gateway adds between clients and model servers.

::

    inferlb bench overhead [--n 2000] [--concurrency 16,64] [--max-tokens 32]
                           [--modes direct,floor,nginx,vllm-router,sglang-router,compiled,spiff]
                           [--vllm-router PATH] [--sglang-python PATH] [--json OUT] [--markdown]

Starts 3 fake OpenAI-compatible nodes on free loopback ports (the peer bench's
``fake_openai_server.py``, 20 ms TTFT + 2 ms/token, so figures compare with the team's peer
measurements; ``inferlb sim`` nodes when that file is absent), then one target per mode:

* ``direct``: no gateway; the load generator round-robins over the nodes itself (the baseline);
* ``floor``: the peer bench's bare FastAPI/uvicorn pass-through with the aiohttp client
  (``floor_proxy.py``): the least any Python gateway on this stack costs;
* ``nginx``: nginx ``least_conn`` over the nodes (skipped with a note when nginx is missing);
* ``vllm-router`` / ``sglang-router``: the Rust routers of the vLLM and SGLang projects with
  ``--router-policy`` (``round_robin``: no policy cost, like the floor's), started as
  :mod:`inferlb.bench.loadgen.peers` builds them (skipped with a note when not installed);
* ``compiled`` / ``spiff``: ``inferlb serve`` with ``INFERLB_ENGINE=compiled`` / ``spiff``, each its
  own subprocess with a generated fleet file and a SQLite audit database in a temp dir.

For each concurrency and stream / non-stream it runs every target (cell by cell, so all targets of
a cell see the same machine): a warm-up, then ``--n`` measured requests from the load generator in
closed-loop mode, in its own process (:mod:`.cell`). The table shows e2e p50/p99, TTFT p50/p99
(streams), req/s, the latency added over ``direct`` of the same cell, and the gateway's CPU seconds
per 1,000 requests (``utime + stime`` of its process tree over the measured phase only); a second
table divides each gateway's CPU per request by the floor's and each Rust router's. Before
that, the engine alone (:mod:`.engine`): CPU µs per request of the request process for both
executors, in-process, without HTTP.

Every loop is bounded in count and time (``--max-seconds`` per phase of a cell); everything binds
127.0.0.1; every child process is stopped by PID in ``finally``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from inferlb.bench.cell import LoadSpec
from inferlb.bench.engine import measure_engine
from inferlb.bench.loadgen.peers import PeerExes, parse_target, peer_command
from inferlb.bench.loadgen.procs import Child, free_port, system_busy, wait_http, wait_post, workdir
from inferlb.bench.report import render

__all__ = ["MODES", "BenchConfig", "Target", "main", "repo_root", "run_bench"]

MODES = ("direct", "floor", "nginx", "vllm-router", "sglang-router", "compiled", "spiff")
PY = sys.executable
_PEER = "../shared/peer-bench"     # the team's peer bench, next to the repo checkout

_NGINX_CONF = """\
# least_conn over the benchmark's nodes (modelled on the peer bench's configs/nginx.conf)
worker_processes 1;
daemon off;
pid nginx.pid;
error_log stderr warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path temp/body;
    proxy_temp_path temp/proxy;
    fastcgi_temp_path temp/fastcgi;
    uwsgi_temp_path temp/uwsgi;
    scgi_temp_path temp/scgi;
    upstream nodes {{
        least_conn;
{servers}        keepalive 256;
        keepalive_requests 100000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        keepalive_requests 100000;
        location / {{
            proxy_pass http://nodes;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def repo_root() -> Path:
    """The directory holding the ``inferlb`` package (the repo root in a checkout)."""
    return Path(__file__).resolve().parents[2]


def _git_state() -> dict[str, Any]:
    """The checkout's commit and how many tracked files differ from it (``{}`` outside a git checkout)."""
    root = repo_root()
    if not (root / ".git").exists():
        return {}
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_commit": head, "git_modified_files": len(dirty)}


def _child_env(**extra: str) -> dict[str, str]:
    """The environment for Python children: this interpreter's view of ``inferlb`` first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root()), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


@dataclass
class BenchConfig:
    """Parsed command-line options."""

    n: int = 2000
    concurrency: list[int] = field(default_factory=lambda: [16, 64])
    max_tokens: int = 32
    modes: list[str] = field(default_factory=lambda: list(MODES))
    streams: list[bool] = field(default_factory=lambda: [False, True])
    warmup: int | None = None            # default: max(50, 2 × concurrency)
    max_seconds: float = 30.0
    engine_n: int = 2000
    ttft_ms: float = 20.0
    tpot_ms: float = 2.0
    profile: str = "token-aware"
    fake_server: Path = field(default_factory=lambda: repo_root() / _PEER / "fake_openai_server.py")
    floor_proxy: Path = field(default_factory=lambda: repo_root() / _PEER / "floor_proxy.py")
    nginx: str | None = None
    vllm_router: str | None = None
    sglang_python: str | None = None
    router_policy: str = "round_robin"
    workdir: Path | None = None


@dataclass
class Target:
    """Where one mode's load goes; ``child`` is the gateway process whose CPU is measured."""

    mode: str
    urls: list[str]
    child: Child | None = None


class _Log:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(time.strftime("%H:%M:%S"), msg, file=sys.stderr, flush=True)


class _Bench:
    """Owns the work dir and every child; :meth:`close` stops them all by PID."""

    def __init__(self, cfg: BenchConfig, workdir: Path, log: _Log) -> None:
        self.cfg = cfg
        self.dir = workdir
        self.log = log
        self.children: list[Child] = []
        self.notes: list[str] = []
        self.node_urls: list[str] = []
        self.node_pids: list[int] = []
        self.node_kind = ""
        self.model = "fake-chat"

    def spawn(self, name: str, cmd: Sequence[str], *, env: dict[str, str] | None = None,
              stop_signal: int = signal.SIGTERM) -> Child:
        child = Child(name, cmd, self.dir / f"{name}.log", env=env, cwd=self.dir, stop_signal=stop_signal)
        self.children.append(child)
        return child

    def close(self) -> None:
        for child in reversed(self.children):
            child.stop()
        self.children.clear()

    # ------------------------------------------------------------------ nodes

    def start_nodes(self) -> None:
        ports = [free_port() for _ in range(3)]
        self.node_urls = [f"http://127.0.0.1:{p}" for p in ports]
        fake = self.cfg.fake_server.resolve()
        if fake.is_file():
            self.node_kind = (f"fake_openai_server.py ({fake}), --ttft-ms {self.cfg.ttft_ms:g} "
                              f"--tpot-ms {self.cfg.tpot_ms:g}")
            kids = [self.spawn(f"node{i + 1}", [PY, str(fake), "--host", "127.0.0.1", "--port", str(p),
                                                 "--ttft-ms", str(self.cfg.ttft_ms),
                                                 "--tpot-ms", str(self.cfg.tpot_ms), "--id", f"node{i + 1}"])
                    for i, p in enumerate(ports)]
        else:
            self.model = "demo-llm"
            self.node_kind = "inferlb sim demo nodes (fake_openai_server.py not found; timings differ)"
            self.notes.append(f"{fake} not found: the nodes are `inferlb sim` demo nodes (three speeds, "
                              "slower than 20 ms TTFT + 2 ms/token); figures are not comparable with the "
                              "peer bench, and direct round-robin vs. inferlb routing differ in more than "
                              "overhead")
            sim = self.spawn("sim", [PY, "-m", "inferlb.cli.main", "sim", "--ports", *map(str, ports)],
                             env=_child_env())
            kids = [sim] * 3
        for url, kid in zip(self.node_urls, kids, strict=True):
            wait_http(url + "/health", kid, 60)
        self.node_pids = sorted({k.pid for k in kids})
        self.log(f"nodes up: {', '.join(self.node_urls)} ({self.node_kind})")

    # ------------------------------------------------------------------ targets

    def start_target(self, mode: str) -> Target | None:
        """Start the gateway of ``mode``; ``None`` (with a note) when it cannot run here."""
        if mode == "direct":
            return Target("direct", list(self.node_urls))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        if mode == "floor":
            floor = self.cfg.floor_proxy.resolve()
            if not floor.is_file():
                self.notes.append(f"floor skipped: {floor} not found")
                return None
            cmd = [PY, "-m", "uvicorn", "floor_proxy:app", "--app-dir", str(floor.parent),
                   "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning",
                   "--loop", "uvloop", "--http", "httptools"]
            env = _child_env(FLOOR_CLIENT="aiohttp", FLOOR_BACKENDS=",".join(self.node_urls))
            child = self.spawn("floor", cmd, env=env)
            wait_http(url + "/openapi.json", child, 60)
        elif mode == "nginx":
            wanted = self.cfg.nginx or "nginx"
            exe = shutil.which(wanted)
            if exe is None and self.cfg.nginx is None:
                exe = shutil.which("/usr/sbin/nginx")   # root's PATH may lack sbin
            if exe is None:
                self.notes.append(f"nginx skipped: {wanted} not found (not installed?)")
                return None
            prefix = self.dir / "nginx"
            (prefix / "temp").mkdir(parents=True, exist_ok=True)
            servers = "".join(f"        server {u.removeprefix('http://')};\n" for u in self.node_urls)
            conf = prefix / "nginx.conf"
            conf.write_text(_NGINX_CONF.format(servers=servers, port=port))
            child = self.spawn("nginx", [exe, "-p", f"{prefix}/", "-c", str(conf), "-e", "stderr"],
                               stop_signal=signal.SIGQUIT)
            wait_http(url + "/health", child, 30)
        elif mode in ("vllm-router", "sglang-router"):
            t = parse_target(f"{mode}:{self.cfg.router_policy}")
            exes = PeerExes.find(vllm_router=self.cfg.vllm_router, sglang_python=self.cfg.sglang_python)
            why = exes.missing(mode)
            if why is not None:
                self.notes.append(f"{mode} skipped: {why}")
                return None
            child = self.spawn(mode, peer_command(t, exes, port=port, metrics_port=free_port(),
                                                  workers=self.node_urls))
            # Its /health answers before a health round has found the workers: wait for a
            # completion through it instead.
            _wait_routed(url, self.model, child)
        elif mode in ("compiled", "spiff"):
            fleet = {
                "models": [{"name": self.model, "max_output_tokens": 4096,
                            "default_max_tokens": self.cfg.max_tokens}],
                "nodes": [{"name": f"node{i + 1}", "url": u, "models": [self.model]}
                          for i, u in enumerate(self.node_urls)],
                "routing": {"profile": self.cfg.profile},
            }
            gdir = self.dir / f"inferlb-{mode}"
            gdir.mkdir(exist_ok=True)
            fleet_file = gdir / "fleet.yaml"
            fleet_file.write_text(yaml.safe_dump(fleet, sort_keys=False))
            env = _child_env(INFERLB_ENGINE=mode, INFERLB_HOST="127.0.0.1", INFERLB_PORT=str(port),
                             INFERLB_DATABASE_URL=f"sqlite:///{gdir / 'audit.db'}",
                             INFERLB_JOURNAL_DIR=str(gdir / "journal"), INFERLB_LOG_LEVEL="WARNING",
                             INFERLB_ADMIN_PORT=str(free_port()))
            child = self.spawn(f"inferlb-{mode}", [PY, "-m", "inferlb.cli.main", "serve", "--config",
                                                   str(fleet_file)], env=env)
            wait_http(url + "/readyz", child, 90)
        else:
            raise ValueError(f"unknown mode {mode!r}")
        self.log(f"{mode} up at {url} (pid {child.pid})")
        return Target(mode, [url], child)

    # ------------------------------------------------------------------ one cell

    def _watch(self, target: Target) -> dict[str, int]:
        """The gateway (its CPU is the figure) and the nodes (to tell the bench's CPU from others')."""
        watch = {f"node{i + 1}": pid for i, pid in enumerate(self.node_pids)}
        if target.child is not None:
            watch["gateway"] = target.child.pid
        return watch

    def load(self, target: Target, concurrency: int, stream: bool) -> dict[str, Any]:
        cfg = self.cfg
        spec = LoadSpec(urls=target.urls, n=cfg.n, concurrency=concurrency, stream=stream,
                        max_tokens=cfg.max_tokens, model=self.model,
                        warmup=cfg.warmup if cfg.warmup is not None else max(50, 2 * concurrency),
                        max_seconds=cfg.max_seconds,
                        watch=self._watch(target))
        if target.child is not None and not target.child.alive():
            raise RuntimeError(f"{target.mode} exited:\n{target.child.log_tail()}")
        cmd = [PY, "-m", "inferlb.bench.cell", "--spec", json.dumps(asdict(spec))]
        limit = 2 * cfg.max_seconds + 2 * spec.timeout_s + 30
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=_child_env(), check=False)
        if r.returncode != 0 or not r.stdout.strip():
            raise RuntimeError(f"load generator failed (rc {r.returncode}): {r.stderr[-1500:]}")
        out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
        out.update(mode=target.mode, concurrency=concurrency, stream=stream)
        return out


def _wait_routed(url: str, model: str, child: Child, timeout_s: float = 90.0) -> None:
    """Until a chat completion through ``url`` answers 200 (RuntimeError if ``child`` exits or time is up)."""
    body = json.dumps({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).encode()
    wait_post(url + "/v1/chat/completions", body, child, timeout_s)


def _cell_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flatten load results into table rows, with the latency added over ``direct`` of the same cell."""
    direct = {(r["concurrency"], r["stream"]): r for r in results if r["mode"] == "direct"}
    rows = []
    for r in results:
        base = direct.get((r["concurrency"], r["stream"]))
        e2e, ttft = r["e2e_ms"], r["ttft_ms"] or {}
        cpu_1k = (r["cpu_s_per_1k"] or {}).get("gateway")
        other = None   # share of all CPUs used by processes that are not this benchmark's
        if r.get("system_busy_cpu_s") is not None and r["system_total_cpu_s"]:
            ours = sum(v for v in (r["cpu_s"] or {}).values() if v is not None) + r["loadgen_cpu_s"]
            other = max(0.0, r["system_busy_cpu_s"] - ours) / r["system_total_cpu_s"]
        row = {"mode": r["mode"], "concurrency": r["concurrency"], "stream": r["stream"], "n": r["n_done"],
               "errors": r["errors"], "error_kinds": r["error_kinds"], "rps": r["rps"],
               "e2e_p50_ms": e2e["p50"], "e2e_p99_ms": e2e["p99"],
               "ttft_p50_ms": ttft.get("p50"), "ttft_p99_ms": ttft.get("p99"),
               "added_p50_ms": None, "added_p99_ms": None,
               "gateway_cpu_s_per_1k": cpu_1k, "system_busy": r["system_busy_frac"], "other_load": other,
               "loadgen_cpu_s": r["loadgen_cpu_s"]}
        if base is not None and r["mode"] != "direct":
            row["added_p50_ms"] = e2e["p50"] - base["e2e_ms"]["p50"]
            row["added_p99_ms"] = e2e["p99"] - base["e2e_ms"]["p99"]
        rows.append(row)
    return rows


def run_bench(cfg: BenchConfig, *, quiet: bool = False) -> dict[str, Any]:
    """Run the whole benchmark; returns ``{"meta", "engine", "cells", "rows", "notes"}``."""
    log = _Log(quiet)
    unknown = [m for m in cfg.modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {unknown} (known: {', '.join(MODES)})")
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(),
        "python": sys.version.split()[0], **_git_state(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
    }
    busy0 = system_busy()
    engine: dict[str, Any] | None = None
    if cfg.engine_n > 0:
        log(f"engine alone: {cfg.engine_n} requests per executor and scenario")
        engine = measure_engine(cfg.engine_n, max_seconds=cfg.max_seconds)
    results: list[dict[str, Any]] = []
    with workdir(cfg.workdir) as wd:
        bench = _Bench(cfg, wd, log)
        main_thread = threading.current_thread() is threading.main_thread()
        prev = signal.getsignal(signal.SIGTERM)

        def _on_term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt   # so the ``finally`` below stops every child

        if main_thread:
            signal.signal(signal.SIGTERM, _on_term)
        try:
            bench.start_nodes()
            targets = [t for t in (bench.start_target(m) for m in cfg.modes) if t is not None]
            for c in cfg.concurrency:
                for stream in cfg.streams:
                    for t in targets:
                        out = bench.load(t, c, stream)
                        results.append(out)
                        log(_one_line(out))
        finally:
            bench.close()
            if main_thread:
                signal.signal(signal.SIGTERM, prev)
        meta["nodes"] = bench.node_kind
        notes = bench.notes
    busy1 = system_busy()
    if busy0 and busy1 and busy1[1] > busy0[1]:
        meta["system_busy_overall"] = (busy1[0] - busy0[0]) / (busy1[1] - busy0[1])
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return {"meta": meta, "engine": engine, "cells": results, "rows": _cell_rows(results), "notes": notes}


def _one_line(o: dict[str, Any]) -> str:
    e = o["e2e_ms"]
    s = (f"{o['mode']:>8} c={o['concurrency']:<3} {'stream' if o['stream'] else 'json  '} n={o['n_done']} "
         f"err={o['errors']} rps={o['rps']:.0f} e2e p50={e['p50']:.1f} p99={e['p99']:.1f} ms")
    cpu = (o["cpu_s_per_1k"] or {}).get("gateway")
    if cpu is not None:
        s += f" cpu={cpu:.2f} s/1k"
    busy = o["system_busy_frac"]
    if busy is not None and not math.isnan(busy):
        s += f" busy={busy:.2f}"
    if o["error_kinds"]:
        s += f" errs={o['error_kinds']}"
    return s


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _parser() -> argparse.ArgumentParser:
    d = BenchConfig()
    ap = argparse.ArgumentParser(prog="inferlb bench overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=d.n, help="measured requests per cell (default %(default)s)")
    ap.add_argument("--concurrency", default=",".join(map(str, d.concurrency)),
                    help="comma-separated levels (16,64)")
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens, help="output tokens per request (32)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    ap.add_argument("--stream", choices=["both", "yes", "no"], default="both", help="which cells to run")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up requests per cell (max(50, 2c))")
    ap.add_argument("--max-seconds", type=float, default=d.max_seconds,
                    help="cap on each phase of a cell, and on each engine-alone loop (30)")
    ap.add_argument("--engine-n", type=int, default=d.engine_n,
                    help="engine-alone requests per executor and scenario; 0 skips it (2000)")
    ap.add_argument("--ttft-ms", type=float, default=d.ttft_ms, help="fake nodes' time to first token (20)")
    ap.add_argument("--tpot-ms", type=float, default=d.tpot_ms, help="fake nodes' time per output token (2)")
    ap.add_argument("--profile", default=d.profile, help="inferlb routing profile (token-aware)")
    ap.add_argument("--fake-server", type=Path, default=None,
                    help=f"fake node script (default: {_PEER}/fake_openai_server.py from the repo root; "
                         "inferlb sim nodes when absent)")
    ap.add_argument("--floor-proxy", type=Path, default=None,
                    help=f"floor proxy app (default: {_PEER}/floor_proxy.py; the row is skipped when absent)")
    ap.add_argument("--nginx", default=None,
                    help="nginx executable (default: from PATH; the row is skipped when missing)")
    ap.add_argument("--vllm-router", default=None,
                    help="vllm-router executable (default: next to this Python, or PATH; the row is skipped "
                         "when missing)")
    ap.add_argument("--sglang-python", default=None,
                    help="a Python with sglang-router installed (default: this one, or sglang-router's on PATH)")
    ap.add_argument("--router-policy", default=d.router_policy,
                    help="policy of the Rust routers (round_robin: no policy cost, as the floor)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep logs, configs and audit DBs here")
    ap.add_argument("--json", dest="json_out", type=Path, default=None, help="write all figures to this file")
    ap.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``inferlb bench overhead``; returns the exit status (1 when requests failed)."""
    args = _parser().parse_args(argv)
    cfg = BenchConfig(n=args.n, concurrency=_ints(args.concurrency), max_tokens=args.max_tokens,
                      modes=[m.strip() for m in args.modes.split(",") if m.strip()],
                      streams={"both": [False, True], "yes": [True], "no": [False]}[args.stream],
                      warmup=args.warmup, max_seconds=args.max_seconds, engine_n=args.engine_n,
                      ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms, profile=args.profile, nginx=args.nginx,
                      vllm_router=args.vllm_router, sglang_python=args.sglang_python,
                      router_policy=args.router_policy, workdir=args.workdir)
    if args.fake_server is not None:
        cfg.fake_server = args.fake_server
    if args.floor_proxy is not None:
        cfg.floor_proxy = args.floor_proxy
    try:
        report = run_bench(cfg, quiet=args.quiet)
    except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"inferlb bench overhead: error: {exc}", file=sys.stderr)
        return 2
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=2, default=str))
    print(render(report, markdown=args.markdown))
    return 1 if any(r["errors"] for r in report["rows"]) else 0
