"""A refused reload is logged once (live/triggers.py): the same broken fleet file refused again
and again (a watch tick, another save, a SIGHUP) is one ERROR line; a different broken content is
another; after a good reload the same breakage is logged again. A real gateway, its real reload."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from inferlb.config.settings import Settings
from inferlb.live.triggers import reload_logged
from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, running_gateway


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "inferlb.live" and r.levelno >= logging.ERROR and "refused" in r.getMessage()]


async def test_a_refused_reload_is_logged_once_per_file_content(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    async with SimFleet(fast_specs(1)) as sim:
        good = {"models": [{"name": "m"}],
                "nodes": [{"name": n, "url": node.url, "models": ["m"]} for n, node in sim.nodes.items()],
                "health": {"interval_s": 3600}}
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text(yaml.safe_dump(good))
        settings = Settings(config=fleet, database_url=f"sqlite:///{tmp_path / 'audit.db'}",
                            journal_dir=tmp_path / "journal")
        async with running_gateway(settings) as (_base, app):
            other = yaml.safe_dump({**good, "models": [{"name": "m", "kind": "nope"}]})   # broken another way
            fleet.write_text(yaml.safe_dump({**good, "models": [{"name": "m", "max_output_tokens": -1}]}))
            with caplog.at_level(logging.INFO, "inferlb.live"):
                for _ in range(5):                       # five watch ticks on the same broken file
                    assert not await reload_logged(app, "watch")
                assert not await reload_logged(app, "SIGHUP")
                assert len(_refusals(caplog)) == 1, _refusals(caplog)
                assert "max_output_tokens" in _refusals(caplog)[0]

                fleet.write_text(other)
                assert not await reload_logged(app, "watch")
                assert not await reload_logged(app, "watch")
                assert len(_refusals(caplog)) == 2

                fleet.write_text(yaml.safe_dump(good))
                assert await reload_logged(app, "watch")
                fleet.write_text(other)        # the same breakage, after a fix
                assert not await reload_logged(app, "watch")
                assert len(_refusals(caplog)) == 3
