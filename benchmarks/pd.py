"""Prefill/decode disaggregation against colocated serving: the DES, then the emulated fleet over
HTTP (inferlb colocated, inferlb disaggregated, vllm-router's PD mode), printed side by side.

::

    python -m benchmarks.pd [--rate R] [--duration S] [--seed N] [--long-share F] [--long-tokens N]
                            [--des-only] [--vllm-router PATH] [--http-rate R] [--http-duration S]

The fleet: four emulated ``a100`` nodes (``uniform4``). Colocated: every node serves whole
requests, routed by inferlb's ``token-aware`` profile. Disaggregated: two ``prefill`` and two
``decode`` nodes, the pair picked by routing/disagg.py; ``pd+short-local``: the same with
``min_prompt_tokens: 1000`` (chat prompts go whole to a decode node). The workload: Poisson
arrivals at ``--rate`` a second; ``--long-share`` (20 %) of the requests are long-prompt ones
(``--long-tokens`` 8,000 prompt tokens, 64 output: a document to summarise), the rest chat (300
prompt tokens, 200 output); all streamed. Figures: TTFT and TPOT (time per output token after the
first) p50 / p99 over successful requests; goodput: requests a second that succeeded with TTFT ≤
``--slo-ttft`` (2 s) and TPOT ≤ ``--slo-tpot`` (50 ms). The DES runs in virtual time
(simulator/des/pd.py: the emulator's engine model, the same pair pick and KV-transfer cost,
no host noise); the HTTP part is wall-clock on this host (gateway, nodes and load generator
share its cores) and each target starts on fresh nodes.

vllm-router runs as ``vllm-router --vllm-pd-disaggregation --prefill P --prefill P --decode D
--decode D --policy power_of_two`` (pip install vllm-router==0.1.17; its row is skipped, with the
reason, when it is not installed): it speaks the same vLLM NixlConnector protocol
(docs/disaggregation.md), which the emulated nodes count (prefill and decode legs per node).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferlb.bench.loadgen.peers import PeerExes
from inferlb.bench.loadgen.procs import free_port, wait_post
from inferlb.bench.loadgen.runner import run_plan
from inferlb.bench.loadgen.stack import Stack, gateway_fleet
from inferlb.bench.loadgen.workload import PlannedRequest, Workload
from inferlb.simulator.des.pd import PdSimulation
from inferlb.simulator.presets import SIM_MODEL, fleet_specs

__all__ = ["main", "plan"]

ROLES = {"a100-0": "prefill", "a100-1": "prefill", "a100-2": "decode", "a100-3": "decode"}


def plan(rate: float, duration_s: float, seed: int, long_share: float, long_tokens: int) -> list[PlannedRequest]:
    """The mixed workload (module docstring), seeded."""
    rng = random.Random(seed)
    out: list[PlannedRequest] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        long = rng.random() < long_share
        out.append(PlannedRequest(t=round(t, 6), prompt_tokens=long_tokens if long else 300,
                                  output_tokens=64 if long else 200, stream=True))
        t += rng.expovariate(rate)
    return out


def _q(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _row(label: str, ttft: list[float], tpot: list[float], ok: int, total: int, good: int, span_s: float,
         extra: str = "") -> str:
    return (f"{label:<22} {_q(ttft, .5):>7.3f} {_q(ttft, .99):>7.3f} {1000 * _q(tpot, .5):>8.1f} "
            f"{1000 * _q(tpot, .99):>8.1f} {ok:>5}/{total:<5} {good / span_s:>8.2f}  {extra}")


_HEAD = (f"{'':<22} {'TTFT s':>15} {'TPOT ms':>17} {'ok':>11} {'goodput':>8}\n"
         f"{'':<22} {'p50':>7} {'p99':>7} {'p50':>8} {'p99':>8} {'':>11} {'req/s':>8}")


def run_des(reqs: list[PlannedRequest], a: argparse.Namespace) -> None:
    specs = fleet_specs("uniform4", [SIM_MODEL])
    span = reqs[-1].t if reqs else 1.0
    print(f"\nDES (virtual time): {len(reqs)} requests over {span:.0f} s, {a.long_share:.0%} with "
          f"{a.long_tokens}-token prompts; SLO TTFT <= {a.slo_ttft} s, TPOT <= {1000 * a.slo_tpot:.0f} ms")
    print(_HEAD)
    for label, kw in (("colocated (4 both)", {}), ("pd (2P + 2D)", {"roles": ROLES}),
                      ("pd+short-local", {"roles": ROLES, "min_prompt_tokens": 1000})):
        rows = PdSimulation(specs, seed=a.seed, **kw).run(reqs)
        ok = [r for r in rows if r.status == "ok" and r.ttft_s is not None]
        tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
        good = sum(1 for r in ok if (r.ttft_s or 0) <= a.slo_ttft and (r.tpot_s or 0) <= a.slo_tpot)
        chat = [r.tpot_s for r in ok if r.prompt_tokens == 300 and r.tpot_s is not None]
        print(_row(label, [r.ttft_s for r in ok if r.ttft_s is not None], tpot, len(ok), len(rows), good, span,
                   f"chat TPOT p99 {1000 * _q(chat, .99):.1f} ms"))


def _pd_fleet(base: dict[str, Any], min_prompt: int = 0) -> dict[str, Any]:
    fleet = dict(base)
    fleet["models"] = [{**m, "disaggregation": {"mode": "prefill-decode", "protocol": "vllm-nixl",
                                                "min_prompt_tokens": min_prompt}} for m in base["models"]]
    fleet["nodes"] = [{**n, "role": ROLES[n["name"]]} for n in base["nodes"]]
    return fleet


def _legs(stack: Stack) -> str:
    import json
    import urllib.request

    out = []
    for name, url in stack.node_urls.items():
        with urllib.request.urlopen(url + "/sim/stats", timeout=5) as r:
            d = json.loads(r.read())
        out.append(f"{name[-1]}:{d.get('prefill_legs', 0)}p/{d.get('decode_legs', 0)}d")
    return " ".join(out)


def _start_vllm_router(stack: Stack, exe: str, w: Workload) -> str:
    import json

    port, metrics = free_port(), free_port()
    urls = stack.node_urls
    cmd = [exe, "--host", "127.0.0.1", "--port", str(port), "--vllm-pd-disaggregation",
           *[x for n in ROLES if ROLES[n] == "prefill" for x in ("--prefill", urls[n])],
           *[x for n in ROLES if ROLES[n] == "decode" for x in ("--decode", urls[n])],
           "--policy", "power_of_two", "--prometheus-port", str(metrics), "--prometheus-host", "127.0.0.1",
           "--worker-startup-check-interval", "1", "--log-level", "warning"]
    stack.stop_gateway()
    stack.gateway = stack._spawn("vllm-router-pd", cmd, dict(__import__("os").environ))
    url = f"http://127.0.0.1:{port}"
    body = json.dumps({"model": w.model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).encode()
    wait_post(url + "/v1/chat/completions", body, stack.gateway, 90, {})
    return url


def run_http(reqs: list[PlannedRequest], a: argparse.Namespace) -> None:
    w = Workload(model=SIM_MODEL, timeout_s=60.0)
    span = reqs[-1].t if reqs else 1.0
    print(f"\nEmulated fleet over HTTP (wall clock, this host): {len(reqs)} requests over {span:.0f} s")
    print(_HEAD)
    exes = PeerExes.find(vllm_router=a.vllm_router)
    with tempfile.TemporaryDirectory(prefix="inferlb-pd-") as tmp:
        stack = Stack(Path(tmp), "uniform4")
        try:
            targets: list[tuple[str, Any]] = [("inferlb colocated", None), ("inferlb pd", 0),
                                              ("inferlb pd+short-local", 1000), ("vllm-router pd", "peer")]
            for label, what in targets:
                if what == "peer" and exes.missing("vllm-router") is not None:
                    print(f"{label:<22} skipped: {exes.missing('vllm-router')}")
                    continue
                get_load = "vllm-router" if what == "peer" else None
                urls = stack.start_nodes(get_load=get_load)
                base = gateway_fleet(stack.specs, urls, "token-aware", w, a.seed)
                if what == "peer":
                    assert exes.vllm_router is not None
                    url = _start_vllm_router(stack, exes.vllm_router, w)
                else:
                    fleet = base if what is None else _pd_fleet(base, int(what))
                    url = stack.start_gateway_with(label.replace(" ", "-").replace("+", "-"), fleet)
                data = asyncio.run(run_plan(reqs, w, [url], label=label, nodes=stack.node_urls))
                ok = [o for o in data.outcomes if o.ok and o.ttft is not None]
                tpot = [(o.e2e - (o.ttft or 0)) / (o.tokens - 1) for o in ok if o.tokens > 1]
                good = sum(1 for o in ok if (o.ttft or 0) <= a.slo_ttft and o.tokens > 1
                           and (o.e2e - (o.ttft or 0)) / (o.tokens - 1) <= a.slo_tpot)
                print(_row(label, [o.ttft for o in ok if o.ttft is not None], tpot, len(ok), len(data.outcomes),
                           good, span, _legs(stack)), flush=True)
                stack.stop_gateway()
        finally:
            stack.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=10.0, help="DES arrivals a second (default 10)")
    ap.add_argument("--duration", type=float, default=300.0, help="DES seconds of arrivals (default 300)")
    ap.add_argument("--http-rate", type=float, default=6.0, help="HTTP arrivals a second (default 6)")
    ap.add_argument("--http-duration", type=float, default=30.0, help="HTTP seconds of arrivals (default 30)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--long-share", type=float, default=0.2)
    ap.add_argument("--long-tokens", type=int, default=8000)
    ap.add_argument("--slo-ttft", type=float, default=2.0)
    ap.add_argument("--slo-tpot", type=float, default=0.05)
    ap.add_argument("--des-only", action="store_true")
    ap.add_argument("--vllm-router", default=None, help="vllm-router executable (default: next to Python, or PATH)")
    a = ap.parse_args(argv)
    run_des(plan(a.rate, a.duration, a.seed, a.long_share, a.long_tokens), a)
    if not a.des_only:
        run_http(plan(a.http_rate, a.http_duration, a.seed, a.long_share, a.long_tokens), a)


if __name__ == "__main__":
    main()
