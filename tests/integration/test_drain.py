"""SIGTERM drains (docs/reliability.md B8, C-19): a real ``inferlb serve`` process in front of emulated
nodes, streams in flight, SIGTERM.

Readiness turns 503 ``draining`` while the listener stays open, new inference requests get 503
``server_shutting_down``, the requests in flight finish, every one has its audit row, and the
process exits with status 0 and no traceback. A request whose body the test holds back keeps the
drain open for as long as the test needs it, so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec, NodeSpec
from tests.support import ROOT, free_port

GUARD_S = 60.0      # hang guard only
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@contextlib.asynccontextmanager
async def serve(tmp: Path, urls: dict[str, str], **env: str) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``inferlb serve`` as a subprocess on a loopback port, ready; yields (base URL, process)."""
    fleet = {"models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 8}],
             "nodes": [{"name": n, "url": u, "models": ["m"]} for n, u in urls.items()],
             "routing": {"profile": "round-robin", "seed": 1},
             "timeouts": {"connect_s": 2.0, "first_token_s": 30.0, "idle_s": 60.0, "total_s": 120.0}}
    (tmp / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    port = free_port()
    full_env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                "INFERLB_JOURNAL_DIR": str(tmp / "journal"), "INFERLB_DATABASE_URL": f"sqlite:///{tmp / 'audit.db'}",
                # a free admin port: port + 1 (the default) may be taken on a busy machine
                "INFERLB_ADMIN_PORT": str(free_port()), **env}
    with (tmp / "gateway.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "inferlb.cli.main", "serve", "--config", str(tmp / "fleet.yaml"), "--port", str(port),
            cwd=tmp, env=full_env, stdout=log, stderr=asyncio.subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5) as client:
            for _ in range(600):     # bounded: start-up
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/readyz")).status_code == 200:
                        break
                assert proc.returncode is None, (tmp / "gateway.log").read_text()
                await asyncio.sleep(0.1)
            else:
                pytest.fail("gateway never became ready:\n" + (tmp / "gateway.log").read_text())
        yield base, proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _stream(client: httpx.AsyncClient, started: asyncio.Event, max_tokens: int) -> tuple[int, str, str]:
    """A streamed chat: sets ``started`` at its first chunk; returns (status, request id, body)."""
    async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": max_tokens}) as r:
        chunks = []
        async for chunk in r.aiter_text():
            chunks.append(chunk)
            started.set()
        return r.status_code, r.headers.get("x-request-id", ""), "".join(chunks)


