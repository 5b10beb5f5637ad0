"""What the commands print never carries the database password: ``inferlb db upgrade``'s line and
the demo banner show ``INFERLB_DATABASE_URL`` redacted (config/netpolicy.py ``redact_url``), since
their output lands in the logs of the init container or terminal that runs them."""

from __future__ import annotations

import argparse

import pytest

import inferlb.cli.audit
from inferlb.cli.db import db_command
from inferlb.cli.demo import demo_banner, demo_fleet
from inferlb.config.settings import Settings

PASSWORD = "CANARYPW-db-5e1c"
URL = f"postgresql://inferlb:{PASSWORD}@db.internal:5432/audit"


def test_db_upgrade_prints_where_without_the_password(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    migrated: list[str] = []
    monkeypatch.setattr(inferlb.cli.audit, "db_upgrade", migrated.append)   # no PostgreSQL needed here
    assert db_command(argparse.Namespace(action="upgrade"), Settings(database_url=URL)) == 0
    out = capsys.readouterr().out
    assert migrated == [URL]                        # the migration itself gets the whole URL
    assert PASSWORD not in out and "db.internal:5432/audit" in out, out


def test_the_demo_banner_shows_the_database_without_the_password() -> None:
    settings = Settings(database_url=URL, fleet=demo_fleet({"sim-a": "http://127.0.0.1:9001"}))
    text = demo_banner(settings, ["http://127.0.0.1:9001"])
    assert PASSWORD not in text and "audit database: postgresql://db.internal:5432/audit" in text, text
