"""The audit router over HTTP (SQLite; both databases are covered by tests/store)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.engine import Engine

from inferlb.api.audit import router
from inferlb.config.settings import SLOConfig
from inferlb.errors import ClientError
from inferlb.store import StoreHandle
from inferlb.store.db import make_engine, upgrade
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.store.rows import upsert_records
from inferlb.store.writer import AuditWriter
from inferlb.types import ManualClock

T0 = 1_767_225_600.0


def _record(i: int, **kw: Any) -> RequestRecord:
    t = T0 + i
    fields: dict[str, Any] = {
        "request_id": f"req-{i:03d}", "received_at": t, "endpoint": "chat", "model_requested": "llama",
        "model_served": "llama", "tenant": "acme", "node": "gpu-a", "status": "ok", "http_status": 200,
        "first_byte_at": t + 0.1, "last_byte_at": t + 0.5,
        "attempts": [
            AttemptRecord(1, "gpu-a", "llama", started_at=t + 0.001, ended_at=t + 0.5, outcome="ok"),
        ],
    }
    fields.update(kw)
    return RequestRecord(**fields)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'api.db'}"
    upgrade(url)
    eng = make_engine(url)
    with eng.begin() as conn:
        upsert_records(conn, [_record(i) for i in range(7)] + [_record(7, model_requested="qwen",
                                                                       status="upstream_error")])
    yield eng
    eng.dispose()


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    app.state.store = StoreHandle(engine=engine, slos=[SLOConfig(model="*", e2e_max_s=1.0)])
    app.include_router(router)

    @app.exception_handler(ClientError)
    async def _client_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ClientError)
        return JSONResponse(exc.envelope(), status_code=exc.status)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        yield c


def _assert_envelope(resp: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == param
    return dict(body["error"])


async def test_pages_follow_next_cursor(client: httpx.AsyncClient) -> None:
    seen: list[str] = []
    params: dict[str, Any] = {"limit": 3}
    while True:
        body = (await client.get("/audit/requests", params=params)).json()
        seen += [r["request_id"] for r in body["data"]]
        if body["next_cursor"] is None:
            break
        params["cursor"] = body["next_cursor"]
    assert seen == [f"req-{i:03d}" for i in range(7, -1, -1)]


async def test_filters_and_time_formats(client: httpx.AsyncClient) -> None:
    r = await client.get("/audit/requests", params={"model": "qwen"})
    assert [x["request_id"] for x in r.json()["data"]] == ["req-007"]
    r = await client.get("/audit/requests", params={"status": "ok", "since": "2026-01-01T00:00:05Z"})
    assert [x["request_id"] for x in r.json()["data"]] == ["req-006", "req-005"]
    window = {"since": str(T0 + 1), "until": str(T0 + 3), "tenant": "acme"}
    r = await client.get("/audit/requests", params=window)
    assert [x["request_id"] for x in r.json()["data"]] == ["req-002", "req-001"]
    assert r.json()["next_cursor"] is None


@pytest.mark.parametrize(("params", "param"), [
    ({"cursor": "garbage"}, "cursor"),
    ({"since": "last week"}, "since"),
    ({"until": "1e999"}, "until"),
    ({"since": "100", "until": "50"}, "since"),
    ({"limit": "abc"}, "limit"),
    ({"limit": "0"}, "limit"),
    ({"limit": "1001"}, "limit"),
    ({"model": "a\x00b"}, "model"),
])
async def test_bad_input_is_a_400_envelope(
    client: httpx.AsyncClient, params: dict[str, str], param: str
) -> None:
    _assert_envelope(await client.get("/audit/requests", params=params), 400, param)


async def test_one_request_and_unknown_id(client: httpx.AsyncClient) -> None:
    r = await client.get("/audit/requests/req-003")
    assert r.status_code == 200
    body = r.json()
    assert body["request_id"] == "req-003" and body["received_at"] == T0 + 3
    assert [a["node"] for a in body["attempts"]] == ["gpu-a"]
    err = _assert_envelope(await client.get("/audit/requests/nope"), 404, "request_id")
    assert err["code"] == "request_not_found"


async def test_sla_report(client: httpx.AsyncClient) -> None:
    data = (await client.get("/reports/sla", params={"group_by": "model"})).json()["data"]
    assert [(r["model"], r["count"], r["errors"]) for r in data] == [("llama", 7, 0), ("qwen", 1, 1)]
    assert data[0]["e2e_p50_ms"] == 500.0 and data[0]["slo_attainment"] == 1.0
    since = "2026-01-01T00:00:06Z"
    node = (await client.get("/reports/sla", params={"group_by": "node", "since": since})).json()
    assert [(r["node"], r["count"]) for r in node["data"]] == [("gpu-a", 2)]
    _assert_envelope(await client.get("/reports/sla", params={"group_by": "zone"}), 400, "group_by")


async def test_records_from_the_writer_are_served(engine: Engine, client: httpx.AsyncClient,
                                                  tmp_path: Path) -> None:
    writer = AuditWriter(engine, journal_dir=tmp_path / "j", clock=ManualClock())
    await writer.start(background=False)
    writer.submit(_record(50, request_id="fresh-1"))
    await writer.flush_once()
    await writer.close()
    r = await client.get("/audit/requests/fresh-1")
    assert r.status_code == 200 and r.json()["received_at"] == T0 + 50
