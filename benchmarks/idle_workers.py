"""Idle CPU of ``inferlb serve --workers N``: the supervisor (with its coordinator) and each worker.

::

    python -m benchmarks.idle_workers [--idle-s 60] [--settle-s 15] [--workers 2] [--rounds 2]
                                      [--profile token-aware] [--scrapes 0]
                                      [--variant NAME=TREE[,VAR=VALUE...] ...]

Starts three simulated nodes (inferlb/simulator, in this process: their CPU is not counted), then
for each round and each variant, interleaved (A, B, A, B …: the shared machine's load drifts), one
``inferlb serve --workers N`` with the variant's environment on a fresh SQLite database: once
every worker answers ``/readyz`` and ``--settle-s`` more have passed (start-up work, first health
rounds), the CPU of each process (the sum over its threads of ``/proc/PID/task/TID/schedstat``,
nanoseconds: :func:`benchmarks.idle_memory.idle_cpu_ms_per_s`) over ``--idle-s`` seconds without
traffic, in ms of CPU per second. A variant is a checkout (``PYTHONPATH``: the code before and
after a change, side by side in one run) and environment variables; by default this checkout.
With ``--scrapes N``, then 40 requests and N scrapes of ``/metrics`` over the port: the CPU of
every process together per scrape, and its size. One JSON line per run, then a table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.idle_memory import _cpu_s
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import NodeSpec
from inferlb.store.db import upgrade

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z" and int(fields[1]) == pid:
                    out.append(int(entry))
    return sorted(out)


def _one_run(urls: dict[str, str], tree: Path, env_extra: dict[str, str], args: argparse.Namespace
             ) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="idle-workers-") as tmp:
        t = Path(tmp)
        fleet = {"models": [{"name": "m"}],
                 "nodes": [{"name": n, "url": u, "models": ["m"]} for n, u in urls.items()],
                 "routing": {"profile": args.profile}}
        (t / "fleet.yaml").write_text(yaml.safe_dump(fleet))
        db = f"sqlite:///{t / 'audit.db'}"
        upgrade(db)
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(tree), "INFERLB_DATABASE_URL": db,
               "INFERLB_JOURNAL_DIR": str(t / "journal"), "INFERLB_LOG_LEVEL": "WARNING",
               "INFERLB_ADMIN_PORT": str(_free_port()), **env_extra}
        for var in ("INFERLB_REDIS_URL", "INFERLB_WORKERS"):
            env.pop(var, None)
        with (t / "log").open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "inferlb.cli.main", "serve", "--config",
                                     str(t / "fleet.yaml"), "--port", str(port), "--workers", str(args.workers)],
                                    env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
        try:
            end = time.monotonic() + 120
            while True:      # every worker started and the port answers ready
                assert proc.poll() is None and time.monotonic() < end, (t / "log").read_text()[-3000:]
                with contextlib.suppress(httpx.HTTPError):
                    r = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                    if r.status_code == 200 and (args.workers == 1 or len(_children(proc.pid)) == args.workers):
                        break
                time.sleep(0.2)
            time.sleep(args.settle_s)
            # --workers 1: one process, no supervisor (what the default runs)
            pids = ({"w0": proc.pid} if args.workers == 1 else
                    {"supervisor": proc.pid, **{f"w{i}": p for i, p in enumerate(_children(proc.pid))}})
            c0 = {k: _cpu_s(p) for k, p in pids.items()}
            t0 = time.monotonic()
            time.sleep(args.idle_s)
            c1 = {k: _cpu_s(p) for k, p in pids.items()}
            dt = time.monotonic() - t0
            out: dict[str, Any] = {}
            for k in pids:
                a, b = c0[k], c1[k]
                if a is not None and b is not None:
                    out[k] = round((b - a) * 1000 / dt, 2)
            if args.scrapes:
                out["scrape"] = _scrapes(port, pids, args.scrapes)
            return out
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _scrapes(port: int, pids: dict[str, int], n: int) -> dict[str, Any]:
    """After 40 requests (so the request series exist): ``n`` scrapes of ``/metrics`` over the port,
    each on a fresh connection (either worker answers); CPU of every process together per scrape."""
    base = f"http://127.0.0.1:{port}"
    for _ in range(40):
        httpx.post(base + "/v1/chat/completions", timeout=30,
                   json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    c0 = [_cpu_s(p) for p in pids.values()]
    size = series = 0
    for _ in range(n):
        r = httpx.get(base + "/metrics", timeout=30)
        size = len(r.content)
        series = sum(1 for line in r.text.splitlines() if line and not line.startswith("#"))
    c1 = [_cpu_s(p) for p in pids.values()]
    cpu = sum(b - a for a, b in zip(c0, c1, strict=True) if a is not None and b is not None)
    return {"cpu_ms_per_scrape": round(cpu * 1000 / n, 2), "bytes": size, "series": series}


def _variant(text: str) -> tuple[str, Path, dict[str, str]]:
    """``NAME=TREE[,VAR=VALUE...]``: the gateway's code from checkout ``TREE``, with that environment."""
    name, _, rest = text.partition("=")
    tree, *pairs = rest.split(",")
    return name, Path(tree or ROOT).resolve(), dict(kv.split("=", 1) for kv in pairs if kv)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle-s", type=float, default=60.0)
    ap.add_argument("--settle-s", type=float, default=15.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profile", default="token-aware")
    ap.add_argument("--scrapes", type=int, default=0, help="after the idle window: this many /metrics scrapes")
    ap.add_argument("--variant", action="append", type=_variant,
                    help="NAME=TREE[,VAR=VALUE...]: a checkout and its environment (repeatable; default: "
                         "this checkout as it is)")
    args = ap.parse_args(argv)
    variants = args.variant or [("this", ROOT, {})]
    loop = asyncio.new_event_loop()
    specs = [NodeSpec(name=f"n{i}", models=["m"]) for i in range(3)]
    sim = SimFleet(specs)
    loop.run_until_complete(sim.__aenter__())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in variants}
    try:
        urls = {n: node.url for n, node in sim.nodes.items()}
        for r in range(args.rounds):
            for name, tree, env in variants:
                got = _one_run(urls, tree, env, args)
                results[name].append(got)
                print(json.dumps({"round": r, "variant": name, "tree": str(tree), "env": env, "cpu_ms_per_s": got}),
                      flush=True)
    finally:
        asyncio.run_coroutine_threadsafe(sim.__aexit__(None, None, None), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    print(f"\nidle CPU, ms/s over {args.idle_s:g} s ({args.workers} workers, {args.rounds} rounds interleaved)")
    print(f"{'variant':<14} {'supervisor':>22} {'each worker':>28}")
    for name, runs in results.items():
        sup = ", ".join(f"{x['supervisor']:.2f}" if "supervisor" in x else "-" for x in runs)
        ws = ", ".join("/".join(f"{v:.2f}" for k, v in sorted(x.items()) if k.startswith("w")) for x in runs)
        print(f"{name:<14} {sup:>22} {ws:>28}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
