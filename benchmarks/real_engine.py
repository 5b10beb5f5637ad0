"""inferlb in front of real llama.cpp servers: routing profiles side by side under saturation, what the
gateway learns of each server, and its prompt-token estimate against the real tokenizer.

``python -m benchmarks.real_engine [--threads 1,1] [--load 0.85 | --rate R] [--duration 60]
[--seed 1] [--profiles token-aware,least-connections,vllm-router:cache_aware,…] [--litellm-bin PATH]
[--json FILE]``

One llama-cpp-python server per ``--threads`` entry (SmolLM2-135M-Instruct, inferlb/modelserver/
llamacpp.py; servers given fewer threads are slower) on loopback ports, started once; for each
profile a fresh ``inferlb serve`` in front of them (same servers, same seeded plan): first a
calibration round (non-streamed chats of short and long prompts in turn: the estimate's error before
and after it learned), then the open-loop plan: Poisson arrivals at ``--load`` × the fleet's
capacity (measured first: each server's mean time for requests drawn like the plan's, sent to it
directly one at a time) or at ``--rate`` requests/s, for ``--duration`` s, every request streamed,
prompt and answer lengths lognormal (answers bounded by ``max_tokens``; the model may stop sooner).
Printed per profile: answers, errors, TTFT and e2e p50/p99 (client side), the share within the SLO
(TTFT ≤ ``--ttft-slo``, e2e ≤ ``--e2e-slo``), each server's share of requests, and what the gateway
learned of each (decode tokens/s, TTFT baseline). Requests the gateway's admission control sheds
(503 ``overloaded`` / ``queue_timeout``: it keeps a queue only as long as the wait stays near one
service time) are counted apart from errors.

Needs the ``engines`` extra. A benchmark: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from inferlb.bench.loadgen.peers import (
    PeerExes,
    litellm_config,
    litellm_env,
    new_master_key,
    parse_target,
    peer_command,
)
from inferlb.modelserver.llamacpp import LlamaServer, free_port, unavailable

MODEL, ALIAS = "smol", "smollm2"
_VOCAB = ("the", "river", "carries", "light", "past", "quiet", "stones", "while", "engineers", "measure",
          "tokens", "and", "latency", "across", "a", "fleet", "of", "patient", "servers", "under", "a", "sky",
          "of", "slow", "clouds")


def words(n: int, rng: random.Random) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(max(1, n)))


def lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(median * math.exp(rng.gauss(0.0, sigma)))))


def plan(seed: int, rate: float, duration_s: float) -> list[tuple[float, str, int]]:
    """(send time, prompt, max_tokens) of each request: the same for every profile."""
    rng = random.Random(seed)
    out: list[tuple[float, str, int]] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        out.append((t, words(lognormal(rng, 120, 0.9, 4, 900), rng), lognormal(rng, 40, 0.8, 4, 200)))
        t += rng.expovariate(rate)
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


class Gateway:
    """``inferlb serve`` over the servers with one routing profile (a subprocess)."""

    def __init__(self, servers: dict[str, LlamaServer], profile: str, tmp: Path, queue_wait: float) -> None:
        self.port, self.admin_port = free_port(), free_port()
        self.base, self.admin = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.admin_port}"
        fleet = tmp / f"fleet-{profile}.yaml"
        fleet.write_text(yaml.safe_dump({
            "models": [{"name": MODEL, "upstream_name": ALIAS, "max_context_tokens": 2048, "default_max_tokens": 64,
                        "max_output_tokens": 512}],
            "nodes": [{"name": n, "url": s.url, "models": [MODEL], "kind": "llamacpp-python"}
                      for n, s in servers.items()],
            "routing": {"profile": profile, "seed": 1},
            "timeouts": {"connect_s": 2.0, "first_token_s": 120.0, "idle_s": 60.0, "total_s": 300.0},
            "health": {"interval_s": 1.0},
            # A request on this fleet takes seconds: the default class's 2 s queue wait would shed
            # what the routing is here to place (--queue-wait; 0 keeps the default).
            **({"admission": {"classes": [{"name": "standard", "max_queue_wait_s": queue_wait}],
                              "default_class": "standard"}} if queue_wait > 0 else {}),
        }))
        env = {**os.environ, "INFERLB_DATABASE_URL": f"sqlite:///{tmp / f'audit-{profile}.db'}",
               "INFERLB_JOURNAL_DIR": str(tmp / f"journal-{profile}"), "INFERLB_ADMIN_PORT": str(self.admin_port),
               "INFERLB_LOG_LEVEL": "WARNING", "INFERLB_AUDIT_FLUSH_INTERVAL_S": "0.05"}
        self.log = tmp / f"gateway-{profile}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "inferlb.cli.main", "serve", "--config", str(fleet),
                                          "--port", str(self.port)], env=env, stdout=out, stderr=subprocess.STDOUT)

    async def ready(self, session: aiohttp.ClientSession, nodes: int) -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise SystemExit(f"gateway exited: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                fleet = await self.fleet(session)
                if sum(n["state"] == "healthy" for n in fleet.values()) == nodes:
                    return
            await asyncio.sleep(0.2)
        raise SystemExit("gateway not ready in 60 s")

    async def fleet(self, session: aiohttp.ClientSession) -> dict[str, dict[str, Any]]:
        async with session.get(self.admin + "/admin/fleet") as r:
            return {n["name"]: n for n in (await r.json())["nodes"]}

    async def audit(self, session: aiohttp.ClientSession, rid: str) -> dict[str, Any]:
        for _ in range(100):
            async with session.get(f"{self.admin}/audit/requests/{rid}") as r:
                if r.status == 200:
                    row: dict[str, Any] = await r.json()
                    return row
            await asyncio.sleep(0.05)
        raise SystemExit(f"no audit row for {rid}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def calibrate(gw: Gateway, session: aiohttp.ClientSession) -> dict[str, Any]:
    """Non-streamed chats, short and long prompts in turn: the estimate's relative error each time."""
    rng = random.Random(99)
    errors: list[float] = []
    for n in [1, 300, 4, 120, 2, 600, 10, 40, 1, 300, 4, 120]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": words(n, rng)}], "max_tokens": 1}
        async with session.post(gw.base + "/v1/chat/completions", json=body) as r:
            await r.read()
            rid = r.headers["x-request-id"]
        row = await gw.audit(session, rid)
        errors.append(abs(row["prompt_tokens_est"] - row["prompt_tokens"]) / row["prompt_tokens"])
    return {"first_two": sum(errors[:2]) / 2, "last_four": sum(errors[-4:]) / 4, "each": [round(e, 4) for e in errors]}


