"""``inferlb serve`` binds its port before any other start-up work: a port in use is one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inferlb.cli.main import main
from tests.support import ROOT, certs


def _taken() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_port_in_use_is_one_line_before_any_start_up_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    host = "127.0.0.1"
    db, journal = tmp_path / "audit.db", tmp_path / "journal"
    monkeypatch.setenv("INFERLB_DATABASE_URL", f"sqlite:///{db}")
    monkeypatch.setenv("INFERLB_JOURNAL_DIR", str(journal))
    monkeypatch.setenv("INFERLB_ADMIN_PORT", "0")
    with _taken() as busy:
        port = busy.getsockname()[1]
        status = main(["serve", "--config", str(ROOT / "deploy" / "kubernetes" / "fleet.yaml"), "--host", host,
                       "--port", str(port)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and err[0].startswith("inferlb: error: ") and f"{host}:{port}" in err[0], err
    # nothing else was set up: no database file, no journal directory
    assert not db.exists() and not journal.exists()


def test_the_command_line_exits_non_zero_with_the_one_line(tmp_path: Path) -> None:
    with _taken() as busy:
        port = busy.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERLB_DATABASE_URL": f"sqlite:///{tmp_path / 'a.db'}",
               "INFERLB_JOURNAL_DIR": str(tmp_path / "journal"), "INFERLB_ADMIN_PORT": "0"}
        proc = subprocess.run([sys.executable, "-m", "inferlb.cli", "serve", "--port", str(port), "--config",
                               str(ROOT / "deploy" / "kubernetes" / "fleet.yaml")],
                              capture_output=True, text=True, env=env, timeout=60, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and lines == [lines[0]] and lines[0].startswith("inferlb: error: "), proc.stderr


@pytest.mark.parametrize(("var", "bad"), [("INFERLB_TLS_KEY_FILE", "missing"), ("INFERLB_TLS_KEY_FILE", "other"),
                                          ("INFERLB_TLS_CERT_FILE", "missing")])
def test_a_listener_certificate_that_does_not_load_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str], var: str,
                                                               bad: str) -> None:
    pem = certs(tmp_path)
    db, journal = tmp_path / "audit.db", tmp_path / "journal"
    monkeypatch.setenv("INFERLB_DATABASE_URL", f"sqlite:///{db}")
    monkeypatch.setenv("INFERLB_JOURNAL_DIR", str(journal))
    monkeypatch.setenv("INFERLB_ADMIN_PORT", "0")
    monkeypatch.setenv("INFERLB_TLS_CERT_FILE", str(pem.server_cert))
    monkeypatch.setenv("INFERLB_TLS_KEY_FILE", str(pem.server_key))
    monkeypatch.setenv(var, str(tmp_path / "nope.pem") if bad == "missing" else str(pem.other_key))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    status = main(["serve", "--config", str(ROOT / "deploy" / "kubernetes" / "fleet.yaml"), "--host", "127.0.0.1",
                   "--port", str(port)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and err[0].startswith(f"inferlb: error: environment: {var}: "), err
    assert "PRIVATE KEY" not in err[0]
    assert not db.exists() and not journal.exists()


def test_with_workers_a_port_in_use_is_still_one_line_before_any_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    db, journal = tmp_path / "audit.db", tmp_path / "journal"
    monkeypatch.setenv("INFERLB_DATABASE_URL", f"sqlite:///{db}")
    monkeypatch.setenv("INFERLB_JOURNAL_DIR", str(journal))
    with _taken() as busy, _taken() as busy_admin:
        for port, admin in ((busy.getsockname()[1], "0"), (0, str(busy_admin.getsockname()[1]))):
            monkeypatch.setenv("INFERLB_ADMIN_PORT", admin)
            status = main(["serve", "--config", str(ROOT / "deploy" / "kubernetes" / "fleet.yaml"), "--host",
                           "127.0.0.1", "--port", str(port), "--workers", "2"])
            err = capsys.readouterr().err.strip().splitlines()
            assert status == 2
            assert len(err) == 1 and "cannot listen on 127.0.0.1:" in err[0], err
    assert not db.exists() and not journal.exists()


def test_workers_must_be_a_count_or_auto(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "two", "257"):
        with pytest.raises(SystemExit) as exc:
            main(["serve", "--workers", bad])
        assert exc.value.code == 2
        assert "--workers" in capsys.readouterr().err


def test_a_worker_command_line_carries_no_setting(tmp_path: Path) -> None:
    from inferlb.cli.serve import worker_argv, worker_env
    from inferlb.config.settings import load_settings

    settings = load_settings(database_url="postgresql://u:secret@db/x", journal_dir=tmp_path / "j")
    argv = worker_argv(1, (5, None, 7), watch=True)
    assert argv[1:] == ["-m", "inferlb.cli.main", "serve", "--worker", "1", "--worker-fds", "5,-,7", "--watch"]
    env = worker_env(settings, 1, port=8080, admin_port=0, replica_base="h-1", redis_url="unix:///x/redis.sock",
                     base={})
    assert "secret" not in " ".join(argv)       # `ps` shows the command line to every user
    assert env["INFERLB_DATABASE_URL"] == "postgresql://u:secret@db/x" and env["INFERLB_WORKERS"] == "1"
    assert env["INFERLB_JOURNAL_DIR"] == str(tmp_path / "j" / "w1")
    assert env["INFERLB_CLUSTER_REPLICA_ID"] == "h-1-w1" and env["INFERLB_REDIS_URL"] == "unix:///x/redis.sock"


def test_workers_on_the_local_coordinator_get_the_longer_idle_and_leader_leases(tmp_path: Path) -> None:
    from inferlb.cli.serve import LOCAL_IDLE_LEASE_S, LOCAL_LEADER_LEASE_S, worker_env
    from inferlb.config.settings import load_settings

    settings = load_settings(journal_dir=tmp_path / "j")
    args: dict[str, Any] = {"port": 8080, "admin_port": 0, "replica_base": "h-1", "redis_url": "unix:///x/r.sock"}
    env = worker_env(settings, 0, **args, base={}, local=True)
    assert env["INFERLB_CLUSTER_IDLE_LEASE_S"] == LOCAL_IDLE_LEASE_S
    assert env["INFERLB_CLUSTER_LEADER_LEASE_S"] == LOCAL_LEADER_LEASE_S
    mine = worker_env(settings, 0, **args, base={"INFERLB_CLUSTER_LEADER_LEASE_S": "7"}, local=True)
    assert mine["INFERLB_CLUSTER_LEADER_LEASE_S"] == "7"          # the operator's value wins
    shared = worker_env(settings, 0, **{**args, "redis_url": "redis://r:6379/0"}, base={})
    assert "INFERLB_CLUSTER_IDLE_LEASE_S" not in shared           # a real Redis: no supervisor cleans up
    assert "INFERLB_CLUSTER_LEADER_LEASE_S" not in shared
