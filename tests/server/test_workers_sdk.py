"""``inferlb serve --workers 2`` as its users drive it: the OpenAI Python SDK, auth on, streamed
and not, bad input, across both workers, then a restart on the same database.

Checked over real processes (the supervisor, its two workers, a simulated fleet over HTTP):

1. every SDK call succeeds, streamed or not, on fresh connections (so both workers serve some:
   each worker's write-ahead log shows requests started), with the answer's usage;
2. a wrong key is the SDK's ``AuthenticationError`` (401, the OpenAI error envelope); a bad
   request its ``BadRequestError`` (400), whichever worker took it;
3. SIGTERM drains both and the supervisor exits 0; every successful call has its audit row
   (``ok``), whichever worker served it; the bad requests have theirs (``rejected_invalid``);
4. started again on the same database, the gateway serves the same key at once.

Every wait is a poll for a condition with a bound (a hang guard), never a sleep for time to pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from openai import AsyncOpenAI

from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import NodeSpec
from tests.server.test_workers import Gateway, _started_in, supervisor

CALLS = 12           # per kind (non-stream, stream)


def _fleet(tmp: Path, urls: dict[str, str]) -> Path:
    fleet = {
        "models": [{"name": "m", "max_output_tokens": 256, "default_max_tokens": 8}],
        "nodes": [{"name": n, "url": u, "models": ["m"], "max_concurrency": 16} for n, u in urls.items()],
        "routing": {"profile": "token-aware", "seed": 1},
        "timeouts": {"connect_s": 2.0, "first_token_s": 10.0, "idle_s": 10.0, "total_s": 60.0},
        "health": {"interval_s": 30},
    }
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    return path


def _client(gw: Gateway, key: str) -> AsyncOpenAI:
    # a client (so a connection) per call: the kernel hands each to either worker
    return AsyncOpenAI(base_url=gw.base + "/v1", api_key=key, max_retries=0, timeout=30,
                       http_client=httpx.AsyncClient(timeout=30))


async def _calls(gw: Gateway) -> list[str]:
    """The SDK's calls, streamed and not; returns the request ids of the successful ones."""
    ids: list[str] = []
    for i in range(CALLS):
        async with _client(gw, gw.keys["any"]) as c:
            raw = await c.chat.completions.with_raw_response.create(
                model="m", max_tokens=6, messages=[{"role": "user", "content": f"hello {i}"}])
            done = raw.parse()
            assert done.choices[0].message.content and done.usage is not None
            assert done.usage.completion_tokens >= 1
            ids.append(raw.headers["x-request-id"])
    for i in range(CALLS):
        async with _client(gw, gw.keys["any"]) as c:
            stream = await c.chat.completions.with_raw_response.create(
                model="m", max_tokens=6, stream=True, stream_options={"include_usage": True},
                messages=[{"role": "user", "content": f"stream {i}"}])
            text, usage = "", None
            async for chunk in stream.parse():
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                if chunk.usage is not None:
                    usage = chunk.usage
            assert text and usage is not None and usage.completion_tokens >= 1
            ids.append(stream.headers["x-request-id"])
    return ids


async def _refusals(gw: Gateway) -> None:
    for _ in range(4):
        async with _client(gw, "sk-not-a-key") as c:
            with pytest.raises(openai.AuthenticationError) as auth:
                await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert auth.value.status_code == 401
        body = auth.value.body
        assert isinstance(body, dict) and body.get("type") and body.get("message"), body
        async with _client(gw, gw.keys["any"]) as c:
            with pytest.raises(openai.BadRequestError) as bad:
                await c.chat.completions.create(model="m", max_tokens=-3,
                                                messages=[{"role": "user", "content": "hi"}])
        assert bad.value.status_code == 400


def _statuses(db: Path, ids: list[str]) -> dict[str, str]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        marks = ",".join("?" * len(ids))
        rows = conn.execute(f"SELECT request_id, status FROM requests WHERE request_id IN ({marks})", ids)
        return {str(r): str(s) for r, s in rows}


async def test_the_openai_sdk_through_two_workers_auth_on_streamed_and_not_and_a_restart(tmp_path: Path) -> None:
    specs = [NodeSpec(name=f"n{i}", models=["m"], base_ttft_s=0.005, tpot_s=0.002) for i in range(2)]
    async with SimFleet(specs) as sim:
        fleet = _fleet(tmp_path, {n: node.url for n, node in sim.nodes.items()})
        async with supervisor(tmp_path, fleet) as gw:
            ids = await _calls(gw)
            await _refusals(gw)
            started = _started_in(tmp_path / "journal")
            assert all(started[i] > 0 for i in (0, 1)), started      # both workers served some
            gw.proc.send_signal(signal.SIGTERM)                  # both drain
            assert await asyncio.wait_for(gw.proc.wait(), 60) == 0, gw.log.read_text()
        assert len(set(ids)) == 2 * CALLS
        rows = await asyncio.to_thread(_statuses, tmp_path / "audit.db", ids)
        assert rows == {rid: "ok" for rid in ids}, rows
        with contextlib.closing(sqlite3.connect(tmp_path / "audit.db")) as conn:
            refused = dict(conn.execute("SELECT status, COUNT(*) FROM requests WHERE status <> 'ok' "
                                        "GROUP BY status").fetchall())
        # the 400s left their rows; a wrong key leaves none (anyone could fill the table with them)
        assert refused == {"rejected_invalid": 4}, refused
        # The same database again: the key created before the restart still serves.
        async with supervisor(tmp_path, fleet) as again:
            async with _client(again, gw.keys["any"]) as c:
                done = await c.chat.completions.create(model="m", max_tokens=4,
                                                       messages=[{"role": "user", "content": "again"}])
            assert done.choices[0].message.content
