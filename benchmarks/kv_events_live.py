"""Cache routing fed by KV events against the hash-only affinity, live: real gateway processes in
front of emulated nodes that publish their prefix caches' KV events over ZeroMQ.

::

    python -m benchmarks.kv_events_live [--rate 6] [--duration 45] [--seed 1] [--json OUT]

The nodes are ``cache4`` (4 ``a100``-like nodes, each with the emulator's prefix cache), written
to a simulated-fleet file with ``kv_events_port`` set (inferlb/simulator/kv_publisher.py: PUB on
127.0.0.1, its replay ROUTER on the next port). Two targets, each with a fresh node process (cold
caches) and its own gateway, get the same seeded open-loop plan of ``chat-sessions``
(``benchmarks.affinity``'s workload and measurement):

* ``hash``: profile ``prefix-affinity``, no ``kv_events`` in the gateway's fleet file;
* ``kv``: the same, with the model's ``kv_events: {tokenizer: emulator}`` and each node's
  ``kv_events`` endpoint and replay endpoint: the gateway subscribes (inferlb/kvevents) and the
  ``affinity`` picker ranks by the blocks each node's engine says it holds.

Printed side by side: TTFT p50 / p90 / p99, e2e p50 / p99, errors, the nodes' prefix-cache hit
rate (``/sim/stats``), and for ``kv`` the gateway's own count of decisions that used the index or
fell back (``/dashboard/kv-events``). Nothing is tuned. Wall-clock figures: a shared machine's
noise is in them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from benchmarks.affinity import prefix_cache_totals
from inferlb.bench.loadgen.procs import free_port, workdir
from inferlb.bench.loadgen.results import summarize
from inferlb.bench.loadgen.runner import run_plan
from inferlb.bench.loadgen.stack import Stack, gateway_fleet, node_overrides
from inferlb.bench.loadgen.workload import load_workload, plan

__all__ = ["main"]


def _port_pair() -> int:
    """A free port whose next one is free too (the publisher's replay socket takes it)."""
    for _ in range(100):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise RuntimeError("no free pair of ports")


def _kv_panel(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/dashboard/kv-events", timeout=5) as r:
        out: dict[str, Any] = json.loads(r.read())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kv_events_live", description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=6.0, help="requests per second (sessions × turns)")
    ap.add_argument("--duration", type=float, default=45.0, help="arrival window, s")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stream-interval", type=int, default=8)
    ap.add_argument("--json", dest="json_out", type=Path)
    ap.add_argument("--workdir", type=Path)
    a = ap.parse_args(argv)
    w = load_workload("chat-sessions")
    reqs = plan(w, seed=a.seed, rate=a.rate, duration_s=a.duration)
    results: list[dict[str, Any]] = []
    with workdir(a.workdir) as wd:
        ports: dict[str, int] = {}
        nodes_file = []
        for i in range(4):
            p = _port_pair()
            ports[f"a100-{i}"] = p
            nodes_file.append({"name": f"a100-{i}", "preset": "a100", "prefix_cache": True, "kv_events_port": p})
        fleet_path = Path(wd) / "kv-fleet.yaml"
        fleet_path.write_text(yaml.safe_dump({"model": w.model, "nodes": nodes_file}))
        stack = Stack(Path(wd), str(fleet_path), sim_args=node_overrides(None, a.stream_interval),
                      log=lambda m: print(time.strftime("%H:%M:%S"), m, file=sys.stderr, flush=True))
        try:
            for label in ("hash", "kv"):
                nodes = stack.start_nodes()
                fleet = gateway_fleet(stack.specs, nodes, "prefix-affinity", w, a.seed)
                if label == "kv":
                    fleet["models"][0]["kv_events"] = {"tokenizer": "emulator"}
                    for n in fleet["nodes"]:
                        p = ports[n["name"]]
                        n["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{p}",
                                          "replay_endpoint": f"tcp://127.0.0.1:{p + 1}"}
                url = stack.start_gateway_with(f"gateway-{label}", fleet)
                data = asyncio.run(run_plan(reqs, w, [url], label=label, nodes=nodes, duration_s=a.duration))
                s = summarize(data, w)
                s["prefix_cache"] = prefix_cache_totals(nodes)
                assert stack.admin_url is not None
                s["kv_panel"] = _kv_panel(stack.admin_url)
                results.append(s)
                stack.stop_gateway()
        finally:
            stack.close()
    base = results[0]["ttft_s"]["p50"]
    print(f"workload {w.name}, fleet cache4 with KV events, rate {a.rate:g}/s, {a.duration:g} s, seed {a.seed}: "
          f"{len(reqs)} requests, {results[0]['measured']} measured (after {w.warmup_s:g} s warm-up)")
    print(f"{'target':8} {'TTFT p50':>9} {'p90':>8} {'p99':>8} {'e2e p50':>8} {'e2e p99':>8} {'ok':>5} {'errors':>7} "
          f"{'hit %':>6} {'index used':>10} {'fell back':>9} {'TTFT p50 ÷ hash':>16}")
    for s in results:
        t, e, pc = s["ttft_s"], s["e2e_s"], s["prefix_cache"]
        m = (s["kv_panel"].get("models") or {}).get(w.model) or {}
        print(f"{s['label']:8} {t['p50'] * 1e3:7.0f}ms {t['p90'] * 1e3:6.0f}ms {t['p99'] * 1e3:6.0f}ms "
              f"{e['p50']:7.2f}s {e['p99']:7.2f}s {s['ok']:5d} {sum(s['errors'].values()):7d} "
              f"{pc['hit_rate'] * 100:6.1f} {m.get('used', '-')!s:>10} {m.get('fallback', '-')!s:>9} "
              f"{t['p50'] / base:15.2f}×")
    if a.json_out:
        a.json_out.write_text(json.dumps({"rate": a.rate, "duration_s": a.duration, "seed": a.seed,
                                          "runs": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
