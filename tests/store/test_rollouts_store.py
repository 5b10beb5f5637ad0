"""Rollouts in the database on SQLite and PostgreSQL: the row and its events, one running rollout
per model (the partial unique index, true across replicas), resume after a restart, and what
replicas follow: every state change bumps the shared revision, a state written over a rollout
another replica ended is refused (stale) with its events."""

from __future__ import annotations

import secrets

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from inferlb.rollout.store import (
    RolloutConflict,
    following,
    get_rollout,
    insert_rollout,
    list_rollouts,
    rollout_events,
    running_rollouts,
    save_progress,
)
from inferlb.store.overrides import read_revision

T0 = 1_767_225_600.0


def _row(model: str, rid: str | None = None, state: str = "running") -> dict[str, object]:
    return {"id": rid or "ro_" + secrets.token_hex(4), "model": model, "from_version": "v1", "to_version": "v2",
            "steps": [1.0, 50.0, 100.0], "criteria": {"min_requests": 10}, "base_weights": {"v1": 100.0, "v2": 0.0},
            "state": state, "step": 0, "percent": 1.0, "reason": None, "started_at": T0, "step_started_at": T0,
            "ended_at": None}


def _event(action: str, before: float, after: float, at: float = T0) -> dict[str, object]:
    return {"at": at, "action": action, "from_percent": before, "to_percent": after, "reason": action,
            "evidence": {"checks": [{"test": "errors", "status": "within"}]}}


@pytest.fixture
def model(engine: Engine) -> str:
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM rollouts"))
    return "m_" + secrets.token_hex(3)


def test_rollout_row_events_and_progress(engine: Engine, model: str) -> None:
    row = _row(model)
    insert_rollout(engine, row, [_event("start", 0.0, 1.0)])
    save_progress(engine, {str(row["id"]): {"state": "running", "step": 1, "percent": 50.0,
                                            "step_started_at": T0 + 60}},
                  {str(row["id"]): [_event("hold", 1.0, 1.0, T0 + 30), _event("promote", 1.0, 50.0, T0 + 60)]})
    got = get_rollout(engine, str(row["id"]))
    assert got is not None and got["percent"] == 50.0 and got["step_started_at"] == T0 + 60
    assert got["criteria"] == {"min_requests": 10} and got["base_weights"] == {"v1": 100.0, "v2": 0.0}
    events = rollout_events(engine, str(row["id"]))
    assert [(e["action"], e["to_percent"]) for e in events] == [("start", 1.0), ("hold", 1.0), ("promote", 50.0)]
    assert events[-1]["evidence"]["checks"][0]["status"] == "within"
    assert [r["id"] for r in running_rollouts(engine)] == [row["id"]]
    assert [r["id"] for r in list_rollouts(engine, model=model)] == [row["id"]]


def test_one_running_rollout_per_model(engine: Engine, model: str) -> None:
    first = _row(model)
    insert_rollout(engine, first)
    with pytest.raises(RolloutConflict):
        insert_rollout(engine, _row(model))
    # Finished ones do not count; another model is free.
    insert_rollout(engine, _row(model + "_other"))
    save_progress(engine, {str(first["id"]): {"state": "rolled_back", "ended_at": T0 + 5}}, {})
    insert_rollout(engine, _row(model))
    assert len(list_rollouts(engine, model=model)) == 2


def test_state_changes_bump_the_shared_revision_and_an_ended_rollout_is_never_moved_back(
        engine: Engine, model: str) -> None:
    row = _row(model)
    rid = str(row["id"])
    rev = read_revision(engine)
    insert_rollout(engine, row, [_event("start", 0.0, 1.0)])
    assert read_revision(engine) == rev + 1
    assert save_progress(engine, {}, {rid: [_event("hold", 1.0, 1.0, T0 + 5)]}) == set()
    assert read_revision(engine) == rev + 1                   # events alone: nothing to follow
    # Another replica aborts it; then the leader writes its promotion, made before it knew.
    assert save_progress(engine, {rid: {"state": "aborted", "percent": 0.0, "ended_at": T0 + 6}},
                         {rid: [_event("abort", 1.0, 0.0, T0 + 6)]}) == set()
    assert read_revision(engine) == rev + 2
    assert save_progress(engine, {rid: {"state": "running", "step": 1, "percent": 50.0}},
                         {rid: [_event("promote", 1.0, 50.0, T0 + 7)]}) == {rid}
    assert read_revision(engine) == rev + 2
    got = get_rollout(engine, rid)
    assert got is not None and (got["state"], got["percent"]) == ("aborted", 0.0)
    assert [e["action"] for e in rollout_events(engine, rid)] == ["start", "hold", "abort"]
    # What a replica follows: the running rollouts, and those it knows whatever their state.
    other = _row(model + "_b")
    insert_rollout(engine, other)
    assert [r["id"] for r in following(engine) if r["model"].startswith(model)] == [other["id"]]
    assert {r["id"] for r in following(engine, [rid])} >= {rid, other["id"]}