async def one(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, out: list[dict[str, Any]],
              model: str = MODEL) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True}
    t0 = time.monotonic()
    rec: dict[str, Any] = {"ok": False, "ttft": None, "e2e": None, "error": None}
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=300)) as r:
            if r.status != 200:
                try:
                    code = (await r.json())["error"]["code"]
                except (ValueError, KeyError, TypeError, aiohttp.ClientError):
                    code = "?"
                rec["error"] = f"http_{r.status}_{code}"
                return
            tail = b""
            async for chunk in r.content.iter_any():
                if rec["ttft"] is None and b'"content"' in chunk and b'"role"' not in chunk:
                    rec["ttft"] = time.monotonic() - t0
                tail = (tail + chunk)[-256:]
            rec["e2e"] = time.monotonic() - t0
            rec["ok"] = b"[DONE]" in tail and b'"error"' not in tail
            if not rec["ok"]:
                rec["error"] = "in_band_error"
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        rec["error"] = type(exc).__name__
    finally:
        out.append(rec)


async def capacity(servers: dict[str, LlamaServer], seed: int) -> dict[str, float]:
    """Each server's mean seconds per request of the plan's shape, sent straight to it one at a time."""
    reqs = plan(seed + 1000, 1.0, 6.0)[:4]
    out: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:
        for name, s in servers.items():
            times: list[float] = []
            for _, prompt, max_tokens in reqs:
                got: list[dict[str, Any]] = []
                await one(session, s.url + "/v1/chat/completions", prompt, max_tokens, got, model=ALIAS)
                if got and got[0]["ok"]:
                    times.append(got[0]["e2e"])
            out[name] = sum(times) / len(times) if times else float("inf")
    return out


