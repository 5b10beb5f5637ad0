"""A deterministic, realistic audit history for report and dashboard tests (and docs/dashboard.png).

Two hours of traffic ending at :data:`END` on three priced nodes, two models, three tenants and two
priority classes: streamed and plain requests overlapping on each node, a bad spell on ``gpu-c``
(503s retried on another node), client disconnects, load shedding and invalid input.
"""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import Engine

from inferlb.config.settings import FleetConfig, fleet_from_mapping
from inferlb.store.partitions import AHEAD_DAYS, day_of, ensure_days, is_partitioned
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.store.rows import upsert_records
from inferlb.types import ManualClock

START = 1_767_225_600.0          # 2026-01-01T00:00:00Z
END = START + 2 * 3600.0
NODES = {"gpu-a": ("h100", 4.10, 1.0), "gpu-b": ("a100", 2.50, 1.3), "gpu-c": ("l4", 0.80, 1.8)}
MODELS = {"llama-3-8b": "v2", "qwen-14b": "v1"}
TENANTS = ("acme", "globex", "initech")


# The autoscaler over the seeded history (dry-run: it records what it would do): 5-minute steps,
# a 30-minute season, the whole two hours of history; it plays ROUNDS rounds ROUND_S apart, the
# first at AUTOSCALE_FROM (the one the gateway's loop runs at start), the last at END.
ROUND_S = 300.0
ROUNDS = 19
AUTOSCALE_FROM = END - (ROUNDS - 1) * ROUND_S
AUTOSCALE: dict[str, Any] = {
    "interval_s": 86_400, "step_s": ROUND_S, "season_s": 1800, "history_s": 7200, "forecaster": "seasonal-naive",
    "scale_down_stabilisation_s": 600,
    "pools": [{"model": "llama-3-8b", "gpu": "h100", "min": 1, "max": 6, "tokens_per_s": 60},
              {"model": "llama-3-8b", "gpu": "a100", "min": 0, "max": 4, "tokens_per_s": 40},
              {"model": "qwen-14b", "gpu": "a100", "min": 1, "max": 4, "tokens_per_s": 30}],
}


# With versions: llama-3-8b has two versions (all its traffic on v2 until a rollout moves it) and
# rollouts run on a clock the test drives (one round an hour by the gateway's own timer: never in a test).
VERSIONS: dict[str, Any] = {"llama-3-8b": [{"name": "v2", "weight": 100, "nodes": ["gpu-a", "gpu-b"]},
                                           {"name": "v3", "weight": 0, "nodes": ["gpu-c"]}]}
ROLLOUTS: dict[str, Any] = {"interval_s": 3600, "steps": [10, 50, 100],
                            "criteria": {"min_requests": 20, "min_step_s": 0, "max_step_s": 3600}}


def fleet(urls: dict[str, str] | None = None, *, autoscale: bool = False, versions: bool = False) -> FleetConfig:
    """The fleet the seeded history ran on (node URLs are not contacted by report tests); with
    ``autoscale``, the :data:`AUTOSCALE` section too; with ``versions``, :data:`VERSIONS` and
    :data:`ROLLOUTS`."""
    return fleet_from_mapping({
        "models": [{"name": m, "version": v, **({"versions": VERSIONS[m]} if versions and m in VERSIONS else {})}
                   for m, v in MODELS.items()],
        "nodes": [{"name": n, "url": (urls or {}).get(n, "http://127.0.0.1:9"), "models": list(MODELS),
                   "price_per_hour": price, "labels": {"gpu": gpu}} for n, (gpu, price, _) in NODES.items()],
        "slos": [{"model": "llama-3-8b", "e2e_max_s": 5.0, "ttft_max_s": 0.6, "e2e_p95_s": 5.0},
                 {"model": "*", "e2e_max_s": 8.0}],
        "observability": {"metrics": {"tenants": list(TENANTS)}},
        **({"autoscale": AUTOSCALE} if autoscale else {}),
        **({"rollouts": ROLLOUTS} if versions else {}),
    }, source="seed")


