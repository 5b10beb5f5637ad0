"""Reloads under load: requests served and failed while the gateway swaps its request process 20
times, and how long a reload takes; with a baseline phase (same load, no reload) in the same run.

::

    python -m benchmarks.reload [--reloads 20] [--workers 8] [--phase-s 10]

One process runs the simulated nodes (fast, like the tests'), the gateway (its real HTTP server,
:func:`~inferlb.server.build_server`) and the client: ``workers`` closed-loop clients send
chat completions (half streamed) for ``phase_s`` seconds without reloads, then for ``phase_s``
seconds while ``POST /admin/reload`` runs every ``phase_s / reloads`` seconds, alternating the
shipped ``inference_request.bpmn`` and a variant (one extra script task that tags the audit record,
tests/processes/fixtures/inference_request_tagged.bpmn). A request fails when its status is not
200, a stream does not end with ``[DONE]``, or the connection breaks. Bounded: two phases of at
most 30 s each. Prints one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

# The admin plane wants a key on the public listener (docs/security.md, "The admin plane"); this one
# lives as long as the benchmark's own gateway.
ADMIN_KEY = "bench-admin-" + "k" * 32

__all__ = ["main", "run"]

ROOT = Path(__file__).resolve().parents[1]
VARIANT = ROOT / "tests" / "processes" / "fixtures" / "inference_request_tagged.bpmn"


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 3)


async def _client(http: httpx.AsyncClient, stop: asyncio.Event, out: dict[str, Any], i: int) -> None:
    k = 0
    while not stop.is_set():
        stream = (i + k) % 2 == 1
        body = {"model": "m", "messages": [{"role": "user", "content": f"hi {i} {k}"}], "max_tokens": 8,
                "stream": stream}
        t0 = time.perf_counter()
        try:
            if stream:
                async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    text = "".join([c async for c in r.aiter_text()])
                    good = r.status_code == 200 and "data: [DONE]" in text
            else:
                r = await http.post("/v1/chat/completions", json=body)
                good = r.status_code == 200
        except httpx.HTTPError:
            good = False
        out["ok" if good else "failed"] += 1
        out["latency_ms"].append((time.perf_counter() - t0) * 1000.0)
        k += 1


async def _phase(http: httpx.AsyncClient, workers: int, seconds: float, reloads: int,
                 swap: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": 0, "failed": 0, "latency_ms": []}
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_client(http, stop, out, i)) for i in range(workers)]
    reload_ms: list[float] = []
    server_ms: list[float] = []
    refused = 0
    t0 = time.perf_counter()
    for i in range(reloads):
        await asyncio.sleep(max(0.0, t0 + (i + 0.5) * seconds / reloads - time.perf_counter()))
        swap(i)
        s = time.perf_counter()
        r = await http.post("/admin/reload", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        reload_ms.append((time.perf_counter() - s) * 1000.0)
        if r.status_code == 200:
            server_ms.append(float(r.json()["took_ms"]))
        else:
            refused += 1
    await asyncio.sleep(max(0.0, t0 + seconds - time.perf_counter()))
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    elapsed = time.perf_counter() - t0
    lat = out["latency_ms"]
    res: dict[str, Any] = {"seconds": round(elapsed, 2), "served": out["ok"], "failed": out["failed"],
                           "req_per_s": round(out["ok"] / elapsed, 1), "latency_p50_ms": _pct(lat, 0.5),
                           "latency_p99_ms": _pct(lat, 0.99), "latency_max_ms": round(max(lat), 3) if lat else None}
    if reloads:
        res.update({"reloads": reloads, "reloads_refused": refused,
                    "reload_client_ms": {"p50": _pct(reload_ms, 0.5), "max": round(max(reload_ms), 3)},
                    "reload_server_ms": {"p50": _pct(server_ms, 0.5),
                                         "mean": round(statistics.fmean(server_ms), 3) if server_ms else None,
                                         "max": round(max(server_ms), 3) if server_ms else None}})
    return res


async def run(*, reloads: int = 20, workers: int = 8, phase_s: float = 10.0) -> dict[str, Any]:
    from inferlb.app import create_app
    from inferlb.bench.loadgen.procs import free_port
    from inferlb.config.admission import AdmissionSettings
    from inferlb.config.settings import Settings
    from inferlb.server import build_server
    from inferlb.simulator.emulator import SimFleet
    from inferlb.simulator.spec import NodeSpec

    phase_s = min(max(phase_s, 1.0), 30.0)
    specs = [NodeSpec(name=f"n{i}", models=["m"], base_ttft_s=0.002, tpot_s=0.0005) for i in range(3)]
    with tempfile.TemporaryDirectory(prefix="inferlb-reload-") as tmp_s:
        tmp = Path(tmp_s)
        pdir = tmp / "processes"
        pdir.mkdir()
        for f in (ROOT / "processes").glob("*.bpmn"):
            shutil.copy(f, pdir / f.name)
        target = pdir / "inference_request.bpmn"
        sources = [VARIANT, ROOT / "processes" / "inference_request.bpmn"]
        async with SimFleet(specs) as sim:
            fleet = {"models": [{"name": "m", "default_max_tokens": 8}],
                     "nodes": [{"name": n, "url": node.url, "models": ["m"]} for n, node in sim.nodes.items()],
                     "routing": {"profile": "token-aware", "seed": 1}}
            (tmp / "fleet.yaml").write_text(yaml.safe_dump(fleet))
            port = free_port()
            settings = Settings(config=tmp / "fleet.yaml", processes_dir=pdir, port=port, log_level="warning",
                                database_url=f"sqlite:///{tmp / 'audit.db'}", journal_dir=tmp / "journal",
                                admission=AdmissionSettings(admin_key=ADMIN_KEY, redis_url=None))
            server = build_server(create_app(settings), settings)
            task = asyncio.create_task(server.serve())
            try:
                for _ in range(600):
                    if server.started:
                        break
                    await asyncio.sleep(0.05)
                limits = httpx.Limits(max_connections=workers + 4, max_keepalive_connections=workers + 4)
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30, limits=limits,
                                             trust_env=False) as http:
                    await _phase(http, workers, 1.0, 0, None)   # warm-up, not reported
                    baseline = await _phase(http, workers, phase_s, 0, None)
                    during = await _phase(http, workers, phase_s, reloads,
                                          lambda i: shutil.copy(sources[i % 2], target))
            finally:
                server.should_exit = True
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 30)
    return {"workers": workers, "phase_s": phase_s, "baseline_no_reload": baseline, "with_reloads": during}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reload", description=__doc__.split("\n\n")[0])
    p.add_argument("--reloads", type=int, default=20)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--phase-s", dest="phase_s", type=float, default=10.0, help="seconds per phase (≤ 30)")
    args = p.parse_args(argv)
    out = asyncio.run(run(reloads=args.reloads, workers=args.workers, phase_s=args.phase_s))
    print(json.dumps(out, indent=2))
    return 0 if out["with_reloads"]["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
