"""Where the gateway's CPU per request goes, by component, and paired A/B runs of two gateways.

::

    python -m benchmarks.request_profile profile [--n 3000] [--concurrency 16] [--stream both]
                                                 [--rate 200] [--fake-server PATH] [--json OUT]
    python -m benchmarks.request_profile ab --a ROOT_A --b ROOT_B [--a-env K=V ...] [--b-env K=V ...]
                                            [--rounds 3] [--n 3000] [--concurrency 32] [--stream both]
    python -m benchmarks.request_profile compare --a ROOT_A --b ROOT_B [--levels 16,64] [--n 2000]
                                                 [--peers direct,floor,vllm-router,sglang-router]

Both start the benchmark's three nodes (the peer bench's ``fake_openai_server.py``, 20 ms TTFT +
2 ms/token, 32 tokens, as ``inferlb bench overhead`` does) and ``inferlb serve`` (compiled
executor, SQLite audit with its write-ahead log, metrics on), and drive them with the closed-loop
generator (:mod:`inferlb.bench.cell`) in its own process.

``profile``: one gateway (this checkout). After a warm-up, ``py-spy record --nonblocking --threads
--format raw`` samples the gateway during the measured phase while its CPU is read per thread from
``/proc/PID/task/*/stat`` around the same phase. Each sample is assigned one component by
:func:`classify` (the innermost frame that names one: see ``_RULES``; generic frames such as
``json`` or ``asyncio`` count for the caller that names one), and each thread's CPU seconds are
shared out over its components in proportion to its samples. So the µs per request of a row are
the measured CPU of the gateway, split by where its threads were found running; the kernel time a
thread spends in a system call counts for the frame that made it. A sampler sees a thread that is
runnable but descheduled as running: on a loaded machine that adds noise, not a bias toward one
component, except where the thread itself wakes another: a socket write that wakes a node or
the client, or a queue put that wakes an audit thread, can hand the CPU to the woken process on
the spot, and the sampler then sees the waker "running" at that line. ``--pin`` (default on with
two or more CPUs) puts the gateway on the last CPU and the nodes and the load generator on the
others, so their wake-ups do not preempt it; its own threads still share its CPU. Needs
``py-spy`` (``pip install -e ".[profile]"``; ptrace rights on the gateway, root here).

``ab``: two gateways started side by side on the same nodes, ``A`` from ``ROOT_A`` and ``B`` from
``ROOT_B`` (each ``PYTHONPATH``; the same tree twice with different ``--a-env``/``--b-env`` settings
measures a setting), and one generator alternating its requests between them, so both see the same
machine at the same moments; the order of the two URLs flips every round (the generator's
round-robin starts with the first). Each gateway's CPU per request it served, and B/A.

``compare``: the end state side by side in one run: ``direct`` (no gateway), the Python floor, the
Rust routers (``round_robin``) and two inferlb builds (``A`` and ``B`` as for ``ab``), started as
``inferlb bench overhead`` starts them, cell by cell (every target of a (concurrency, stream) cell
back to back, so all see the same machine): gateway CPU ms per request, the latency added over
``direct`` of the same cell (p50 / p99), and each inferlb build's CPU over the floor's and over
vllm-router's.

Every load phase is bounded in count and time; every child is stopped by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from inferlb.bench.cell import LoadSpec
from inferlb.bench.loadgen.procs import Child, free_port, wait_http, workdir
from inferlb.bench.overhead import PY, BenchConfig, Target, _Bench, _cell_rows, _Log, repo_root

__all__ = ["COMPONENTS", "classify", "main", "parse_raw", "thread_cpu"]

# (path fragment, component), first match wins for one frame; frames matching none are generic.
_RULES: tuple[tuple[str, str], ...] = (
    ("/inferlb/store/", "audit"),
    ("/inferlb/tasks/audit.py", "audit"),
    ("/inferlb/engine/request_end.py", "audit"),
    ("/sqlalchemy/", "audit"),
    ("/sqlite3/", "audit"),
    ("/inferlb/observability/", "metrics"),
    ("/prometheus_client/", "metrics"),
    ("/inferlb/routing/", "routing"),
    ("/inferlb/tasks/routing.py", "routing"),
    ("/inferlb/fleet/", "routing"),
    ("/inferlb/engine/sse.py", "SSE relay"),
    ("/inferlb/engine/upstream.py", "upstream client"),
    ("/aiohttp/", "upstream client"),
    ("/multidict/", "upstream client"),
    ("/yarl/", "upstream client"),
    ("/inferlb/api/validation", "validation"),
    ("/inferlb/api/openai.py", "validation"),
    ("/inferlb/api/auth.py", "validation"),
    ("/inferlb/admission/", "workflow"),
    ("/inferlb/workflow/", "workflow"),
    ("/inferlb/tasks/", "workflow"),
    ("/inferlb/engine/scope.py", "workflow"),
    ("/SpiffWorkflow/", "workflow"),
    ("/inferlb/engine/", "gateway (dispatch, body, outcome)"),
    ("/inferlb/server/", "server (uvicorn, starlette, FastAPI, edge)"),
    ("/inferlb/api/", "server (uvicorn, starlette, FastAPI, edge)"),
    ("/uvicorn/", "server (uvicorn, starlette, FastAPI, edge)"),
    ("/httptools/", "server (uvicorn, starlette, FastAPI, edge)"),
    ("/starlette/", "server (uvicorn, starlette, FastAPI, edge)"),
    ("/fastapi/", "server (uvicorn, starlette, FastAPI, edge)"),
    ("/anyio/", "server (uvicorn, starlette, FastAPI, edge)"),
    ("/asyncio/", "event loop (uvloop C, socket system calls, wake-ups)"),
    ("/uvloop/", "event loop (uvloop C, socket system calls, wake-ups)"),
    ("/concurrent/futures/", "thread hand-off"),
    ("/threading.py", "thread hand-off"),
)
COMPONENTS: tuple[str, ...] = (*dict.fromkeys(c for _, c in _RULES), "other")
# Only when no frame of the stack names a component do these count (innermost first): a wait in
# asyncio or a thread pool is the loop's own, but asyncio code run *by* a component is that component's.
_WEAK = frozenset({"event loop (uvloop C, socket system calls, wake-ups)", "thread hand-off"})


def _frame_component(frame: str) -> str | None:
    # py-spy writes ``func (path:line)`` with site-packages and stdlib paths shortened to
    # ``aiohttp/client.py``; anchor every path at a slash so the rules match either form.
    frame = frame.replace(" (", " (/", 1)
    for fragment, component in _RULES:
        if fragment in frame:
            return component
    return None


def classify(frames: Sequence[str]) -> str:
    """The component of one stack, ``frames`` outermost first (py-spy's order): the innermost frame
    naming a component other than the event loop or the thread hand-off, else the innermost naming
    one of those two, else ``other``."""
    weak: str | None = None
    for frame in reversed(frames):
        c = _frame_component(frame)
        if c is None:
            continue
        if c not in _WEAK:
            return c
        if weak is None:
            weak = c
    return weak or "other"


def parse_raw(text: str) -> dict[str, Counter[str]]:
    """py-spy ``--format raw --threads`` output (one ``frame;frame;... count`` line per stack, the
    first frame naming the thread) → ``{thread label: Counter(component → samples)}``."""
    out: dict[str, Counter[str]] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith(("thread", "process")) else "?"
        if thread.startswith("process") and len(frames) > 1 and frames[1].startswith("thread"):
            thread = frames[1]
        out.setdefault(thread, Counter())[classify(frames)] += int(count)
    return out


def thread_cpu(pid: int) -> dict[int, float]:
    """``{native thread id: CPU seconds}`` of one process's live threads (``/proc/PID/task``)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            rest = data[data.rfind(b")") + 2:].split()
            out[int(tid)] = (int(rest[11]) + int(rest[12])) / tick
    return out


# ---------------------------------------------------------------------------------------- set-up


def _start_gateway(bench: _Bench, label: str, root: Path, env_extra: dict[str, str]) -> tuple[str, Child]:
    """``inferlb serve`` from ``root`` (its ``PYTHONPATH``), on the bench's nodes, as ``bench
    overhead`` configures its ``compiled`` target."""
    port = free_port()
    fleet = {
        "models": [{"name": bench.model, "max_output_tokens": 4096, "default_max_tokens": bench.cfg.max_tokens}],
        "nodes": [{"name": f"node{i + 1}", "url": u, "models": [bench.model]} for i, u in enumerate(bench.node_urls)],
        "routing": {"profile": bench.cfg.profile},
    }
    gdir = bench.dir / f"gw-{label}"
    gdir.mkdir(exist_ok=True)
    (gdir / "fleet.yaml").write_text(yaml.safe_dump(fleet, sort_keys=False))
    env = dict(os.environ)
    env.update(PYTHONPATH=str(root), INFERLB_ENGINE="compiled", INFERLB_HOST="127.0.0.1", INFERLB_PORT=str(port),
               INFERLB_DATABASE_URL=f"sqlite:///{gdir / 'audit.db'}", INFERLB_JOURNAL_DIR=str(gdir / "journal"),
               INFERLB_LOG_LEVEL="WARNING", INFERLB_ADMIN_PORT=str(free_port()))
    env.update(env_extra)
    child = bench.spawn(f"gw-{label}", [PY, "-m", "inferlb.cli.main", "serve", "--config",
                                        str(gdir / "fleet.yaml")], env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/readyz", child, 90)
    bench.log(f"gateway {label} ({root}) up at {url} (pid {child.pid})")
    return url, child


def pin(pid: int, cpus: set[int]) -> None:
    """Put every thread of process ``pid`` on ``cpus`` (threads it starts later inherit it)."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)


def _cpu_split() -> tuple[set[int], set[int]] | None:
    """(the gateway's CPU, everyone else's) for ``--pin``; None with fewer than two CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[-1]}, set(cpus[:-1])) if len(cpus) >= 2 else None


