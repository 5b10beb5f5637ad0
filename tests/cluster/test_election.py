"""Election with fencing on the real database (SQLite and PostgreSQL): one holder at a time on
the database's clock, failover when the holder stops renewing, fencing of a former holder."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from inferlb.cluster.election import Election, FencedOut, LocalLeader
from inferlb.store.db import make_engine
from inferlb.types import ManualClock, SystemClock


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


def _role() -> str:
    return "test-" + secrets.token_hex(4)


def test_one_holder_at_a_time_and_renewal_keeps_the_token(engine: Engine) -> None:
    role = _role()
    clock = ManualClock()
    a = Election(engine, "a", lease_s=30, clock=clock, role=role)
    b = Election(engine, "b", lease_s=30, clock=clock, role=role)
    assert a.attempt() and a.leader() and a.token == 1
    assert not b.attempt() and not b.leader()
    assert b.current_holder == "a" and b.current_token == 1
    assert a.attempt() and a.token == 1            # a renewal is the same term
    clock.advance(30)                              # a's own deadline passed (the lease minus a margin)
    assert not a.leader()


def test_failover_when_the_holder_dies_and_the_old_holder_is_fenced(engine: Engine) -> None:
    role = _role()
    a = Election(engine, "a", lease_s=0.5, clock=SystemClock(), role=role)
    b = Election(engine, "b", lease_s=0.5, clock=SystemClock(), role=role)
    assert a.attempt()
    with engine.begin() as conn:
        a.fence(conn)                              # a's writes pass while it holds the role
    # a is SIGKILLed (it never renews). b keeps trying, as its loop does every lease / 3; the
    # lease runs out on the database's clock. Bounded wait: at most 5 s.
    deadline = time.monotonic() + 5
    while not b.attempt():
        assert time.monotonic() < deadline, "no failover within 5 s"
        time.sleep(0.05)
    assert b.token == 2 and b.leader()
    with engine.begin() as conn:
        b.fence(conn)
    with pytest.raises(FencedOut), engine.begin() as conn:
        a.fence(conn)                              # a paused former holder cannot write any more
    assert not a.attempt() and a.token is None


def test_release_hands_the_role_over_at_once(engine: Engine) -> None:
    role = _role()
    a = Election(engine, "a", lease_s=60, clock=SystemClock(), role=role)
    b = Election(engine, "b", lease_s=60, clock=SystemClock(), role=role)
    assert a.attempt() and not b.attempt()
    a.release()
    assert b.attempt() and b.token == 2


def test_a_database_away_makes_no_leader(engine: Engine, tmp_path: object) -> None:
    clock = ManualClock()
    dead = make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1")
    try:
        e = Election(dead, "a", lease_s=10, clock=clock, role=_role())
        assert not e.attempt() and e.failures == 1 and e.last_error
    finally:
        dead.dispose()
    assert LocalLeader().leader()


def test_the_lease_row_uses_the_database_clock(engine: Engine) -> None:
    role = _role()
    a = Election(engine, "a", lease_s=30, clock=ManualClock(start=5.0), role=role)   # a wildly wrong local clock
    assert a.attempt()
    with engine.connect() as conn:
        left = conn.execute(text(f"SELECT expires_at - acquired_at FROM leader_leases WHERE name = '{role}'")
                            ).scalar_one()
    assert left == pytest.approx(30, abs=1)


def test_release_holder_ends_a_dead_replicas_leases_at_once(engine: Engine) -> None:
    from inferlb.cluster.election import release_holder

    role = _role()
    ha, hb = _role(), _role()       # holder names of this test only (other tests' leases share the table)
    a = Election(engine, ha, lease_s=60, clock=SystemClock(), role=role)
    b = Election(engine, hb, lease_s=60, clock=SystemClock(), role=role)
    assert a.attempt() and not b.attempt()
    assert release_holder(engine, hb) == 0           # b holds nothing
    assert release_holder(engine, ha) == 1           # a died; its supervisor says so
    assert b.attempt() and b.token == 2
    with pytest.raises(FencedOut), engine.begin() as conn:
        a.fence(conn)


async def test_a_poke_makes_the_election_attempt_before_its_renewal(engine: Engine) -> None:
    import asyncio

    e = Election(engine, "a", lease_s=600, clock=SystemClock(), role=_role())
    e.poke()                                         # before the loop: nothing to wake, no error
    waiting = asyncio.ensure_future(e._wait(600))    # the timer's wait of one renewal (200 s)
    await asyncio.sleep(0)
    assert not waiting.done()
    e.poke()
    await asyncio.wait_for(waiting, 30)              # hang guard: the poke ends it, not the 600 s