async def run_peer(servers: dict[str, LlamaServer], target: str, args: argparse.Namespace, tmp: Path
                   ) -> dict[str, Any]:
    """A peer router (``vllm-router:POLICY``, ``sglang-router:POLICY``, ``litellm:POLICY``) over the
    same servers and plan; a peer that cannot route to them (no answer in 90 s) is a row that says so."""
    t = parse_target(target)
    exes = PeerExes.find(litellm=args.litellm_bin)
    missing = exes.missing(t.kind)
    row: dict[str, Any] = {"profile": t.label, "rate": args.rate_used, "requests": 0, "ok": 0, "shed": 0,
                           "errors": 0, "error_kinds": {}, "ttft_p50": math.nan, "ttft_p99": math.nan,
                           "e2e_p50": math.nan, "e2e_p99": math.nan, "slo_share": math.nan, "calibration": None,
                           "nodes": {n: {"threads": s.threads, "share": math.nan, "tokens_per_s": None,
                                         "ttft_baseline_s": None} for n, s in servers.items()}}
    if missing is not None:
        row["note"] = missing
        return row
    port, metrics_port = free_port(), free_port()
    key = new_master_key()
    config = None
    env = dict(os.environ)
    if t.kind == "litellm":
        config = tmp / "litellm.yaml"
        config.write_text(yaml.safe_dump(litellm_config([s.url for s in servers.values()], MODEL, t.policy or "",
                                                        300.0), sort_keys=False))
        env.update(litellm_env(key))
    cmd = peer_command(t, exes, port=port, metrics_port=metrics_port, workers=[s.url for s in servers.values()],
                       config=config)
    log = tmp / f"{t.label.replace(':', '-')}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    headers = {"authorization": f"Bearer {key}"} if t.kind == "litellm" else {}
    try:
        async with aiohttp.ClientSession(headers=headers) as session:
            end, up, last = time.monotonic() + 90, False, ""
            while time.monotonic() < end and proc.poll() is None and not up:
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    async with session.post(base + "/v1/chat/completions", json={
                            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                            timeout=aiohttp.ClientTimeout(total=60)) as r:
                        up, last = r.status == 200, f"HTTP {r.status}: {(await r.text())[:160]}"
                if not up:
                    await asyncio.sleep(1.0)
            if not up:
                row["note"] = f"never answered through it in 90 s ({last or 'no answer'})"
                return row
            out_rows: list[dict[str, Any]] = []
            start = time.monotonic()
            tasks = []
            for at, prompt, max_tokens in plan(args.seed, args.rate_used, args.duration):
                await asyncio.sleep(max(0.0, start + at - time.monotonic()))
                tasks.append(asyncio.create_task(one(session, base + "/v1/chat/completions", prompt, max_tokens,
                                                     out_rows)))
            await asyncio.gather(*tasks)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    row.update(_figures(out_rows, args))
    return row


def _figures(out: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    ok = [r for r in out if r["ok"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    e2e = [r["e2e"] for r in ok]
    good = [r for r in ok if r["ttft"] is not None and r["ttft"] <= args.ttft_slo and r["e2e"] <= args.e2e_slo]
    kinds: dict[str, int] = {}
    for r in out:
        if not r["ok"]:
            kinds[r["error"]] = kinds.get(r["error"], 0) + 1
    shed = sum(v for k, v in kinds.items() if k in ("http_503_overloaded", "http_503_queue_timeout"))
    return {"requests": len(out), "ok": len(ok), "shed": shed, "errors": len(out) - len(ok) - shed,
            "error_kinds": kinds, "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99), "e2e_p50": pct(e2e, 50),
            "e2e_p99": pct(e2e, 99), "slo_share": len(good) / max(1, len(out))}


async def run_profile(servers: dict[str, LlamaServer], profile: str, args: argparse.Namespace, tmp: Path
                      ) -> dict[str, Any]:
    if ":" in profile and not profile.startswith("inferlb:"):
        return await run_peer(servers, profile, args, tmp)
    profile = profile.removeprefix("inferlb:")
    gw = Gateway(servers, profile, tmp, args.queue_wait)
    try:
        async with aiohttp.ClientSession() as session:
            await gw.ready(session, len(servers))
            cal = await calibrate(gw, session)
            before = {n: v["requests_total"] for n, v in (await gw.fleet(session)).items()}
            out: list[dict[str, Any]] = []
            start = time.monotonic()
            tasks = []
            for t, prompt, max_tokens in plan(args.seed, args.rate_used, args.duration):
                await asyncio.sleep(max(0.0, start + t - time.monotonic()))
                tasks.append(asyncio.create_task(one(session, gw.base + "/v1/chat/completions", prompt, max_tokens,
                                                     out)))
            await asyncio.gather(*tasks)
            fleet = await gw.fleet(session)
    finally:
        gw.stop()
    sent = {n: fleet[n]["requests_total"] - before[n] for n in fleet}
    total = max(1, sum(sent.values()))
    return {"profile": profile, "rate": args.rate_used, **_figures(out, args), "calibration": cal,
            "nodes": {n: {"threads": servers[n].threads, "share": sent[n] / total,
                          "tokens_per_s": fleet[n]["tokens_per_s"], "ttft_baseline_s": fleet[n]["ttft_baseline_s"]}
                      for n in servers}}


def table(results: list[dict[str, Any]]) -> str:
    head = ("| profile | req/s | requests | shed (503) | errors | TTFT p50 | TTFT p99 | e2e p50 | e2e p99 | "
            "SLO share | requests per server (threads) | learned decode tok/s per server |")
    lines = [head, "|" + "---|" * 12]
    notes = []
    for r in results:
        if r.get("note"):
            notes.append(f"{r['profile']}: {r['note']}")
            lines.append(f"| {r['profile']} | {r['rate']:.2f} | – | – | – | – | – | – | – | – | "
                         "did not route (below) | – |")
            continue
        share = ", ".join(f"{n} ({v['threads']}t) {v['share']:.0%}" if v["share"] == v["share"] else f"{n} ?"
                          for n, v in r["nodes"].items())
        speed = ", ".join(f"{n} {v['tokens_per_s']:.1f}" if v["tokens_per_s"] else f"{n} -"
                          for n, v in r["nodes"].items())
        lines.append(f"| {r['profile']} | {r['rate']:.2f} | {r['requests']} | {r['shed']} | {r['errors']} | "
                     f"{r['ttft_p50']:.2f} s | "
                     f"{r['ttft_p99']:.2f} s | {r['e2e_p50']:.2f} s | {r['e2e_p99']:.2f} s | {r['slo_share']:.1%} | "
                     f"{share} | {speed} |")
    cal = "; ".join(f"{r['profile']}: {r['calibration']['first_two']:.1%} → {r['calibration']['last_four']:.1%}"
                    for r in results if r.get("calibration"))
    return ("\n".join(lines) + "".join(f"\n\n{n}" for n in notes)
            + f"\n\nprompt-token estimate error, first two → last four calibration answers: {cal}")


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    threads = [int(x) for x in args.threads.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="real-engine-"))
    servers = {f"n{i}": LlamaServer(port=free_port(), alias=ALIAS, n_ctx=2048, threads=t, log_path=tmp / f"n{i}.log")
               for i, t in enumerate(threads)}
    try:
        for s in servers.values():
            await asyncio.to_thread(s.start)
        if args.rate is not None:
            args.rate_used = args.rate
        else:
            service = await capacity(servers, args.seed)
            cap = sum(1.0 / t for t in service.values())
            args.rate_used = args.load * cap
            print(f"measured: mean seconds per request {', '.join(f'{n} {t:.2f}' for n, t in service.items())}; "
                  f"capacity {cap:.2f} req/s; load {args.load:.0%} → {args.rate_used:.2f} req/s", flush=True)
        return [await run_profile(servers, p, args, tmp) for p in args.profiles.split(",")]
    finally:
        for s in servers.values():
            s.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.real_engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,1", help="one server per entry, with that many CPU threads")
    ap.add_argument("--load", type=float, default=0.85, help="arrival rate as a share of the measured capacity")
    ap.add_argument("--rate", type=float, help="requests per second (open loop), instead of --load")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profiles", default="token-aware,least-connections",
                    help="inferlb profiles and peers (vllm-router:cache_aware, sglang-router:cache_aware, "
                         "litellm:least-busy; the peers extra, LiteLLM in its own venv: --litellm-bin)")
    ap.add_argument("--litellm-bin", dest="litellm_bin", help="the litellm program of its own venv")
    ap.add_argument("--ttft-slo", dest="ttft_slo", type=float, default=2.0)
    ap.add_argument("--e2e-slo", dest="e2e_slo", type=float, default=10.0)
    ap.add_argument("--queue-wait", dest="queue_wait", type=float, default=60.0,
                    help="the admission class's max_queue_wait_s (0: inferlb's default of 2 s)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    why = unavailable()
    if why is not None:
        print(f"benchmarks.real_engine: {why}", file=sys.stderr)
        return 2
    results = asyncio.run(main_async(args))
    print(table(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
