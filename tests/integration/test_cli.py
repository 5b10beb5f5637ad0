"""The README's commands, as separate processes talking real HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from openai import OpenAI

from ..support import ROOT, free_port

CLI = [sys.executable, "-m", "inferlb.cli"]


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["INFERLB_JOURNAL_DIR"] = str(tmp / "journal")
    return env


def test_demo_serves_and_shuts_down_cleanly(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([*CLI, "demo", "--port", str(port)], cwd=tmp_path, env=_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        while time.monotonic() < deadline:   # bounded
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "inferlb demo is ready" in line:
                break
        assert any("inferlb demo is ready" in ln for ln in lines), "".join(lines)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        out = client.chat.completions.create(model="demo-llm", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4)
        assert out.usage is not None and out.usage.completion_tokens == 4
        sla = httpx.get(f"http://127.0.0.1:{port}/reports/sla", params={"group_by": "node"}, timeout=5)
        assert sla.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, rest
    assert (tmp_path / "inferlb.db").exists()


def test_serve_with_bad_fleet_file_names_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "fleet.yaml"
    bad.write_text("models: [{name: m}]\nnodes:\n  - {name: a, url: 'ftp://x', models: [m]}\n")
    r = subprocess.run([*CLI, "serve", "--config", str(bad), "--port", str(free_port())], cwd=tmp_path,
                       env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"{bad}: nodes[0].url" in r.stderr and "http://" in r.stderr
    assert "Traceback" not in r.stderr


def test_validate_reports_executor_and_problems(tmp_path: Path) -> None:
    ok = subprocess.run([*CLI, "validate", str(ROOT / "processes" / "inference_request.bpmn")],
                        env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "executor compiled" in ok.stdout
    timer = subprocess.run([*CLI, "validate", str(ROOT / "tests/processes/fixtures/with_timer.bpmn")],
                           env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert timer.returncode == 0 and "executor spiff" in timer.stdout and "wait_timer" in timer.stdout
    bad = subprocess.run([*CLI, "validate", str(ROOT / "tests/processes/fixtures/broken_unknown_op.bpmn")],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "mystery" in bad.stdout and "nope/unknown" in bad.stdout
