"""Idle CPU and memory growth of the gateway.

::

    python -m benchmarks.idle_memory [--idle-s 20] [--warmup 10000] [--n 40000] [--step 10000]
                                        [--concurrency 16] [--engine compiled] [--fake-server PATH]

Starts the benchmark's nodes (the peer bench's ``fake_openai_server.py``, as ``bench overhead``
does) and one ``inferlb serve`` process, then:

1. **idle CPU**: after the first health rounds, ``utime + stime`` of the gateway process (from
   ``/proc/PID/stat``) over ``--idle-s`` seconds without traffic, in ms of CPU per second;
2. **memory**: the gateway's RSS (``VmRSS`` of ``/proc/PID/status``) after ``--warmup`` requests,
   then after every ``--step`` further requests up to ``--n``, with the growth per request
   after the warm-up and the ratio final / after warm-up;
3. idle CPU once more, after the load (timers or queues left behind by the traffic show here).

The nodes are separate processes, so their CPU is never counted. Load comes from the closed-loop
generator (:mod:`.cell`) in its own process. Every phase is bounded in count and time;
every child is stopped by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from inferlb.bench.cell import LoadSpec
from inferlb.bench.loadgen.procs import tree_cpu_seconds, workdir
from inferlb.bench.overhead import PY, BenchConfig, Target, _Bench, _child_env, _Log

__all__ = ["idle_cpu_ms_per_s", "main", "rss_mib"]


def rss_mib(pid: int) -> float | None:
    """Resident set size of one process in MiB (``None`` when it is gone or without /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cpu_s(pid: int) -> float | None:
    """CPU seconds of process ``pid``: the sum over its threads of ``/proc/PID/task/TID/schedstat``
    (nanoseconds; a 20 s idle window needs better than the 10 ms ticks of ``/proc/PID/stat``), else
    ``utime + stime`` of its process tree. A thread that exits inside a window takes its time
    with it; the gateway's threads (the event loop, the worker pool) live as long as it does."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
        total = 0
        for tid in tids:
            with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        return tree_cpu_seconds(pid)


def idle_cpu_ms_per_s(pid: int, seconds: float) -> float | None:
    """CPU ms per wall second that process ``pid`` used over ``seconds``."""
    c0, t0 = _cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    c1, t1 = _cpu_s(pid), time.monotonic()
    if c0 is None or c1 is None:
        return None
    return (c1 - c0) * 1000.0 / (t1 - t0)


def _load(target: Target, n: int, concurrency: int, model: str, max_tokens: int, max_seconds: float) -> dict[str, Any]:
    spec = LoadSpec(urls=target.urls, n=n, concurrency=concurrency, stream=False, max_tokens=max_tokens,
                    model=model, warmup=0, max_seconds=max_seconds)
    cmd = [PY, "-m", "inferlb.bench.cell", "--spec", json.dumps(asdict(spec))]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=max_seconds + 2 * spec.timeout_s + 30,
                       env=_child_env(), check=False)
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"load generator failed (rc {r.returncode}): {r.stderr[-1500:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the measurement; returns the figures (also printed by :func:`main`)."""
    cfg = BenchConfig(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms, max_tokens=args.max_tokens,
                      workdir=args.workdir, modes=[args.engine])
    if args.fake_server is not None:
        cfg.fake_server = args.fake_server
    log = _Log(args.quiet)
    out: dict[str, Any] = {"engine": args.engine, "concurrency": args.concurrency, "idle_s": args.idle_s,
                           "rss_mib": [], "errors": 0}
    with workdir(args.workdir) as wd:
        bench = _Bench(cfg, wd, log)
        try:
            bench.start_nodes()
            target = bench.start_target(args.engine)
            assert target is not None and target.child is not None
            pid = target.child.pid
            time.sleep(args.settle_s)   # past start-up work (first health rounds, imports settling)
            out["idle_cpu_ms_per_s"] = idle_cpu_ms_per_s(pid, args.idle_s)
            out["rss_mib_idle"] = rss_mib(pid)
            log(f"idle: {out['idle_cpu_ms_per_s']:.2f} ms CPU/s, RSS {out['rss_mib_idle']:.1f} MiB")
            done = 0
            plan = [args.warmup] + [args.step] * max(0, (args.n + args.step - 1) // args.step)
            total = args.warmup + args.n
            for count in plan:
                count = min(count, total - done)
                if count <= 0:
                    break
                res = _load(target, count, args.concurrency, bench.model, cfg.max_tokens, args.max_seconds)
                done += res["n_done"]
                out["errors"] += res["errors"]
                rss = rss_mib(pid)
                out["rss_mib"].append({"requests": done, "rss_mib": rss, "rps": res["rps"]})
                log(f"after {done} requests: RSS {rss:.1f} MiB ({res['rps']:.0f} req/s, "
                    f"{res['errors']} errors {res['error_kinds'] or ''})")
            time.sleep(args.settle_s)
            out["idle_cpu_ms_per_s_after"] = idle_cpu_ms_per_s(pid, args.idle_s)
            log(f"idle after load: {out['idle_cpu_ms_per_s_after']:.2f} ms CPU/s")
        finally:
            bench.close()
    pts = out["rss_mib"]
    if len(pts) >= 2 and pts[0]["rss_mib"] and pts[-1]["rss_mib"]:
        first, last = pts[0], pts[-1]
        out["rss_ratio"] = last["rss_mib"] / first["rss_mib"]
        extra = last["requests"] - first["requests"]
        out["kib_per_request_after_warmup"] = ((last["rss_mib"] - first["rss_mib"]) * 1024.0 / extra
                                               if extra else None)
    return out


def _render(o: dict[str, Any]) -> str:
    lines = [f"engine {o['engine']}, concurrency {o['concurrency']}, non-stream",
             f"idle CPU (before load):   {o['idle_cpu_ms_per_s']:.2f} ms/s over {o['idle_s']:g} s",
             f"idle CPU (after load):    {o.get('idle_cpu_ms_per_s_after', float('nan')):.2f} ms/s",
             f"RSS idle after start:     {o['rss_mib_idle']:.1f} MiB"]
    for p in o["rss_mib"]:
        lines.append(f"RSS after {p['requests']:>7} req: {p['rss_mib']:.1f} MiB  ({p['rps']:.0f} req/s)")
    if "rss_ratio" in o:
        lines.append(f"RSS final / after warm-up: {o['rss_ratio']:.3f}   "
                     f"growth after warm-up: {o['kib_per_request_after_warmup']:.3f} KiB/request")
    lines.append(f"request errors: {o['errors']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns 1 when requests failed, 2 when the benchmark could not run."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.idle_memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle-s", type=float, default=20.0, help="idle measurement window (20)")
    ap.add_argument("--settle-s", type=float, default=5.0, help="wait before each idle window (5)")
    ap.add_argument("--warmup", type=int, default=10000, help="warm-up requests (10000)")
    ap.add_argument("--n", type=int, default=40000, help="requests after the warm-up (40000)")
    ap.add_argument("--step", type=int, default=10000, help="RSS is read after every STEP requests (10000)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=8, help="output tokens per request (8)")
    ap.add_argument("--ttft-ms", type=float, default=1.0, help="fake nodes' time to first token (1)")
    ap.add_argument("--tpot-ms", type=float, default=0.0, help="fake nodes' time per output token (0)")
    ap.add_argument("--engine", choices=["compiled", "spiff"], default="compiled")
    ap.add_argument("--max-seconds", type=float, default=600.0, help="cap on each load step (600)")
    ap.add_argument("--fake-server", type=Path, default=None, help="fake node script (as bench overhead)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep logs, configs and the audit DB here")
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        report = run(args)
    except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"idle_memory: error: {exc}", file=sys.stderr)
        return 2
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=2))
    print(_render(report))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
