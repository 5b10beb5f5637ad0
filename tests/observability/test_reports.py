"""SLA and cost reports: grouping by model / version / node / tenant / priority and time bucket,
SLO attainment, JSON and CSV over HTTP, and ``inferlb report sla|cost``; SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy.engine import Engine

from inferlb.cli.main import main
from inferlb.errors import InvalidRequest
from inferlb.store.report_params import parse_bucket, parse_group_by
from inferlb.store.sla import sla_report
from tests.observability import seed
from tests.support import running_gateway, settings_for


@pytest.fixture
def seeded(engine: Engine) -> Engine:
    seed.seed(engine, n=360)
    return engine


def test_parameters() -> None:
    assert parse_group_by("model, node") == ("model", "node") and parse_group_by("none") == ()
    assert parse_group_by(None) == ("model",) and parse_group_by((), default="tenant") == ()
    assert parse_bucket("5m") == 300_000_000 and parse_bucket("90") == 90_000_000 and parse_bucket("") is None
    for bad in ("zone", "model,model", "model,node,tenant,priority", ""):
        if bad:
            with pytest.raises(InvalidRequest) as err:
                parse_group_by(bad)
            assert err.value.param == "group_by"
    for bad in ("0s", "5x", "-1m", "400d", "nan"):
        with pytest.raises(InvalidRequest):
            parse_bucket(bad)


def test_sla_by_every_key_and_bucket(seeded: Engine) -> None:
    slos = seed.fleet().slos
    by_version = sla_report(seeded, group_by="model,version", slos=slos)
    assert [(r["model"], r["version"]) for r in by_version] == [("llama-3-8b", "v2"), ("qwen-14b", "v1")]
    assert by_version[0]["slo_p95_met"] is not None   # model groups check the p95 targets
    by_priority = sla_report(seeded, group_by="priority", slos=slos)
    assert [r["priority"] for r in by_priority] == ["batch", "interactive"]
    assert sum(r["count"] for r in by_priority) == 360
    buckets = sla_report(seeded, group_by="none", bucket="30m", since=seed.START, until=seed.END, slos=slos)
    assert [r["bucket"] for r in buckets] == [seed.START + i * 1800 for i in range(4)]
    assert set(buckets[0]) >= {"bucket", "count", "slo_attainment", "e2e_p99_ms"} and "model" not in buckets[0]
    assert sum(r["count"] for r in buckets) == 360
    for r in buckets:
        assert 0 < r["slo_attainment"] <= 1 and r["e2e_p50_ms"] <= r["e2e_p95_ms"] <= r["e2e_p99_ms"]
    per_node = sla_report(seeded, group_by="node", bucket="1h", slos=slos)
    assert {(r["bucket"], r["node"]) for r in per_node} >= {(seed.START, "gpu-a"), (seed.START + 3600, "gpu-c")}
    # the bad spell on gpu-c (minutes 50-70) shows as errors
    gpu_c = {r["bucket"]: r for r in per_node if r["node"] == "gpu-c"}
    assert sum(r["errors"] for r in gpu_c.values()) > 0
    with pytest.raises(InvalidRequest) as err:
        sla_report(seeded, bucket="1s", since=seed.START, until=seed.START + 3 * 3600)   # 10,800 buckets: too many
    assert err.value.param == "bucket"


async def test_reports_over_http_json_and_csv(seeded: Engine, db_url: str, tmp_path: Path) -> None:
    settings = settings_for(tmp_path, seed.fleet(), database_url=db_url)
    window = {"since": "2026-01-01T00:00:00Z", "until": "2026-01-01T02:00:00Z"}
    async with running_gateway(settings) as (base, _app), httpx.AsyncClient(base_url=base) as http:
        sla = await http.get("/reports/sla", params={**window, "group_by": "tenant,priority", "bucket": "1h",
                                                     "format": "csv"})
        assert sla.status_code == 200 and sla.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(sla.text)))
        assert list(rows[0])[:3] == ["bucket", "tenant", "priority"]
        assert rows[0]["bucket"] == "2026-01-01T00:00:00Z" and sum(int(r["count"]) for r in rows) == 360
        cost = (await http.get("/reports/cost", params={**window, "group_by": "model"})).json()
        assert {r["model"] for r in cost["data"]} == {"llama-3-8b", "qwen-14b", "(idle)"}
        assert cost["summary"]["currency"] == "USD" and cost["summary"]["unpriced_nodes"] == []
        # each node from its first attempt (within the first minutes) to the end of the 2 hours
        attempts = [a for r in seed.records(n=360) for a in r.attempts]
        first = {n: min(a.started_at for a in attempts if a.node == n) for n in seed.NODES}
        assert cost["summary"]["first_seen"] == pytest.approx(first)
        assert cost["summary"]["provisioned_cost"] == pytest.approx(
            sum(price * (seed.END - first[n]) / 3600 for n, (_, price, _) in seed.NODES.items()))
        cost_csv = await http.get("/reports/cost", params={**window, "group_by": "tenant", "format": "csv"})
        crow = list(csv.DictReader(io.StringIO(cost_csv.text)))
        assert [r["kind"] for r in crow][-1] == "idle" and crow[-1]["cost_per_request"] == ""
        assert sum(float(r["cost"]) for r in crow) == pytest.approx(cost["summary"]["provisioned_cost"], rel=1e-6)
        for path, params in (("/reports/cost", {"format": "xml"}), ("/reports/sla", {"bucket": "fortnight"}),
                             ("/reports/cost", {"group_by": "region"}), ("/reports/sla", {"since": "yesterday"})):
            bad = await http.get(path, params=params)
            assert bad.status_code == 400, (path, params, bad.text)
            assert bad.json()["error"]["param"] in ("format", "bucket", "group_by", "since")


def test_cli_report_cost_and_sla(seeded: Engine, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                 ) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(yaml.safe_dump(seed.fleet().model_dump(mode="json")))
    out_csv = tmp_path / "cost.csv"
    common = ["--database-url", db_url, "--config", str(cfg), "--since", "2026-01-01T00:00:00Z",
              "--until", "2026-01-01T02:00:00Z"]
    assert main(["report", "cost", *common, "--group-by", "tenant,node", "--csv", str(out_csv)]) == 0
    table = capsys.readouterr().out
    assert "Cost report by tenant, node (USD)" in table and "idle" in table and "utilization" in table
    rows = list(csv.DictReader(out_csv.open()))
    assert {r["tenant"] for r in rows} == {*seed.TENANTS, "(idle)"} and "cost_per_1k_tokens" in rows[0]
    assert main(["report", "sla", *common, "--group-by", "model", "--bucket", "1h", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert len(data) == 4 and {d["model"] for d in data} == {"llama-3-8b", "qwen-14b"}
    assert main(["report", "sla", *common, "--group-by", "region"]) == 2
    assert "group_by" in capsys.readouterr().err


def test_ttft_percentiles_count_streamed_requests_only_and_group_by_stream(engine: Engine) -> None:
    # A non-streamed answer's first byte comes with its last: its "TTFT" is the whole generation
    # (3 s here) and must not enter the TTFT percentiles, nor fail a TTFT SLO.
    from inferlb.config.settings import SLOConfig
    from inferlb.store.ledger import cost_report
    from inferlb.store.rows import upsert_records
    from tests.store.conftest import T0, _record

    recs = []
    for i in range(20):
        t = T0 + i + 0.123457
        streamed = i % 2 == 0
        first = t + (0.1 if streamed else 3.0)
        recs.append(_record(i, stream=streamed, first_byte_at=round(first, 6), last_byte_at=round(t + 3.0, 6),
                            attempts=[]))
    with engine.begin() as conn:
        upsert_records(conn, recs)
    slos = [SLOConfig(model="*", ttft_max_s=0.5, e2e_max_s=5.0)]
    (row,) = sla_report(engine, group_by="model", slos=slos)
    assert row["count"] == 20 and row["ttft_count"] == 10
    assert row["ttft_p99_ms"] == pytest.approx(100.0, abs=1.0)       # streamed only: 100 ms, not 3 s
    assert row["e2e_p50_ms"] == pytest.approx(3000.0, abs=1.0)
    assert row["slo_attainment"] == 1.0                              # the TTFT target is for streams
    by_stream = sla_report(engine, group_by="stream", slos=slos)
    assert [(r["stream"], r["count"], r["ttft_count"]) for r in by_stream] == [(False, 10, 0), (True, 10, 10)]
    assert by_stream[0]["ttft_p50_ms"] is None and by_stream[1]["ttft_p50_ms"] == pytest.approx(100.0, abs=1.0)
    cost = cost_report(engine, prices={"gpu-a": 3.6}, group_by="stream", until=T0 + 30)   # same keys for cost
    assert [(r["stream"], r["requests"]) for r in cost["data"] if r["kind"] == "usage"] == [(False, 10), (True, 10)]
