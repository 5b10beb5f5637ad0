"""The other reload triggers on a real ``inferlb serve --watch`` process (live/triggers.py):
SIGHUP reloads, an edit of a process file reloads (watchfiles), a bad edit is refused with one
log line naming file, element and problem while the old process keeps serving, and
``inferlb fleet drain|undrain|reload`` drive the same process over HTTP. Polling below waits for
the subprocess's state, bounded by a count (the process runs on its own clock)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferlb.cli.main import main
from inferlb.simulator.emulator import SimFleet
from tests.support import ROOT, fast_specs, free_port

FIXTURES = ROOT / "tests" / "processes" / "fixtures"


async def _until(check: Any, what: str, log: Path, tries: int = 300) -> None:
    for _ in range(tries):       # bounded: the gateway's own start-up / reload, in another process
        if await check():
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"{what} never happened:\n" + log.read_text())


async def test_sighup_watch_and_the_fleet_command(tmp_path: Path) -> None:
    async with SimFleet(fast_specs(2)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        pdir = tmp_path / "processes"
        pdir.mkdir()
        for f in (ROOT / "processes").glob("*.bpmn"):
            shutil.copy(f, pdir / f.name)
        fleet = {"models": [{"name": "m", "default_max_tokens": 4}],
                 "nodes": [{"name": n, "url": u, "models": ["m"]} for n, u in urls.items()]}
        (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
        port, admin_port = free_port(), free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "INFERLB_JOURNAL_DIR": str(tmp_path / "journal"), "INFERLB_PROCESSES_DIR": str(pdir),
               "INFERLB_DATABASE_URL": f"sqlite:///{tmp_path / 'audit.db'}", "INFERLB_ADMIN_PORT": str(admin_port)}
        log = tmp_path / "gateway.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "inferlb.cli.main", "serve", "--watch", "--config", str(tmp_path / "fleet.yaml"),
                "--port", str(port), cwd=tmp_path, env=env, stdout=out, stderr=asyncio.subprocess.STDOUT)
        # no admin key: /admin/fleet is served on the admin listener only (server/listeners.py)
        base = f"http://127.0.0.1:{admin_port}"
        try:
            async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                async def ready() -> bool:
                    with contextlib.suppress(httpx.TransportError):
                        return (await http.get("/readyz")).status_code == 200
                    return False

                async def live() -> dict[str, Any]:
                    doc: dict[str, Any] = (await http.get("/admin/fleet")).json()["live"]
                    return doc

                await _until(ready, "readiness", log)
                assert f"served without a key on the admin listener http://127.0.0.1:{admin_port} only" \
                    in log.read_text()
                hidden = httpx.get(f"http://127.0.0.1:{port}/admin/fleet", timeout=5)
                assert hidden.status_code == 404, hidden.text
                await _until(lambda: _logged(log, "watching"), "the watcher", log)
                first = (await live())["process_version"]

                proc.send_signal(signal.SIGHUP)
                await _until(lambda: _reloads(live, 1), "the SIGHUP reload", log)
                assert "reload (SIGHUP) done" in log.read_text()

                shutil.copy(FIXTURES / "inference_request_tagged.bpmn", pdir / "inference_request.bpmn")
                await _until(lambda: _reloads(live, 2), "the reload on save", log)
                assert (await live())["process_version"] != first

                shutil.copy(FIXTURES / "typo_variable_name.bpmn", pdir / "inference_request.bpmn")
                await _until(lambda: _logged(log, "gw_admitted"), "the refused reload", log)
                line = next(x for x in log.read_text().splitlines() if "gw_admitted" in x)
                assert "reload (watch) refused, nothing changed" in line
                assert "inference_request.bpmn" in line and "gw_admitted" in line and "'admision'" in line
                chat = await http.post("/v1/chat/completions", json={"model": "m", "messages": [
                    {"role": "user", "content": "hi"}]})
                assert chat.status_code == 200         # the last good process keeps serving

                shutil.copy(ROOT / "processes" / "inference_request.bpmn", pdir / "inference_request.bpmn")
                await _until(lambda: _reloads(live, 3), "the reload after the fix", log)
                assert (await live())["process_version"] == first

                # the fleet command, against the same process
                assert await asyncio.to_thread(main, ["fleet", "drain", "n1", "--url", base]) == 0
                assert await asyncio.to_thread(main, ["fleet", "remove", "n0", "--url", base]) == 1   # not drained
                assert await asyncio.to_thread(main, ["fleet", "undrain", "n1", "--url", base]) == 0
                assert await asyncio.to_thread(main, ["fleet", "set", "n1", "--weight", "2", "--url", base]) == 0
                assert await asyncio.to_thread(main, ["fleet", "reload", "--url", base]) == 0
                assert await asyncio.to_thread(main, ["fleet", "show", "--url", base]) == 0
                assert await asyncio.to_thread(main, ["fleet", "drain", "--url", base]) == 2   # no NAME
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 30)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
        assert proc.returncode == 0, log.read_text()
        assert "Traceback" not in log.read_text()


async def _logged(log: Path, needle: str) -> bool:
    return needle in log.read_text()


async def _reloads(live: Any, n: int) -> bool:
    doc = await live()
    return int(doc["reloads"]) >= n