def records(n: int = 1440, seed: int = 7) -> list[RequestRecord]:
    rng = random.Random(seed)
    out: list[RequestRecord] = []
    step = (END - START) / n
    for i in range(n):
        t = round(START + i * step + rng.uniform(0, step), 6)
        model = "llama-3-8b" if rng.random() < 0.7 else "qwen-14b"
        tenant = rng.choices(TENANTS, weights=(5, 3, 1))[0]
        priority = "interactive" if rng.random() < 0.6 else "batch"
        stream = rng.random() < 0.6
        kw: dict[str, Any] = {
            "request_id": f"seed-{i:05d}", "received_at": t, "endpoint": "chat", "model_requested": model,
            "model_served": model, "model_version": MODELS[model], "tenant": tenant, "priority": priority,
            "stream": stream, "engine": "compiled", "admitted_at": round(t + 0.0001, 6),
            "prompt_tokens_est": rng.randint(50, 1500),
        }
        roll = rng.random()
        if roll < 0.02:
            out.append(RequestRecord(**kw, status="rejected_invalid", http_status=400,
                                     error_class="invalid_request", last_byte_at=round(t + 0.0002, 6)))
            continue
        if roll < 0.04:
            out.append(RequestRecord(**kw, status="rejected", http_status=429, error_class="overloaded",
                                     last_byte_at=round(t + 0.0002, 6)))
            continue
        # Load grows through the first hour, so latencies and the bad spell show on the charts.
        load = 1.0 + 0.5 * min(1.0, (t - START) / 3600.0)
        node = rng.choices(list(NODES), weights=(4, 3, 2))[0]
        attempts: list[AttemptRecord] = []
        start = round(t + 0.0003, 6)
        bad_spell = START + 3000 < t < START + 4200
        if node == "gpu-c" and bad_spell and rng.random() < 0.7:
            end = round(start + rng.uniform(0.05, 0.4), 6)
            attempts.append(AttemptRecord(1, node, model, started_at=start, ended_at=end, outcome="retryable",
                                          http_status=503, error_class="upstream_status"))
            node, start = "gpu-a", round(end + rng.uniform(0.01, 0.2), 6)
        speed = NODES[node][2] * load
        ttft = rng.lognormvariate(-2.0, 0.5) * speed
        completion = rng.randint(16, 256)
        decode = completion * rng.uniform(0.005, 0.009) * speed
        first, last = round(start + ttft, 6), round(start + ttft + decode, 6)
        status, http_status, outcome, error = "ok", 200, "ok", None
        if rng.random() < 0.02:
            last = round(first + decode * rng.uniform(0.1, 0.5), 6)
            status, http_status, outcome, error = "client_closed", 499, "client_closed", "client_closed"
            completion = None
        elif node == "gpu-c" and bad_spell and rng.random() < 0.3:
            status, http_status, outcome, error = "upstream_error_midstream", 200, "midstream_error", "protocol_error"
        attempts.append(AttemptRecord(len(attempts) + 1, node, model, started_at=start, ended_at=last,
                                      outcome=outcome, http_status=200, error_class=error, first_byte_at=first))
        out.append(RequestRecord(
            **kw, node=node, status=status, http_status=http_status, error_class=error,
            routed_at=round(t + 0.0002, 6), first_byte_at=first, last_byte_at=last,
            prompt_tokens=kw["prompt_tokens_est"] - rng.randint(0, 20), completion_tokens=completion,
            attempts=attempts))
    return out


def seed(engine: Engine, n: int = 1440) -> list[RequestRecord]:
    recs = records(n)
    with engine.begin() as conn:
        upsert_records(conn, recs)
    return recs


def settle_partitions(engine: Engine) -> None:
    """On a partitioned PostgreSQL ``requests``, make the seeded day's partitions (and the days the
    gateway's maintenance makes ahead of an injected clock at :data:`END`) before a gateway starts:
    otherwise its first maintenance round moves the seeded rows out of the default partition while
    the autoscaler's first round reads them, and that round may see no history at all."""
    with engine.begin() as conn:
        if is_partitioned(conn):
            ensure_days(conn, day_of(START), day_of(END) + timedelta(days=AHEAD_DAYS))


async def autoscale_rounds(runner: Any, clock: ManualClock) -> None:
    """Play the autoscaler's :data:`ROUNDS` rounds over the seeded history: ``clock`` (the app's)
    starts at :data:`AUTOSCALE_FROM`, where the gateway's loop runs the first round as it starts;
    this waits for that one (bounded), then advances ``clock`` and runs the others."""
    for _ in range(1000):
        if runner.last_round or runner.failed_rounds:
            break
        await asyncio.sleep(0.01)
    assert runner.rounds == 1 and runner.failed_rounds == 0, (runner.rounds, runner.last_error)
    for _ in range(ROUNDS - 1):
        clock.advance(ROUND_S)
        await runner.run_once()
    assert clock.time() == END and runner.rounds == ROUNDS
