"""What the audit path costs per request: the write-ahead log and the database upsert.

``python -m benchmarks.audit [--records N] [--concurrency C] [--commit-interval-ms MS] [--linger-ms MS]
[--node-ms MS]``

Prints, for the write-ahead log (``begin`` + ``submit`` per request, as the gateway does, with
concurrent requests; the database is not written in this phase): the ``begin`` latency (p50, p99),
the process CPU time per record, fsyncs per second and records per fsync. Then, for the database:
the CPU time (and wall time) per record of :func:`~inferlb.store.rows.upsert_records` on SQLite in
batches of ``--batch`` (what the writer's database thread does), for new rows and for rows that
exist. The records are shaped like the gateway's (``_record``: its routing decision, path and
versions), so the JSON columns cost what they cost in ``benchmarks.request_profile``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from inferlb.store.db import make_engine, upgrade
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.store.rows import upsert_records
from inferlb.store.writer import AuditWriter

__all__ = ["main"]


def _decision(nodes: int = 3) -> dict[str, Any]:
    """A routing decision shaped like the gateway's (``token-aware`` over ``nodes`` nodes, as the
    request profile's gateway writes it into every row)."""
    names = [f"gpu-{k}" for k in range(nodes)]
    scores = {n: {"outstanding-tokens": 0.9832, "queue-depth": 0.2, "kv-cache": 0.5, "decode-speed": 0.9913,
                  "total": 0.7748} for n in names}
    return {"profile": "token-aware", "offered": nodes, "sampled": None, "candidates": names,
            "candidates_total": nodes, "eliminated": [], "eliminated_counts": {}, "scores": scores,
            "ranked": names, "ranked_total": nodes, "picker": "max-score", "pick": names[0]}


def _record(i: int) -> RequestRecord:
    """One finished request as the gateway records it (the fields and JSON sizes of a row that
    ``benchmarks.request_profile``'s gateway writes: a ~570-byte decision, the same in ``decisions``)."""
    t = 1_767_225_600.0 + i * 0.001
    decision = _decision()
    return RequestRecord(
        request_id=f"bench-{i:08d}", received_at=t, endpoint="chat", model_requested="llama-8b", tenant="acme",
        model_served="llama-8b", node="gpu-0", priority="interactive", stream=True, status="ok", http_status=200,
        admitted_at=t + 0.0001, routed_at=t + 0.0002, first_byte_at=t + 0.05, last_byte_at=t + 0.5,
        prompt_tokens_est=120, prompt_tokens=118, completion_tokens=64, cost_est=0.0001,
        decision=decision, decisions=[{"attempt": 1, "model": "llama-8b", **decision}],
        workflow_path=["start", "evaluate", "gw_valid", "gw_admit_merge", "admit", "gw_admitted", "gw_route_merge",
                       "route", "gw_routed", "dispatch", "gw_outcome", "record", "end"], tags={"ab": "x"},
        deadline_at=t + 60, engine="compiled", process_version="a998b94e2eb0", config_version="be1026ec3781",
        attempts=[AttemptRecord(number=1, node="gpu-0", model="llama-8b", started_at=t + 0.0003,
                                ended_at=t + 0.5, outcome="ok", http_status=200, first_byte_at=t + 0.05)])


async def _wal_phase(tmp: Path, records: int, concurrency: int, commit_interval_s: float, linger_s: float = 0.0,
                     node_s: float = 0.0) -> None:
    upgrade(f"sqlite:///{tmp / 'wal.db'}")
    engine = make_engine(f"sqlite:///{tmp / 'wal.db'}")
    # An hour-long flush interval: this phase measures the write-ahead log alone.
    w = AuditWriter(engine, journal_dir=tmp / "journal", flush_interval_s=3600,
                    wal_commit_interval_s=commit_interval_s, wal_commit_linger_s=linger_s,
                    max_records=records * 2)
    await w.start()
    latencies: list[float] = []
    per_worker = records // concurrency
    recs = [_record(i) for i in range(per_worker * concurrency)]   # built before the clock starts

    async def worker(k: int) -> None:
        for j in range(per_worker):
            rec = recs[k * per_worker + j]
            if node_s > 0:
                # As the gateway does: the start entry is queued, the node works, and the entry is
                # awaited before the answer's first byte (what waits then is the latency below).
                durable = w.journal_start(rec)
                await asyncio.sleep(node_s)
                t0 = time.perf_counter()
                if durable is not None:
                    await durable
            else:
                t0 = time.perf_counter()
                await w.begin(rec)
            latencies.append(time.perf_counter() - t0)
            w.submit(rec)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    fs0 = w._wal.stats()["fsyncs"]
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    await w._commit_wal()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    fsyncs = w._wal.stats()["fsyncs"] - fs0
    n = per_worker * concurrency
    q = statistics.quantiles(latencies, n=100)
    print(f"write-ahead log: {n} requests, concurrency {concurrency}, commit interval "
          f"{commit_interval_s * 1000:g} ms, linger {linger_s * 1000:g} ms, node time {node_s * 1000:g} ms")
    print(f"  {'start entry wait after the node' if node_s > 0 else 'begin latency'} p50 {q[49] * 1e6:.0f} µs, "
          f"p99 {q[98] * 1e6:.0f} µs")
    print(f"  CPU {cpu / n * 1e6:.1f} µs/record (start + finished entry), wall {wall / n * 1e6:.1f} µs/record")
    print(f"  {fsyncs / wall:.0f} fsyncs/s, {2 * n / max(1, fsyncs):.1f} entries per fsync, "
          f"{fsyncs / n:.2f} fsyncs per record")
    await w.close(timeout_s=60)
    engine.dispose()


def _db_phase(tmp: Path, records: int, batch: int) -> None:
    url = f"sqlite:///{tmp / 'db.db'}"
    upgrade(url)
    engine = make_engine(url)
    recs = [_record(i) for i in range(records)]
    with engine.begin() as conn:   # the first batch compiles the statements: not measured
        upsert_records(conn, [_record(-1)])
    for label in ("new rows", "existing rows"):
        t0, c0 = time.perf_counter(), time.thread_time()
        for i in range(0, records, batch):
            with engine.begin() as conn:
                upsert_records(conn, recs[i:i + batch])
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        print(f"database upsert (SQLite, batches of {batch}), {label}: {cpu / records * 1e6:.1f} µs CPU/record "
              f"(wall {wall / records * 1e6:.1f})")
    engine.dispose()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.audit", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--commit-interval-ms", type=float, default=0.0)
    p.add_argument("--linger-ms", type=float, default=0.0, help="wal_commit_linger_s, in ms (the gateway's: 30)")
    p.add_argument("--node-ms", type=float, default=0.0,
                   help="> 0: each request's start entry is awaited only after this long (its node's work), "
                        "as the gateway does; 0: awaited at once (begin)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--dir", type=Path, help="where the journal and databases go (default: a temporary directory)")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        asyncio.run(_wal_phase(Path(d), a.records, a.concurrency, a.commit_interval_ms / 1000, a.linger_ms / 1000,
                               a.node_ms / 1000))
        _db_phase(Path(d), a.records, a.batch)


if __name__ == "__main__":
    main()
