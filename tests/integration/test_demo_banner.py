"""The demo banner says whether authentication is on (it used to say OFF whatever the settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferlb.cli import demo_banner, demo_fleet
from inferlb.engine.admission.config import AdmissionSettings
from inferlb.engine.settings import Settings, fleet_from_mapping

URLS = ["http://127.0.0.1:9001"]


def _settings(tmp: Path, **over: Any) -> Settings:
    base: dict[str, Any] = {"fleet": demo_fleet({"sim-a": URLS[0]}), "database_url": f"sqlite:///{tmp / 'a.db'}"}
    base.update(over)
    return Settings(**base)


def test_banner_says_off_by_default(tmp_path: Path) -> None:
    text = demo_banner(_settings(tmp_path), URLS)
    assert "Authentication is OFF" in text and "Authentication is ON" not in text


def test_banner_says_on_when_the_env_turns_auth_on(tmp_path: Path) -> None:
    text = demo_banner(_settings(tmp_path, admission=AdmissionSettings(auth=True, redis_url=None)), URLS)
    assert "Authentication is ON" in text and "OFF" not in text


def test_banner_says_on_when_the_fleet_file_turns_auth_on(tmp_path: Path) -> None:
    fleet = fleet_from_mapping({"models": [{"name": "m"}], "nodes": [{"name": "a", "url": URLS[0], "models": ["m"]}],
                                "admission": {"auth": True}})
    assert "Authentication is ON" in demo_banner(_settings(tmp_path, fleet=fleet), URLS)
