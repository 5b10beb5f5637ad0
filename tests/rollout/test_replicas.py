"""Two replicas' rollout managers on one database (SQLite and PostgreSQL), each with its own
version table, window and injected clock, running the real ``rollout.bpmn``: a rollout started
on either is followed by the other (same weights, same user → version assignment), only the
leader decides steps, an abort on a follower wins over the leader's next step, an abort of a
rollout the leader already ended is a 409, and a former leader's round is fenced out. ``sync`` is
what each replica's live-config poll calls when the shared revision moved (live/manager.py); the
tests call it, nothing sleeps."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from inferlb.cluster.election import Election
from inferlb.rollout.errors import RolloutBusy
from inferlb.rollout.store import get_rollout, rollout_events
from inferlb.store.overrides import read_revision
from inferlb.types import ManualClock
from tests.rollout.rig import Rig, rig

CRITERIA: dict[str, Any] = {"min_requests": 50, "min_step_s": 5, "max_step_s": 600, "window_s": 300,
                            "max_error_rate_increase": 0.05, "max_slo_miss_increase": 0.1}
USERS = [f"user-{i}" for i in range(300)]


def replicas(engine: Engine) -> tuple[Rig, Rig]:
    """A (the leader) and B (a follower: its ``leader()`` is false)."""
    a, b = rig(engine=engine), rig(engine=engine)
    b.manager.leader = lambda: False
    return a, b


def split(r: Rig) -> tuple[dict[str, float], list[str]]:
    """The weights in force and the version each of 300 users gets."""
    mv = r.versions.get("m")
    assert mv is not None
    picks = [r.versions.assign("m", "acme", u, "rid") for u in USERS]
    return mv.shares(), [v.name for v in picks if v is not None]


async def round_with_traffic(r: Rig, **feed: Any) -> list[dict[str, Any]]:
    """Six virtual seconds of 100 requests a second on ``r``, then one round of rollout.bpmn."""
    for _ in range(6):
        r.clock.advance(1.0)
        r.feed(100, **feed)
    return await r.manager.run_once()


async def test_a_rollout_started_on_either_replica_is_followed_by_the_other(shared_db: Engine) -> None:
    a, b = replicas(shared_db)
    before = read_revision(shared_db)
    ro = await b.manager.start_rollout(b.spec(steps=[10, 50, 100], criteria=CRITERIA))   # on the follower
    assert read_revision(shared_db) == before + 1                   # the revision every poll reads
    assert split(a) != split(b)                                     # A has not polled yet
    assert await a.manager.sync()
    assert split(a) == split(b) and split(a)[0] == {"v1": 0.9, "v2": 0.1}
    assert not await a.manager.sync()                               # nothing new
    # Only the leader decides: the follower's round does nothing.
    assert await round_with_traffic(b) == [] and b.manager.rounds == 0
    rounds = await round_with_traffic(a)
    assert rounds and rounds[-1]["decision"]["action"] == "promote"
    assert a.manager.get(ro.id).percent == 50.0                     # type: ignore[union-attr]
    assert await b.manager.sync()
    assert split(b) == split(a) and split(b)[0] == {"v1": 0.5, "v2": 0.5}
    assert b.manager.get(ro.id).step == 1                           # type: ignore[union-attr]
    rounds = await round_with_traffic(a)
    assert a.manager.get(ro.id).state == "completed"                # type: ignore[union-attr]
    assert await b.manager.sync()
    done = b.manager.get(ro.id)
    assert done is not None and done.state == "completed" and split(b)[0] == {"v1": 0.0, "v2": 1.0}
    assert b.manager.status()["leader"] is False and b.manager.status()["follows"] == 2   # the step, the end


async def test_an_abort_on_a_follower_wins_over_the_leaders_next_step(shared_db: Engine) -> None:
    a, b = replicas(shared_db)
    ro = await a.manager.start_rollout(a.spec(steps=[10, 50, 100], criteria=CRITERIA))
    assert await b.manager.sync()
    aborted = await b.manager.abort(ro.id)
    assert aborted.state == "aborted" and split(b)[0] == {"v1": 1.0, "v2": 0.0}
    # The leader has not polled since, and its round would promote: the database refuses the
    # step over an ended rollout, and the leader follows the abort instead.
    await round_with_traffic(a)
    mine = a.manager.get(ro.id)
    assert mine is not None and mine.state == "aborted" and split(a) == split(b)
    row = get_rollout(shared_db, ro.id)
    assert row is not None and row["state"] == "aborted" and row["percent"] == 0.0
    assert [e["action"] for e in rollout_events(shared_db, ro.id)] == ["start", "abort"]


async def test_aborting_a_rollout_the_leader_already_ended_is_409(shared_db: Engine) -> None:
    a, b = replicas(shared_db)
    ro = await a.manager.start_rollout(a.spec(steps=[10, 50, 100], criteria=CRITERIA))
    assert await b.manager.sync()
    for _ in range(20):
        await round_with_traffic(a, errors={"v2": 0.5})
        if not a.manager.get(ro.id).running:                        # type: ignore[union-attr]
            break
    assert a.manager.get(ro.id).state == "rolled_back"              # type: ignore[union-attr]
    with pytest.raises(RolloutBusy) as err:                         # B had not polled yet
        await b.manager.abort(ro.id)
    assert err.value.status == 409 and err.value.code == "rollout_not_running"
    assert "rolled_back" in err.value.message
    assert b.manager.get(ro.id).state == "rolled_back" and split(b) == split(a)   # type: ignore[union-attr]
    assert [e["action"] for e in rollout_events(shared_db, ro.id)][-1] == "rollback"


async def test_a_former_leader_is_fenced_out_and_follows_the_new_one(shared_db: Engine) -> None:
    """The election of cluster/election.py on the real database: A led and paused past its
    lease; B took the role (the next fencing token). A still believes it leads, and its round would
    promote: the fence refuses the write, A drops the round and follows the table; B decides."""
    role = "rollouts-test-" + secrets.token_hex(4)
    ea = Election(shared_db, "a", lease_s=30, clock=ManualClock(), role=role)
    eb = Election(shared_db, "b", lease_s=30, clock=ManualClock(), role=role)
    a, b = rig(engine=shared_db), rig(engine=shared_db)
    a.manager.leader, a.manager.fence = ea.leader, ea.fence
    b.manager.leader, b.manager.fence = eb.leader, eb.fence
    assert await asyncio.to_thread(ea.attempt) and not await asyncio.to_thread(eb.attempt)
    ro = await a.manager.start_rollout(a.spec(steps=[10, 50, 100], criteria=CRITERIA))
    assert await b.manager.sync()
    # A's lease runs out on the database's clock (as if A paused for longer than the lease) ...
    with shared_db.begin() as conn:
        conn.execute(text("UPDATE leader_leases SET expires_at = acquired_at WHERE name = :n"), {"n": role})
    assert await asyncio.to_thread(eb.attempt) and eb.token == 2
    assert ea.leader()                                      # ... and A has not noticed yet
    rounds = await round_with_traffic(a)
    assert rounds and rounds[-1]["decision"]["action"] == "promote"   # A decided, but could not write
    mine = a.manager.get(ro.id)
    assert mine is not None and mine.percent == 10.0 and split(a)[0] == {"v1": 0.9, "v2": 0.1}
    row = get_rollout(shared_db, ro.id)
    assert row is not None and row["percent"] == 10.0
    assert [e["action"] for e in rollout_events(shared_db, ro.id)] == ["start"]
    # B leads now: its round promotes, and A follows it.
    await round_with_traffic(b)
    assert b.manager.get(ro.id).percent == 50.0             # type: ignore[union-attr]
    assert await a.manager.sync() and split(a) == split(b)
