"""Audit durability end to end (docs/reliability.md B1, C-16, C-20): real HTTP, real processes.

* A full journal fails closed: 503 ``audit_unavailable`` with Retry-After and readiness false, and
  both recover by themselves once the database takes the backlog.
* ``inferlb serve`` killed with SIGKILL under load: after a restart every ``x-request-id`` a
  client saw has exactly one audit row; streams cut by the kill are ``unknown_outcome``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.emulator import SimFleet
from tests.store.test_audit_writer import _table_missing
from tests.support import ROOT, fast_specs, fleet_for, free_port, running_gateway, settings_for

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def test_a_full_journal_answers_503_audit_unavailable_and_recovers(tmp_path: Path) -> None:  # C-16
    async with SimFleet(fast_specs(2)) as sim:
        fleet = fleet_for({n: node.url for n, node in sim.nodes.items()})
        settings = settings_for(tmp_path, fleet, audit_max_records=2)
        async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base, timeout=10) as client:
            writer = app.state.store.writer
            with _table_missing(app.state.store.engine):          # the audit database refuses writes
                for _ in range(2):
                    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
                await writer.flush_once(force=True)
                assert writer.backlog()["spooled"] == 2
                r = await client.post("/v1/chat/completions", json=CHAT)
                assert r.status_code == 503, r.text
                err = r.json()["error"]
                assert err["code"] == "audit_unavailable" and err["type"] == "server_error" and err["message"]
                assert int(r.headers["retry-after"]) >= 1
                ready = await client.get("/readyz")
                assert ready.status_code == 503 and "audit_unavailable" in ready.json()["reasons"]
                assert ready.json()["audit"]["state"] == "unavailable" and "limit 2" in ready.json()["audit"]["reason"]
            assert await writer.flush_once(force=True) == 2            # the database is back
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
            ready = await client.get("/readyz")
            assert ready.status_code == 200 and ready.json()["audit"]["state"] == "ok"


# -- SIGKILL under load --------------------------------------------------------------------------------


def _serve(tmp: Path, fleet_file: Path, port: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERLB_DATABASE_URL": f"sqlite:///{tmp / 'audit.db'}",
           "INFERLB_JOURNAL_DIR": str(tmp / "journal"), "INFERLB_LOG_LEVEL": "WARNING",
           "INFERLB_ADMIN_PORT": str(free_port())}   # port + 1 (the default) may be taken on a busy machine
    return subprocess.Popen([sys.executable, "-m", "inferlb.cli.main", "serve", "--config", str(fleet_file),
                             "--port", str(port)], cwd=tmp, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


async def _until_ready(base: str, proc: subprocess.Popen[str]) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=2) as client:
        for _ in range(600):   # bounded: 60 s
            if proc.poll() is not None:
                raise AssertionError(f"the gateway exited: {proc.communicate()[0]}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get("/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise AssertionError("the gateway did not become ready within 60 s")


class _Load:
    """Clients that note every ``x-request-id`` they see, until the gateway dies (bounded)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.seen: set[str] = set()
        self.done = 0
        self.streaming: set[str] = set()   # headers seen, body not finished

    async def worker(self, n: int, stream: bool) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as client:
            for _ in range(n):
                # Long streams (400 tokens × 20 ms = 8 s): those in flight at the kill have seconds left.
                body: dict[str, Any] = {**CHAT, "stream": True, "max_tokens": 400} if stream else CHAT
                try:
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        rid = r.headers.get("x-request-id")
                        if rid:
                            self.seen.add(rid)
                            self.streaming.add(rid)
                        await r.aread()
                        self.streaming.discard(rid or "")
                        self.done += 1
                except httpx.HTTPError:
                    return


async def test_sigkill_under_load_then_restart_every_seen_request_has_one_row(tmp_path: Path) -> None:  # C-20
    async with SimFleet(fast_specs(2, tpot_s=0.02)) as sim:
        fleet = fleet_for({n: node.url for n, node in sim.nodes.items()})
        fleet_file = tmp_path / "fleet.yaml"
        fleet_file.write_text(yaml.safe_dump(fleet.model_dump(mode="json")))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = _serve(tmp_path, fleet_file, port)
        try:
            await _until_ready(base, proc)
            load = _Load(base)
            workers = [asyncio.create_task(load.worker(400, stream=i % 2 == 0)) for i in range(6)]
            for _ in range(600):   # bounded: at most 60 s of load before the kill
                if load.done >= 30 and load.streaming:
                    break
                await asyncio.sleep(0.1)
            cut = set(load.streaming)
            assert load.done >= 30 and cut, (load.done, cut)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            await asyncio.wait_for(asyncio.gather(*workers), 60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)

        again = _serve(tmp_path, fleet_file, port)   # replays the write-ahead log before it is ready
        try:
            await _until_ready(base, again)
        finally:
            again.send_signal(signal.SIGINT)
            out, _ = again.communicate(timeout=60)
        assert again.returncode == 0, out

    with contextlib.closing(sqlite3.connect(tmp_path / "audit.db")) as db:
        rows = dict(db.execute("SELECT request_id, status FROM requests").fetchall())
        counts = dict(db.execute("SELECT request_id, count(*) FROM requests GROUP BY request_id").fetchall())
    missing = load.seen - rows.keys()
    assert not missing, f"{len(missing)} of {len(load.seen)} requests the clients saw have no audit row"
    assert all(counts[rid] == 1 for rid in load.seen)
    # A stream cut by the kill got its 200 and some chunks: it is on record, its outcome unknown.
    assert {rows[rid] for rid in cut} <= {"unknown_outcome", "ok"} and "unknown_outcome" in {rows[r] for r in cut}


@pytest.mark.parametrize(("setting", "pragma"), [("normal", 1), ("full", 2)])
async def test_the_sqlite_synchronous_setting_reaches_the_gateways_audit_database(
        tmp_path: Path, setting: str, pragma: int) -> None:
    """``INFERLB_AUDIT_SQLITE_SYNCHRONOUS``: ``full`` makes every audit commit an fsync (durable
    across an OS crash, docs/observability.md); the default stays ``normal``."""
    async with SimFleet(fast_specs(1)) as sim:
        cfg = fleet_from_mapping({"models": [{"name": "m"}],
                                  "nodes": [{"name": "n0", "url": sim.nodes["n0"].url, "models": ["m"]}]})
        over: dict[str, Any] = {} if setting == "normal" else {"audit_sqlite_synchronous": setting}
        async with running_gateway(settings_for(tmp_path, cfg, **over)) as (_base, app):
            with app.state.store.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == pragma
