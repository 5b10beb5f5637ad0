"""server/worker_metrics.py on real Unix sockets, three workers' registries in one process: the
answering worker sums counters and histograms, labels gauges by worker, reports a sibling that is
gone (``inferlb_workers_up`` 0, ``inferlb_workers_scrape_errors_total``) instead of failing, and
answers OpenMetrics when asked. Between processes: tests/server/test_workers_shared.py."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from inferlb.server.worker_metrics import WorkerMetrics


def _registry(i: int) -> CollectorRegistry:
    r = CollectorRegistry()
    Counter("t_requests", "requests", ["status"], registry=r).labels("200").inc(10 * (i + 1))
    Histogram("t_latency_seconds", "latency", buckets=[0.1, 1.0], registry=r).observe(0.05 * (i + 1))
    Gauge("t_inflight", "in flight", registry=r).set(i + 1)
    return r


def _samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body.decode()) for s in f.samples}


async def test_the_answering_worker_sums_counters_labels_gauges_and_reports_a_missing_one(tmp_path: Path) -> None:
    regs = [_registry(i) for i in range(3)]
    workers = [WorkerMetrics(i, 3, tmp_path, r.collect, timeout_s=5.0) for i, r in enumerate(regs)]
    for w in workers:
        await w.start()
    try:
        for answering in workers:     # whichever takes the scrape, the same sums
            body, content_type = await answering.exposition(None)
            assert content_type.startswith("text/plain")
            s = _samples(body)
            assert s[("t_requests_total", (("status", "200"),))] == 60
            assert s[("t_latency_seconds_count", ())] == 3
            assert s[("t_latency_seconds_bucket", (("le", "0.1"),))] == 2      # 0.05 and 0.10
            assert abs(s[("t_latency_seconds_sum", ())] - 0.3) < 1e-9
            assert {s[("t_inflight", (("worker", f"w{i}"),))] for i in range(3)} == {1.0, 2.0, 3.0}
            assert all(s[("inferlb_workers_up", (("worker", f"w{i}"),))] == 1 for i in range(3))
            assert not any(name.endswith("_created") for name, _ in s)

        await workers[2].close()      # w2 gone (replaced, or stopped)
        body, _ = await workers[0].exposition(None)
        s = _samples(body)
        assert s[("t_requests_total", (("status", "200"),))] == 30
        assert s[("inferlb_workers_up", (("worker", "w2"),))] == 0
        assert s[("inferlb_workers_scrape_errors_total", (("worker", "w2"),))] == 1
        assert ("t_inflight", (("worker", "w2"),)) not in s

        body, content_type = await workers[1].exposition("application/openmetrics-text; version=1.0.0")
        assert content_type.startswith("application/openmetrics-text")
        fams = {f.name: f for f in om_families(body.decode())}
        assert fams["t_requests"].type == "counter"
        assert [x.value for x in fams["t_requests"].samples if x.name == "t_requests_total"] == [30]
        # w1 saw w2 fail too; w0's earlier failure is in w0's own exposition, summed
        errors = [x.value for x in fams["inferlb_workers_scrape_errors"].samples
                  if x.name == "inferlb_workers_scrape_errors_total" and x.labels["worker"] == "w2"]
        assert errors == [2]
    finally:
        for w in workers:
            await w.close()


async def test_a_worker_not_started_yet_is_down_not_an_error_page(tmp_path: Path) -> None:
    ready = WorkerMetrics(0, 2, tmp_path, _registry(0).collect)
    starting = WorkerMetrics(1, 2, tmp_path, lambda: None)     # its app has no metrics yet
    await ready.start()
    await starting.start()
    try:
        s = _samples((await ready.exposition(None))[0])
        assert s[("inferlb_workers_up", (("worker", "w1"),))] == 0
        assert s[("t_requests_total", (("status", "200"),))] == 10
        # the one not started answers with the others' metrics all the same
        s = _samples((await starting.exposition(None))[0])
        assert s[("inferlb_workers_up", (("worker", "w0"),))] == 1
        assert s[("inferlb_workers_up", (("worker", "w1"),))] == 0
    finally:
        await ready.close()
        await starting.close()


async def test_a_sibling_that_sends_garbage_is_reported_not_a_failed_scrape(tmp_path: Path) -> None:
    import asyncio

    from inferlb.server.worker_metrics import socket_path

    async def garbage(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b'[["x", "counter", "", "", [["x_total", {}, "not a number"]]]')
        w.close()

    server = await asyncio.start_unix_server(garbage, path=str(socket_path(tmp_path, 1)))
    me = WorkerMetrics(0, 2, tmp_path, _registry(0).collect)
    try:
        s = _samples((await me.exposition(None))[0])
        assert s[("inferlb_workers_up", (("worker", "w1"),))] == 0
        assert s[("inferlb_workers_scrape_errors_total", (("worker", "w1"),))] == 1
        assert s[("t_requests_total", (("status", "200"),))] == 10
    finally:
        server.close()
        await server.wait_closed()