async def _held_request(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A streamed chat whose body the test holds back (``Expect: 100-continue``): returned once the
    gateway has accepted it and waits for the body, so it is in flight until the test sends it."""
    body = json.dumps({**CHAT, "max_tokens": 5}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n" % len(body))
    await writer.drain()
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD_S)
    assert interim.startswith(b"HTTP/1.1 100"), interim
    return reader, writer, body


def _rows(tmp: Path, ids: list[str]) -> dict[str, tuple[str, int | None, int | None]]:
    with contextlib.closing(sqlite3.connect(tmp / "audit.db")) as db:
        marks = ",".join("?" * len(ids))
        got = db.execute(f"SELECT request_id, status, http_status, completion_tokens FROM requests "
                         f"WHERE request_id IN ({marks})", ids).fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in got}


async def test_sigterm_drains_streams_then_exits_0(tmp_path: Path) -> None:
    specs = [NodeSpec(name=f"n{i}", models=["m"], base_ttft_s=0.01, tpot_s=0.05) for i in range(2)]   # 2 s streams
    async with SimFleet(specs) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        async with serve(tmp_path, urls, INFERLB_DRAIN_TIMEOUT_S="60", INFERLB_HTTP_BODY_TIMEOUT_S="120") \
                as (base, proc), httpx.AsyncClient(base_url=base, timeout=GUARD_S) as client:
            port = int(base.rsplit(":", 1)[1])
            started = [asyncio.Event() for _ in range(3)]
            streams = [asyncio.create_task(_stream(client, ev, 40)) for ev in started]
            await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), GUARD_S)
            reader, writer, rest = await _held_request(port)

            proc.send_signal(signal.SIGTERM)

            # Readiness turns false while the listener still answers (the held request keeps the drain open).
            seen: list[int] = []
            for _ in range(600):     # bounded
                r = await client.get("/readyz")
                seen.append(r.status_code)
                if r.status_code == 503:
                    break
                await asyncio.sleep(0.05)
            assert seen[-1] == 503 and r.json()["reasons"] == ["draining"], seen
            health = await client.get("/health")
            assert health.status_code == 503 and health.json()["reasons"] == ["draining"]
            assert (await client.get("/healthz")).status_code == 200
            new = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})
            assert new.status_code == 503 and new.json()["error"]["code"] == "server_shutting_down"
            assert new.headers["retry-after"] == "1"

            # The streams in flight at SIGTERM finish normally.
            done = await asyncio.wait_for(asyncio.gather(*streams), GUARD_S)
            for status, rid, text in done:
                assert status == 200 and rid, text
                assert text.rstrip().endswith("data: [DONE]"), text[-300:]
            # So does the held request once its body arrives.
            writer.write(rest)
            await writer.drain()
            raw = await asyncio.wait_for(reader.read(), GUARD_S)
            writer.close()
            head, _, held_body = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), raw[:300]
            assert b"data: [DONE]" in held_body
            held_id = next(ln.split(b":", 1)[1].strip().decode() for ln in head.split(b"\r\n")
                           if ln.lower().startswith(b"x-request-id:"))

            code = await asyncio.wait_for(proc.wait(), GUARD_S)
    log = (tmp_path / "gateway.log").read_text()
    assert code == 0, log
    assert "Traceback" not in log and "Exception in ASGI" not in log, log
    assert "draining: " in log and "drain deadline" not in log, log
    ids = [rid for _, rid, _ in done] + [held_id]
    rows = _rows(tmp_path, ids)
    assert set(rows) == set(ids), (rows, log)
    assert all(status == "ok" and http == 200 for status, http, _ in rows.values()), rows
    assert all(tokens == 40 for rid, (_, _, tokens) in rows.items() if rid != held_id), rows


async def _outliving_stream(tmp: Path) -> tuple[int, str, str, int, str]:
    """A stream that stalls past a 1 s drain deadline: (status, request id, body, exit code, log)."""
    stall = NodeSpec(name="n0", models=["m"], base_ttft_s=0.01, tpot_s=0.01, faults=FaultSpec(stall_after_tokens=3))
    async with SimFleet([stall]) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        async with serve(tmp, urls, INFERLB_DRAIN_TIMEOUT_S="1") as (base, proc), \
                httpx.AsyncClient(base_url=base, timeout=GUARD_S) as client:
            started = asyncio.Event()
            task = asyncio.create_task(_stream(client, started, 50))
            await asyncio.wait_for(started.wait(), GUARD_S)
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(httpx.TransportError):   # the gateway may cut the connection
                status, rid, text = await asyncio.wait_for(task, GUARD_S)
                code = await asyncio.wait_for(proc.wait(), GUARD_S)
                return status, rid, text, code, (tmp / "gateway.log").read_text()
            code = await asyncio.wait_for(proc.wait(), GUARD_S)
            return 0, "", "", code, (tmp / "gateway.log").read_text()


async def test_stream_outliving_the_drain_is_stopped_and_the_process_exits_0(tmp_path: Path) -> None:
    *_, code, log = await _outliving_stream(tmp_path)
    assert code == 0, log
    assert "Traceback" not in log and "Exception in ASGI" not in log, log
    assert "drain deadline" in log
    with contextlib.closing(sqlite3.connect(tmp_path / "audit.db")) as db:
        rows: list[Any] = db.execute("SELECT status, completion_tokens FROM requests WHERE stream = 1").fetchall()
    assert len(rows) == 1 and rows[0][0] != "ok", rows     # audited, and not as a success


async def test_stream_outliving_the_drain_ends_with_an_sse_error_event(tmp_path: Path) -> None:
    status, rid, text, code, log = await _outliving_stream(tmp_path)
    assert code == 0, log
    assert status == 200 and "server_shutting_down" in text, text[-500:]
    assert _rows(tmp_path, [rid])[rid][2] == 3      # the tokens sent before the stop
