"""Audit queries on both databases: keyset pages, filters, one request, the SLA report's numbers."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from inferlb.config.settings import SLOConfig
from inferlb.errors import InvalidRequest
from inferlb.store.queries import get_request, list_requests
from inferlb.store.records import RequestRecord
from inferlb.store.report_params import parse_time
from inferlb.store.rows import upsert_records
from inferlb.store.sla import percentile, sla_report, sla_report_python

MakeRecord = Callable[..., RequestRecord]
T0 = 1_767_225_600.0


def _seed(engine: Engine, records: Iterable[RequestRecord]) -> None:
    with engine.begin() as conn:
        upsert_records(conn, list(records))


def _all_pages(engine: Engine, limit: int, **filters: Any) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        rows, cursor = list_requests(engine, limit=limit, cursor=cursor, **filters)
        pages.append([r["request_id"] for r in rows])
        if cursor is None:
            return pages


def test_keyset_pages_have_no_duplicates_or_gaps(engine: Engine, make_record: MakeRecord) -> None:
    # Three requests share each received_at: the request_id tie-break must order them.
    recs = [make_record(i, received_at=T0 + i // 3) for i in range(25)]
    _seed(engine, recs)
    expected = [r.request_id for r in sorted(recs, key=lambda r: (r.received_at, r.request_id), reverse=True)]
    pages = _all_pages(engine, 4)
    assert [len(p) for p in pages] == [4, 4, 4, 4, 4, 4, 1]
    assert list(itertools.chain(*pages)) == expected
    exact = _all_pages(engine, 5)  # a last full page: no empty page after it
    assert list(itertools.chain(*exact)) == expected and len(exact) == 5


def test_new_rows_do_not_shift_later_pages(engine: Engine, make_record: MakeRecord) -> None:
    _seed(engine, [make_record(i) for i in range(10)])
    first, cursor = list_requests(engine, limit=4)
    _seed(engine, [make_record(100)])  # newer than everything: lands before page one
    second, _ = list_requests(engine, limit=4, cursor=cursor)
    assert [r["request_id"] for r in first] == ["req-00009", "req-00008", "req-00007", "req-00006"]
    assert [r["request_id"] for r in second] == ["req-00005", "req-00004", "req-00003", "req-00002"]


def test_filters(engine: Engine, make_record: MakeRecord) -> None:
    _seed(engine, [
        make_record(0),
        make_record(1, model_requested="mix", model_served="llama-8b", node="gpu-b"),
        make_record(2, model_requested="qwen", model_served="qwen", status="upstream_error", tenant="zeta"),
        make_record(3, tenant=None, node=None, status="rejected"),
    ])

    def ids(**f: Any) -> list[str]:
        return [r["request_id"] for r in list_requests(engine, **f)[0]]

    assert ids(model="llama-8b") == ["req-00003", "req-00001", "req-00000"]  # requested or served
    assert ids(model="mix") == ["req-00001"]
    assert ids(node="gpu-b") == ["req-00001"]
    assert ids(status="upstream_error") == ["req-00002"]
    assert ids(tenant="zeta") == ["req-00002"]
    assert ids(status="rejected", model="llama-8b") == ["req-00003"]
    # since inclusive, until exclusive, at µs precision
    assert ids(since=T0 + 1.123457, until=T0 + 3.123457) == ["req-00002", "req-00001"]
    assert ids(since=T0 + 1.123458) == ["req-00003", "req-00002"]
    rows, _ = list_requests(engine, status="upstream_error")
    assert rows[0]["received_at"] == T0 + 2.123457 and "attempts" not in rows[0]


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"limit": 0}, "limit"),
    ({"limit": 1001}, "limit"),
    ({"cursor": "not-a-cursor!"}, "cursor"),
    ({"cursor": base64.urlsafe_b64encode(b"[1, 2]").decode()}, "cursor"),
    ({"cursor": base64.urlsafe_b64encode(b'{"v": 2, "r": 1, "i": "x"}').decode()}, "cursor"),
    ({"cursor": base64.urlsafe_b64encode(b'{"v": 1, "r": 1e99, "i": "x"}').decode()}, "cursor"),
    ({"since": 10.0, "until": 5.0}, "since"),
    ({"model": "a\x00b"}, "model"),
    ({"tenant": "x" * 600}, "tenant"),
])
def test_bad_filters_raise_invalid_request(engine: Engine, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        list_requests(engine, **kwargs)
    assert err.value.param == param and err.value.status == 400


def test_get_request(engine: Engine, make_record: MakeRecord) -> None:
    _seed(engine, [make_record(1)])
    got = get_request(engine, "req-00001")
    assert got is not None
    assert [a["number"] for a in got["attempts"]] == [1, 2]
    assert got["attempts"][0]["http_status"] == 503 and got["attempts"][1]["first_byte_at"] == T0 + 1.273458
    assert get_request(engine, "req-missing") is None
    assert get_request(engine, "bad\x00id") is None


def test_parse_time() -> None:
    assert parse_time("1767225600.25", param="since") == 1_767_225_600.25
    assert parse_time("2026-01-01T00:00:00Z", param="since") == T0
    assert parse_time("2026-01-01T01:00:00+01:00", param="since") == T0
    assert parse_time("2026-01-01 00:00:00", param="since") == T0  # naive means UTC
    assert parse_time("15m", param="since", now=T0) == T0 - 900
    assert parse_time("2d", param="since", now=T0) == T0 - 172_800
    assert parse_time(None, param="since") is None and parse_time("", param="since") is None
    for bad in ("yesterday", "1e400", "-5", "nan", "99999999999999"):
        with pytest.raises(InvalidRequest) as err:
            parse_time(bad, param="until")
        assert err.value.param == "until"


def test_percentile_is_linear_between_ranks() -> None:
    values = [float(v) for v in range(100, 1001, 100)]
    assert percentile(values, 0.5) == 550 and percentile(values, 0.95) == pytest.approx(955)
    assert percentile([7.0], 0.99) == 7.0 and percentile([], 0.5) is None


def _timed(make_record: MakeRecord, i: int, e2e_ms: float, ttft_ms: float, **kw: Any) -> RequestRecord:
    t = T0 + i
    return make_record(i, received_at=t, first_byte_at=round(t + ttft_ms / 1000, 6),
                       last_byte_at=round(t + e2e_ms / 1000, 6), **kw)


def _seed_sla(engine: Engine, make_record: MakeRecord) -> None:
    recs = [_timed(make_record, i, 100.0 * (i + 1), 10.0 * (i + 1), model_requested="m1", node="a",
                   tenant="t1") for i in range(10)]
    recs += [_timed(make_record, 10 + i, 30, 5, model_requested="m1", node="b", tenant="t1",
                    status="upstream_error") for i in range(2)]
    recs.append(_timed(make_record, 12, 1, 1, model_requested="m1", node=None, tenant="t2",
                       status="rejected_invalid"))
    # t2 over its own limits: refused by admission, neither errors nor SLO misses
    recs += [_timed(make_record, 13 + i, 1, 1, model_requested="m1", node=None, tenant="t2", status=status,
                    http_status=429) for i, status in enumerate(("rejected_rate_limit", "rejected_rate_limit",
                                                                  "rejected_quota"))]
    recs += [_timed(make_record, 20 + i, e2e, ttft, model_requested="m2", node="b", tenant=None)
             for i, (e2e, ttft) in enumerate([(50, 10), (50, 10), (50, 10), (5000, 30)])]
    recs.append(_timed(make_record, 30, 2, 2, model_requested="m2", node=None, tenant=None,
                       status="rejected"))
    _seed(engine, recs)


SLOS = [
    SLOConfig(model="m1", e2e_max_s=0.6, e2e_p95_s=1.0),
    SLOConfig(model="*", ttft_max_s=0.02),
]


def test_sla_report_by_model(engine: Engine, make_record: MakeRecord) -> None:
    _seed_sla(engine, make_record)
    m1, m2 = sla_report(engine, group_by="model", slos=SLOS)
    assert m1 == {
        "model": "m1", "count": 16, "ok": 10, "errors": 2, "client_errors": 1,
        "rejected": 3, "rejected_share": 0.2, "admitted": 12,   # 3 of the 15 well-formed requests
        "error_rate": round(2 / 12, 6),
        "e2e_p50_ms": 550.0, "e2e_p95_ms": 955.0, "e2e_p99_ms": 991.0,
        "ttft_p50_ms": 55.0, "ttft_p95_ms": 95.5, "ttft_p99_ms": 99.1, "ttft_count": 10,
        "slo_attainment": 0.5,  # 6 of the 12 admitted requests finished within 600 ms
        "slo_p95_met": True,
    }
    # a generic "rejected" (admission's fallback 503) is the service's failure: an error, in the SLO
    assert m2["count"] == 5 and m2["errors"] == 1 and m2["error_rate"] == 0.2
    assert m2["rejected"] == 0 and m2["rejected_share"] == 0.0 and m2["admitted"] == 5
    assert (m2["e2e_p50_ms"], m2["e2e_p95_ms"], m2["e2e_p99_ms"]) == (50.0, 4257.5, 4851.5)
    assert m2["slo_attainment"] == 0.6  # '*' SLO: 3 ok within 20 ms TTFT out of 5
    assert m2["slo_p95_met"] is None    # '*' sets no p95 target


def test_sla_report_by_node_and_tenant_and_window(engine: Engine, make_record: MakeRecord) -> None:
    _seed_sla(engine, make_record)
    by_node = {r["node"]: r for r in sla_report(engine, group_by="node", slos=SLOS)}
    assert list(by_node) == ["a", "b", None]
    assert by_node["a"]["count"] == 10 and by_node["a"]["slo_attainment"] == 0.6  # 6 of 10 within m1 SLO
    # node b: 2 m1 errors (m1 SLO) + 4 m2 ok (3 within the '*' TTFT SLO)
    assert by_node["b"]["count"] == 6 and by_node["b"]["slo_attainment"] == 0.5
    by_tenant = {r["tenant"]: r for r in sla_report(engine, group_by="tenant", slos=SLOS)}
    assert list(by_tenant) == ["t1", "t2", None]
    t2 = by_tenant["t2"]   # one invalid request and three refused by its limits: nothing admitted
    assert (t2["count"], t2["rejected"], t2["rejected_share"], t2["admitted"]) == (4, 3, 1.0, 0)
    assert t2["error_rate"] is None and t2["slo_attainment"] is None
    assert all(r["slo_attainment"] is None for r in sla_report(engine, group_by="tenant"))
    window = sla_report(engine, since=T0 + 20, until=T0 + 22, group_by="model")
    assert [(r["model"], r["count"]) for r in window] == [("m2", 2)]
    assert sla_report(engine, since=T0 + 1000) == []
    with pytest.raises(InvalidRequest) as err:
        sla_report(engine, group_by="region")
    assert err.value.param == "group_by"


def test_sla_report_in_the_database_is_its_python_twin(engine: Engine, make_record: MakeRecord) -> None:
    """The SQL tallies (sla_sql.py, PostgreSQL) and the Python ones give one report, limits included."""
    if engine.dialect.name != "postgresql":
        pytest.skip("percentile_cont runs on PostgreSQL only; SQLite is aggregated in Python")
    _seed_sla(engine, make_record)
    for group_by in ("model", "node", "tenant", "none"):
        for bucket in (None, "5s"):
            sql = sla_report(engine, group_by=group_by, bucket=bucket, slos=SLOS, in_database=True)
            assert sql == sla_report_python(engine, group_by=group_by, bucket=bucket, slos=SLOS)
            assert sum(r["rejected"] for r in sql) == 3