def _cell(urls: list[str], *, n: int, concurrency: int, stream: bool, warmup: int, max_tokens: int,
          max_seconds: float, watch: dict[str, int], model: str, cpus: set[int] | None = None) -> dict[str, Any]:
    spec = LoadSpec(urls=urls, n=n, concurrency=concurrency, stream=stream, max_tokens=max_tokens, model=model,
                    warmup=warmup, max_seconds=max_seconds, watch=watch)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(repo_root())
    r = subprocess.run([PY, "-m", "inferlb.bench.cell", "--spec", json.dumps(asdict(spec))], capture_output=True,
                       text=True, timeout=2 * max_seconds + 180, env=env, check=False,
                       preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"load generator failed (rc {r.returncode}): {r.stderr[-1500:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    if out["errors"]:
        raise RuntimeError(f"{out['errors']} requests failed: {out['error_kinds']}")
    return out


def _bench(args: argparse.Namespace, wd: Path) -> _Bench:
    cfg = BenchConfig(max_tokens=args.max_tokens, max_seconds=args.max_seconds, ttft_ms=args.ttft_ms,
                      tpot_ms=args.tpot_ms)
    if args.fake_server is not None:
        cfg.fake_server = args.fake_server
    if getattr(args, "floor_proxy", None) is not None:
        cfg.floor_proxy = args.floor_proxy
    bench = _Bench(cfg, wd, _Log(args.quiet))
    bench.start_nodes()
    return bench


def _streams(which: str) -> list[bool]:
    return {"both": [False, True], "yes": [True], "no": [False]}[which]


# ---------------------------------------------------------------------------------------- profile


def _profile_cell(args: argparse.Namespace, bench: _Bench, url: str, child: Child, stream: bool,
                  spy: str, others: set[int] | None) -> dict[str, Any]:
    common: dict[str, Any] = dict(concurrency=args.concurrency, stream=stream, max_tokens=args.max_tokens,
                                  max_seconds=args.max_seconds, model=bench.model, cpus=others)
    _cell([url], n=max(200, 4 * args.concurrency), warmup=0, watch={}, **common)   # warm-up
    raw_path = bench.dir / f"spy-{'stream' if stream else 'json'}.txt"
    spy_proc = subprocess.Popen([spy, "record", "--pid", str(child.pid), "--rate", str(args.rate), "--nonblocking",
                                 "--threads", "--format", "raw", "--output", str(raw_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(1.0)   # py-spy attaches (its start-up is not part of the window)
        cpu0 = thread_cpu(child.pid)
        out = _cell([url], n=args.n, warmup=0, watch={"gateway": child.pid}, **common)
        cpu1 = thread_cpu(child.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(spy_proc.pid, signal.SIGINT)   # py-spy writes its file on SIGINT
        try:
            spy_proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spy_proc.kill()
            spy_proc.wait()
    per_thread = {tid: cpu1[tid] - cpu0.get(tid, 0.0) for tid in cpu1}
    samples = parse_raw(raw_path.read_text()) if raw_path.exists() else {}
    n = out["n_done"]
    return {"stream": stream, "n": n, "cpu_s": out["cpu_s"]["gateway"], "e2e_ms": out["e2e_ms"],
            "thread_cpu_s": per_thread, "samples": {k: dict(v) for k, v in samples.items()},
            "components_us": _attribute(per_thread, samples, n)}


def _thread_tid(label: str) -> int | None:
    """py-spy's thread label ``thread (10117): MainThread`` → the native thread id 10117 (py-spy
    0.4 names threads by their OS id on Linux, in decimal; ``0x…`` read as hex)."""
    start, end = label.find("("), label.find(")")
    if start < 0 or end < start:
        return None
    text = label[start + 1:end]
    try:
        return int(text, 16) if text.startswith("0x") else int(text)
    except ValueError:
        return None


def _attribute(per_thread: dict[int, float], samples: dict[str, Counter[str]], n: int) -> dict[str, float]:
    """µs per request by component: each thread's CPU shared out by its samples; CPU of threads
    without samples (or whose label does not name a live thread) goes to ``unsampled``."""
    us: dict[str, float] = {}
    sampled = set()
    for label, counts in samples.items():
        tid = _thread_tid(label)
        total = sum(counts.values())
        if tid is None or tid not in per_thread or total == 0:
            continue
        sampled.add(tid)
        for comp, k in counts.items():
            us[comp] = us.get(comp, 0.0) + per_thread[tid] * k / total * 1e6 / n
    rest = sum(v for tid, v in per_thread.items() if tid not in sampled)
    if rest > 0:
        us["unsampled (threads py-spy did not see running)"] = rest * 1e6 / n
    return us


def _render_profile(cells: list[dict[str, Any]]) -> str:
    comps: list[str] = []
    for c in cells:
        comps += [k for k in c["components_us"] if k not in comps]
    order = sorted(comps, key=lambda k: -max(c["components_us"].get(k, 0.0) for c in cells))
    head = "| component | " + " | ".join(f"{'stream' if c['stream'] else 'non-stream'} µs/req | share"
                                          for c in cells) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(cells)]
    for k in order:
        row = f"| {k} |"
        for c in cells:
            v = c["components_us"].get(k, 0.0)
            total = sum(c["components_us"].values())
            row += f" {v:.0f} | {100 * v / total:.1f} % |"
        lines.append(row)
    row = "| **total (gateway process CPU / request)** |"
    for c in cells:
        row += f" **{sum(c['components_us'].values()):.0f}** | 100 % |"
    lines.append(row)
    return "\n".join(lines)


def run_profile(args: argparse.Namespace) -> dict[str, Any]:
    spy = shutil.which("py-spy") or str(Path(PY).with_name("py-spy"))
    if not Path(spy).exists():
        raise RuntimeError("py-spy not found: pip install py-spy")
    with workdir(args.workdir) as wd:
        bench = _bench(args, wd)
        try:
            root = Path(args.root).resolve() if args.root else repo_root()
            url, child = _start_gateway(bench, "profile", root, _env_pairs(args.env))
            split = _cpu_split() if args.pin else None
            if split is not None:
                pin(child.pid, split[0])
                for pid in bench.node_pids:
                    pin(pid, split[1])
            others = split[1] if split is not None else None
            cells = [_profile_cell(args, bench, url, child, s, spy, others) for s in _streams(args.stream)]
        finally:
            bench.close()
    return {"command": "profile", "root": str(root), "concurrency": args.concurrency, "pinned": split is not None,
            "cells": cells}


# ---------------------------------------------------------------------------------------- A/B


def run_ab(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with workdir(args.workdir) as wd:
        bench = _bench(args, wd)
        try:
            ua, ca = _start_gateway(bench, "A", Path(args.a).resolve(), _env_pairs(args.a_env))
            ub, cb = _start_gateway(bench, "B", Path(args.b).resolve(), _env_pairs(args.b_env))
            for stream in _streams(args.stream):
                _cell([ua, ub], n=max(400, 8 * args.concurrency), warmup=0, watch={}, concurrency=args.concurrency,
                      stream=stream, max_tokens=args.max_tokens, max_seconds=args.max_seconds, model=bench.model)
                for rnd in range(args.rounds):
                    urls = [ua, ub] if rnd % 2 == 0 else [ub, ua]
                    out = _cell(urls, n=args.n, warmup=0, watch={"A": ca.pid, "B": cb.pid},
                                concurrency=args.concurrency, stream=stream, max_tokens=args.max_tokens,
                                max_seconds=args.max_seconds, model=bench.model)
                    half = out["n_done"] / 2   # the generator's round-robin: each served half
                    a_ms, b_ms = out["cpu_s"]["A"] * 1e3 / half, out["cpu_s"]["B"] * 1e3 / half
                    by_url = out.get("e2e_ms_by_url") or [out["e2e_ms"], out["e2e_ms"]]
                    ea, eb = (by_url[0], by_url[1]) if rnd % 2 == 0 else (by_url[1], by_url[0])
                    row = {"stream": stream, "round": rnd + 1, "first": "A" if rnd % 2 == 0 else "B",
                           "n": out["n_done"], "a_ms": a_ms, "b_ms": b_ms, "b_over_a": b_ms / a_ms,
                           "a_e2e_ms": ea, "b_e2e_ms": eb, "busy": out["system_busy_frac"]}
                    rows.append(row)
                    bench.log(f"{'stream' if stream else 'json  '} round {rnd + 1}: A {a_ms:.3f} ms, "
                              f"B {b_ms:.3f} ms, B/A {b_ms / a_ms:.3f}")
        finally:
            bench.close()
    return {"command": "ab", "a": args.a, "b": args.b, "a_env": args.a_env, "b_env": args.b_env,
            "concurrency": args.concurrency, "rows": rows}


def _render_ab(o: dict[str, Any]) -> str:
    lines = [f"A = {o['a']} {' '.join(o['a_env'])}".rstrip(), f"B = {o['b']} {' '.join(o['b_env'])}".rstrip(), "",
             "| stream | round | first URL | requests | A ms/req | B ms/req | B/A | A e2e p50 / p99 ms "
             "| B e2e p50 / p99 ms | machine busy |",
             "|---|---:|---|---:|---:|---:|---:|---|---|---:|"]
    for r in o["rows"]:
        busy = f"{r['busy']:.2f}" if r["busy"] is not None else "?"
        ea, eb = r["a_e2e_ms"], r["b_e2e_ms"]
        lines.append(f"| {'yes' if r['stream'] else 'no'} | {r['round']} | {r['first']} | {r['n']} | "
                     f"{r['a_ms']:.3f} | {r['b_ms']:.3f} | {r['b_over_a']:.3f} | {ea['p50']:.1f} / {ea['p99']:.1f} | "
                     f"{eb['p50']:.1f} / {eb['p99']:.1f} | {busy} |")
    for stream in (False, True):
        ratios = sorted(r["b_over_a"] for r in o["rows"] if r["stream"] is stream)
        if ratios:
            lines.append(f"\n{'stream' if stream else 'non-stream'}: B/A median {statistics.median(ratios):.3f} "
                         f"(range {ratios[0]:.3f}–{ratios[-1]:.3f}, {len(ratios)} rounds)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- compare


def run_compare(args: argparse.Namespace) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    with workdir(args.workdir) as wd:
        bench = _bench(args, wd)
        bench.cfg.n = args.n
        try:
            targets = [t for t in (bench.start_target(m) for m in args.peers.split(",") if m) if t is not None]
            for label, root, env in (("inferlb-A", args.a, args.a_env), ("inferlb-B", args.b, args.b_env)):
                url, child = _start_gateway(bench, label, Path(root).resolve(), _env_pairs(env))
                targets.append(Target(label, [url], child))
            for c in (int(x) for x in args.levels.split(",")):
                for stream in _streams(args.stream):
                    for t in targets:
                        out = bench.load(t, c, stream)
                        results.append(out)
                        cpu = (out["cpu_s_per_1k"] or {}).get("gateway")
                        bench.log(f"{t.mode:>14} c={c:<3} {'stream' if stream else 'json  '} n={out['n_done']} "
                                  f"err={out['errors']} e2e p50={out['e2e_ms']['p50']:.1f} "
                                  f"p99={out['e2e_ms']['p99']:.1f} cpu={cpu if cpu is None else round(cpu, 2)} s/1k")
        finally:
            bench.close()
        notes = bench.notes
    return {"command": "compare", "a": args.a, "b": args.b, "a_env": args.a_env, "b_env": args.b_env,
            "rows": _cell_rows(results), "notes": notes}


def _render_compare(o: dict[str, Any]) -> str:
    rows = o["rows"]
    lines = [f"A = {o['a']} {' '.join(o['a_env'])}".rstrip(), f"B = {o['b']} {' '.join(o['b_env'])}".rstrip(), "",
             "| c | stream | target | requests | errors | gateway CPU ms/req | added p50 ms | added p99 ms |",
             "|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        cpu = r["gateway_cpu_s_per_1k"]
        a50, a99 = r["added_p50_ms"], r["added_p99_ms"]
        lines.append(f"| {r['concurrency']} | {'yes' if r['stream'] else 'no'} | {r['mode']} | {r['n']} | "
                     f"{r['errors']} | {'' if cpu is None else f'{cpu:.2f}'} | "
                     f"{'' if a50 is None else f'{a50:+.1f}'} | {'' if a99 is None else f'{a99:+.1f}'} |")
    lines += ["", "| c | stream | build | ÷ floor | ÷ vllm-router | ÷ sglang-router |", "|---:|---|---|---:|---:|---:|"]
    cells = sorted({(r["concurrency"], r["stream"]) for r in rows})
    for c, s in cells:
        cpu = {r["mode"]: r["gateway_cpu_s_per_1k"] for r in rows if (r["concurrency"], r["stream"]) == (c, s)}
        for build in ("inferlb-A", "inferlb-B"):
            mine = cpu.get(build)
            if mine is None:
                continue
            ratio = [f"{mine / cpu[p]:.1f}×" if cpu.get(p) else "" for p in ("floor", "vllm-router", "sglang-router")]
            lines.append(f"| {c} | {'yes' if s else 'no'} | {build} | " + " | ".join(ratio) + " |")
    lines += [f"\nnote: {n}" for n in o["notes"]]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- CLI


def _env_pairs(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise ValueError(f"expected KEY=VALUE, got {p!r}")
        out[k] = v
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.request_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("profile", "ab", "compare"):
        p = sub.add_parser(name)
        p.add_argument("--n", type=int, default=3000, help="measured requests per cell (3000)")
        p.add_argument("--concurrency", type=int, default=16 if name == "profile" else 32)
        p.add_argument("--stream", choices=["both", "yes", "no"], default="both")
        p.add_argument("--max-tokens", type=int, default=32)
        p.add_argument("--ttft-ms", type=float, default=20.0, help="fake nodes' time to first token (20)")
        p.add_argument("--tpot-ms", type=float, default=2.0, help="fake nodes' time per output token (2)")
        p.add_argument("--max-seconds", type=float, default=40.0, help="cap on each load phase (40)")
        p.add_argument("--fake-server", type=Path, default=None, help="the peer bench's fake_openai_server.py")
        p.add_argument("--workdir", type=Path, default=None, help="keep logs, samples and audit DBs here")
        p.add_argument("--json", dest="json_out", type=Path, default=None)
        p.add_argument("--quiet", action="store_true")
        if name == "profile":
            p.add_argument("--rate", type=int, default=200, help="py-spy samples per second (200)")
            p.add_argument("--env", action="append", default=[], help="KEY=VALUE for the gateway (repeatable)")
            p.add_argument("--root", default=None, help="checkout whose inferlb is profiled (this one)")
            p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                           help="gateway on the last CPU, nodes and load generator on the others (on)")
        else:
            if name == "compare":
                p.add_argument("--levels", default="16,64", help="concurrency levels (16,64)")
                p.add_argument("--floor-proxy", type=Path, default=None, help="the peer bench's floor_proxy.py")
                p.add_argument("--peers", default="direct,floor,vllm-router,sglang-router",
                               help="the other targets, started as `inferlb bench overhead` starts them")
            p.add_argument("--a", required=True, help="checkout root of gateway A")
            p.add_argument("--b", required=True, help="checkout root of gateway B")
            p.add_argument("--a-env", action="append", default=[], help="KEY=VALUE for A (repeatable)")
            p.add_argument("--b-env", action="append", default=[], help="KEY=VALUE for B (repeatable)")
            p.add_argument("--rounds", type=int, default=4, help="measured rounds per stream mode (4)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        out = {"profile": run_profile, "ab": run_ab, "compare": run_compare}[args.command](args)
    except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"request_profile: error: {exc}", file=sys.stderr)
        return 2
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(out, indent=2, default=str))
    if args.command == "profile":
        print(_render_profile(out["cells"]))
    else:
        print(_render_ab(out) if args.command == "ab" else _render_compare(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
