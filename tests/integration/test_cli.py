"""The README's commands, as separate processes talking real HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.support import ROOT, free_port

CLI = [sys.executable, "-m", "inferlb.cli.main"]


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["INFERLB_JOURNAL_DIR"] = str(tmp / "journal")
    return env


def test_demo_serves_and_shuts_down_cleanly(tmp_path: Path) -> None:
    port, admin = free_port(), free_port()
    proc = subprocess.Popen([*CLI, "demo", "--port", str(port)], cwd=tmp_path,
                            env={**_env(tmp_path), "INFERLB_ADMIN_PORT": str(admin)},
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
            if "Ctrl-C stops it" in line:   # the banner's last line
                break
        assert any("inferlb demo is ready" in ln for ln in lines), "".join(lines)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        out = client.chat.completions.create(model="demo-llm", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4)
        assert out.usage is not None and out.usage.completion_tokens == 4
        # the banner's admin commands: the admin listener, keyless on loopback; the public port hides them
        assert any(f"curl -s 'http://127.0.0.1:{admin}/reports/sla?group_by=node'" in ln for ln in lines), lines
        sla = httpx.get(f"http://127.0.0.1:{admin}/reports/sla", params={"group_by": "node"}, timeout=5)
        assert sla.status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/reports/sla", timeout=5).status_code == 404
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
    assert bad.returncode == 1
    _one_line(bad.stderr, str(ROOT / "tests/processes/fixtures/broken_unknown_op.bpmn"), "mystery", "nope/unknown")


FIXTURES = ROOT / "tests" / "processes" / "fixtures"
GOOD_FLEET = "models: [{name: m}]\nnodes: [{name: a, url: 'http://127.0.0.1:9', models: [m]}]\n"


def _one_line(stderr: str, *needles: str) -> str:
    """The whole of stderr is one line naming every needle (file, element or key path, problem)."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _run(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=tmp, env={**_env(tmp), **(env or {})}, capture_output=True,
                          text=True, timeout=60)


def _processes(tmp: Path, request_file: str) -> Path:
    """A processes directory with ``request_file`` as its request process."""
    pdir = tmp / "processes"
    pdir.mkdir()
    if request_file == "truncated":   # a file cut short: not even XML
        cut = (ROOT / "processes" / "inference_request.bpmn").read_bytes()[:3000]
        (pdir / "inference_request.bpmn").write_bytes(cut)
    else:
        (pdir / "inference_request.bpmn").write_bytes((FIXTURES / request_file).read_bytes())
    (pdir / "node_health.bpmn").write_bytes((ROOT / "processes" / "node_health.bpmn").read_bytes())
    return pdir


def test_validate_names_the_element_a_typo_is_in(tmp_path: Path) -> None:
    path = str(FIXTURES / "typo_retry_key.bpmn")
    r = _run(tmp_path, "validate", path)
    assert r.returncode == 1
    _one_line(r.stderr, path, "gw_retry", "retry['retyr']")


@pytest.mark.parametrize(("fleet", "needles"), [
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http://127.0.0.1:notaport', models: [m]}]\n",
     ["nodes[0].url", "notaport"]),
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http://x', models: [m]}, {name: a, url: 'http://y', models: [m]}]\n",
     ["nodes[1].name", "duplicate node name 'a'"]),
    (GOOD_FLEET + "routing: {profile: fastest}\n", ["routing.profile", "unknown routing profile 'fastest'"]),
    (GOOD_FLEET + "health: {process: nope.bpmn}\n", ["nope.bpmn", "cannot read"]),
    (GOOD_FLEET + "health: {nodes: {zz: {}}}\n", ["health.nodes.zz", "unknown node 'zz'"]),
    ("models: [{name: m\nnodes: []\n", ["not valid YAML"]),
])
def test_validate_config_one_line_per_bad_file(tmp_path: Path, fleet: str, needles: list[str]) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(fleet)
    r = _run(tmp_path, "validate", "--config", str(cfg))
    assert r.returncode != 0
    _one_line(r.stderr, str(cfg) if "nope.bpmn" not in needles else "nope.bpmn", *needles)


def test_validate_config_checks_the_processes_too(tmp_path: Path) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(GOOD_FLEET)
    ok = _run(tmp_path, "validate", "--config", str(cfg))
    assert ok.returncode == 0, ok.stderr
    assert "executor compiled" in ok.stdout and "node_health.bpmn" in ok.stdout
    pdir = _processes(tmp_path, "typo_routing_key.bpmn")
    bad = _run(tmp_path, "validate", "--config", str(cfg), env={"INFERLB_PROCESSES_DIR": str(pdir)})
    assert bad.returncode != 0
    _one_line(bad.stderr, str(pdir / "inference_request.bpmn"), "gw_routed", "routing['okk']")


@pytest.mark.parametrize(("fleet", "process", "env", "needles"), [
    (GOOD_FLEET + "routing: {profile: fastest}\n", None, {}, ["fleet.yaml", "routing.profile", "fastest"]),
    (GOOD_FLEET, "typo_variable_name.bpmn", {}, ["inference_request.bpmn", "gw_admitted", "'admision'"]),
    (GOOD_FLEET, "missing_dispatch.bpmn", {}, ["inference_request.bpmn", "dispatch", "missing required task"]),
    (GOOD_FLEET, "truncated", {}, ["inference_request.bpmn", "(file)", "XMLSyntaxError"]),
    (GOOD_FLEET, None, {"INFERLB_JOURNAL_DIR": "{tmp}/a-file/journal"},
     ["INFERLB_JOURNAL_DIR", "a-file/journal", "not writable"]),
])
def test_serve_fails_with_one_line(tmp_path: Path, fleet: str, process: str | None, env: dict[str, str],
                                   needles: list[str]) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(fleet)
    (tmp_path / "a-file").write_text("")
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    if process is not None:
        env["INFERLB_PROCESSES_DIR"] = str(_processes(tmp_path, process))
    r = _run(tmp_path, "serve", "--config", str(cfg), "--port", str(free_port()), env=env)
    assert r.returncode != 0
    _one_line(r.stderr, *needles)


def test_demo_with_a_bad_process_fails_with_one_line(tmp_path: Path) -> None:
    pdir = _processes(tmp_path, "typo_retry_key.bpmn")
    r = _run(tmp_path, "demo", "--port", str(free_port()), env={"INFERLB_PROCESSES_DIR": str(pdir)})
    assert r.returncode != 0
    _one_line(r.stderr, str(pdir / "inference_request.bpmn"), "gw_retry", "retry['retyr']")
