"""A running gateway (a SQLite file, and PostgreSQL) follows the database through its revision
watch (store/revision_watch.py, wired in app.py): while nothing is written, its
live-config poll (``LiveConfig.poll_once``, called by the test: ``INFERLB_OVERRIDES_POLL_S`` is an
hour here, so nothing sleeps for time) sends no SQL at all; a node drained through another engine
(another replica, ``inferlb fleet``) is applied at the next poll on SQLite, and at once on PostgreSQL,
where the notification wakes the live config's own loop."""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from inferlb.config.settings import fleet_from_mapping
from inferlb.live.manager import LiveConfig
from inferlb.simulator.emulator import SimFleet
from inferlb.store.db import make_engine
from inferlb.store.overrides import NodeOverride, save_override
from tests.support import fast_specs, running_gateway, settings_for

# Set in the test's own task only after the gateway started: the live config's loop (woken by a
# NOTIFY on PostgreSQL) reads in its own context, so only the test's polls are counted.
TEST_POLL: ContextVar[bool] = ContextVar("test_poll", default=False)


class RevisionReads:
    """Counts the statements the test's polls send through ``engine`` that touch the revision."""

    def __init__(self, engine: Engine) -> None:
        self.n = 0
        event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, _conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if "fleet_revision" in statement and TEST_POLL.get():
            self.n += 1


async def quiet(live: LiveConfig) -> None:
    """Poll until the watch has nothing left to read: start-up writes (node events) and, on
    PostgreSQL, the listener's first connection each make one read due. Bounded in turns (a
    hang guard of about 20 s, not a timed assert: a loaded machine may connect slowly)."""
    for _ in range(1000):
        if live.watch.due() is None:
            return
        await live.poll_once()
        await asyncio.sleep(0.02)   # let the background writers and the listener run
    raise AssertionError(f"the revision watch never settled: {live.watch.describe()}")


async def test_the_poll_reads_only_when_the_database_moved(tmp_path: Path, shared_db_url: str) -> None:
    async with SimFleet(fast_specs(2)) as sim:
        fleet = fleet_from_mapping({
            "models": [{"name": "m"}],
            "nodes": [{"name": n, "url": node.url, "models": ["m"]} for n, node in sim.nodes.items()],
            "health": {"interval_s": 3600},   # no health round (and no node event written) mid-test
        })
        settings = settings_for(tmp_path, fleet, database_url=shared_db_url, overrides_poll_s=3600,
                                overrides_reread_s=3600)
        other = make_engine(shared_db_url)
        try:
            async with running_gateway(settings) as (_base, app):
                live: LiveConfig = app.state.live
                sqlite = shared_db_url.startswith("sqlite")
                assert live.status()["watch"]["kind"] == ("sqlite-stat" if sqlite else "postgresql-notify")
                reads = RevisionReads(app.state.store.engine)
                await quiet(live)
                TEST_POLL.set(True)
                for _ in range(20):
                    assert not await live.poll_once()
                assert reads.n == 0
                await asyncio.to_thread(save_override, other, "n1", NodeOverride("n1", "file", {}, drained=True))
                if sqlite:
                    assert await live.poll_once()
                    assert reads.n >= 1
                else:   # the notification wakes the live config's own loop at once, and it applies it
                    for _ in range(1000):   # bounded (a hang guard, not a timing)
                        if live.revision == 1:
                            break
                        await asyncio.sleep(0.02)
                assert app.state.gateway.rt.fleet.nodes["n1"].state in ("draining", "drained")
                assert live.revision == 1 and live.sync_error is None
        finally:
            other.dispose()
