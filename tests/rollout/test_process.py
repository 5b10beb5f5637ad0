"""rollout.bpmn on real SpiffWorkflow with an injected clock (no sleeping): a healthy canary is
promoted step by step to 100 %, a failing or slow one is rolled back (slow: over the SLO, or
2.9× slower at its nodes inside it), one as fast at its nodes is promoted, an edited copy of the
process behaves as edited, and bad requests change nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inferlb.errors import ClientError, InvalidRequest
from inferlb.rollout.errors import RolloutBusy, RolloutNotFound
from tests.rollout.rig import MAIN, Rig, rig

CRITERIA: dict[str, Any] = {"min_requests": 100, "min_step_s": 10, "max_step_s": 600, "window_s": 300,
                            "max_error_rate_increase": 0.02, "max_slo_miss_increase": 0.05}


async def drive(r: Rig, *, rate: int = 200, rounds: int = 200, **feed: Any) -> list[dict[str, Any]]:
    """Rounds every 5 (virtual) seconds with ``rate`` requests a second in between, until the
    rollout ends (at most ``rounds``)."""
    out = []
    rollout = next(iter(r.manager.rollouts.values()))
    for _ in range(rounds):
        for _ in range(5):
            r.clock.advance(1.0)
            r.feed(rate, **feed)
        out.extend(await r.manager.run_once())
        if not rollout.running:
            break
    return out


async def test_a_healthy_canary_is_promoted_to_100_percent() -> None:
    r = rig()
    ro = await r.manager.start_rollout(r.spec(criteria=CRITERIA))
    assert ro.percent == 1.0 and r.versions.get("m").shares()["v2"] == pytest.approx(0.01)   # type: ignore[union-attr]
    rounds = await drive(r)
    assert ro.state == "completed" and ro.percent == 100.0
    mv = r.versions.get("m")
    assert mv is not None and mv.shares() == {"v1": 0.0, "v2": 1.0}
    # Each round ran the whole process on SpiffWorkflow; promotions went through `promote`.
    assert r.manager.process is not None and r.manager.process.mode == "spiff"
    promoted = [x for x in rounds if "promote" in x["path"]]
    assert [x["promoted"]["percent"] for x in promoted] == [5.0, 25.0, 50.0, 100.0]
    assert promoted[0]["path"] == ["start", "observe", "decide", "gw_action", "promote", "gw_merge", "record", "end"]
    held = [x for x in rounds if x["decision"]["action"] == "hold"]
    assert held and held[0]["path"] == ["start", "observe", "decide", "gw_action", "gw_merge", "record", "end"]
    # No promotion before the guard had min_requests of the canary, at every step.
    for x in promoted:
        assert x["observation"]["canary"]["attempts"] >= 100 and x["observation"]["step_age_s"] >= 10
    assert r.manager.decisions[("m", "complete")] == 1 and r.manager.decisions[("m", "promote")] == 3


async def test_a_canary_with_5_percent_errors_is_rolled_back_at_the_first_step() -> None:
    r = rig()
    ro = await r.manager.start_rollout(r.spec(criteria=CRITERIA))
    rounds = await drive(r, errors={"v2": 0.05})
    assert ro.state == "rolled_back" and ro.percent == 0.0
    assert "error rate" in (ro.reason or "")
    last = rounds[-1]
    assert last["path"][-4:] == ["rollback", "gw_merge", "record", "end"]
    assert last["rolled_back"] == {"percent": 0.0, "state": "rolled_back"}
    errors = next(c for c in last["decision"]["checks"] if c["test"] == "errors")
    assert errors["status"] == "worse" and errors["lower"] > 0.01
    mv = r.versions.get("m")
    assert mv is not None and mv.shares() == {"v1": 1.0, "v2": 0.0}     # the weights from before
    # It was decided at 1 %: the bad version saw about 1 % of the requests until then.
    assert r.served.get("v2", 0) / sum(r.served.values()) < 0.02


async def test_a_canary_twice_as_slow_is_rolled_back_on_the_slo() -> None:
    r = rig()
    ro = await r.manager.start_rollout(r.spec(criteria=CRITERIA))
    # Baseline e2e 0.6 s (SLO 1.0 s); twice as slow is 1.2 s: every canary request misses it.
    await drive(r, e2e={"v1": 0.6, "v2": 1.2})
    assert ro.state == "rolled_back" and "SLO" in (ro.reason or "")


async def test_a_canary_2_9x_slower_at_its_nodes_is_rolled_back_on_latency_inside_the_slo() -> None:
    r = rig()
    ro = await r.manager.start_rollout(r.spec(criteria=CRITERIA))
    # Both versions meet the SLO (e2e 0.2 s of 1.0 s); v2's nodes are 2.9× slower to the first byte and per token.
    rounds = await drive(r, node_ttft={"v1": 0.05, "v2": 0.145})
    assert ro.state == "rolled_back" and ro.step == 0
    assert (ro.reason or "").startswith("ttft (time to first byte at the node) slower than the baseline: ")
    checks = {c["test"]: c for c in rounds[-1]["decision"]["checks"]}
    assert checks["errors"]["canary"][0] == 0 and checks["slo"]["canary"][0] == 0    # no error, no SLO miss
    for metric in ("latency_ttft", "latency_tpot"):
        assert checks[metric]["status"] == "worse" and 2.6 < checks[metric]["estimate"] < 3.2
    # The observation carried the sums through the process's data: the decision is recomputable from it.
    obs = rounds[-1]["observation"]
    assert obs["canary"]["latency"]["ttft"]["n"] == checks["latency_ttft"]["canary"][0] >= 100


async def test_a_canary_as_fast_at_its_nodes_is_promoted_with_the_latency_tests_within() -> None:
    r = rig()
    ro = await r.manager.start_rollout(r.spec(criteria=CRITERIA))
    rounds = await drive(r, node_ttft={"v1": 0.05, "v2": 0.05})
    assert ro.state == "completed"
    promoted = [x for x in rounds if "promote" in x["path"]]
    assert len(promoted) == 4
    for x in promoted:
        tests = {c["test"]: c["status"] for c in x["decision"]["checks"]}
        assert tests == {"errors": "within", "slo": "within", "latency_ttft": "within", "latency_tpot": "within"}


async def test_a_canary_never_shown_safe_is_rolled_back_at_max_step_s() -> None:
    r = rig()
    ro = await r.manager.start_rollout(r.spec(criteria={**CRITERIA, "max_step_s": 60}))
    await drive(r, rate=2)   # 1 % of 2 requests a second: never min_requests within a minute
    assert ro.state == "rolled_back" and "max_step_s" in (ro.reason or "")


async def test_an_edited_process_behaves_as_edited(tmp_path: Path) -> None:
    """An operator sets ``min_requests`` = 100000 on *Decide* in a modeler: the guard never has
    enough data, so every round holds (the parameter overrides the rollout's criteria)."""
    text = MAIN.read_text()
    anchor = "Inputs (optional) override the rollout's criteria.</bpmn:documentation>"
    assert anchor in text
    edited = text.replace(anchor, anchor + "\n      <bpmn:extensionElements><camunda:inputOutput>"
                          '<camunda:inputParameter name="min_requests">100000</camunda:inputParameter>'
                          "</camunda:inputOutput></bpmn:extensionElements>")
    path = tmp_path / "rollout_strict.bpmn"
    path.write_text(edited)
    r = rig(path)
    ro = await r.manager.start_rollout(r.spec(criteria={**CRITERIA, "max_step_s": 10_000}))
    rounds = await drive(r, rounds=20)
    assert ro.running and ro.percent == 1.0
    assert {x["decision"]["action"] for x in rounds} == {"hold"}


async def test_bad_requests_are_refused_and_change_nothing() -> None:
    r = rig()
    before = r.versions.get("m")
    for spec, param in ((r.spec(to_version="v9"), "to_version"), (r.spec(to_version="v1"), "to_version"),
                        (r.spec(criteria={"confidence": 2.0}), "criteria.confidence"),
                        (r.spec(criteria={"min_reqs": 5}), "criteria.min_reqs")):
        with pytest.raises(InvalidRequest) as exc:
            await r.manager.start_rollout(spec)
        assert exc.value.param == param and exc.value.status == 400
    with pytest.raises(InvalidRequest):
        await r.manager.start_rollout(r.spec().model_copy(update={"model": "nope"}))
    assert r.versions.get("m") is before and r.manager.rollouts == {}
    ro = await r.manager.start_rollout(r.spec(criteria=CRITERIA))
    with pytest.raises(RolloutBusy) as busy:
        await r.manager.start_rollout(r.spec())
    assert busy.value.status == 409
    with pytest.raises(RolloutNotFound):
        await r.manager.abort("ro_nope")
    await r.manager.abort(ro.id)
    assert ro.state == "aborted" and r.versions.get("m").shares()["v2"] == 0.0   # type: ignore[union-attr]
    with pytest.raises(ClientError) as again:
        await r.manager.abort(ro.id)
    assert again.value.status == 409
    # Aborted, the model is free for a new rollout.
    assert (await r.manager.start_rollout(r.spec(criteria=CRITERIA))).running


async def test_rollouts_are_recorded_and_resume_after_a_restart(tmp_path: Path) -> None:
    from inferlb.rollout.store import rollout_events
    from inferlb.store.db import make_engine, upgrade

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        r = rig(engine=engine)
        ro = await r.manager.start_rollout(r.spec(steps=[1, 50, 100], criteria=CRITERIA))
        while ro.percent < 50:
            for _ in range(5):
                r.clock.advance(1.0)
                r.feed(200)
            await r.manager.run_once()
        assert ro.running and ro.percent == 50.0
        actions = [e["action"] for e in rollout_events(engine, ro.id)]
        assert actions[0] == "start" and actions[-1] == "promote" and set(actions[1:-1]) <= {"hold"}
        # A new gateway process on the same database: the rollout continues at 50 %.
        again = rig(engine=engine)
        again.clock.advance(r.clock.time() - again.clock.time() + 1.0)   # the wall clock moved on meanwhile
        await again.manager.resume()
        back = again.manager.get(ro.id)
        assert back is not None and back.running and back.percent == 50.0
        assert again.versions.get("m").shares() == {"v1": 0.5, "v2": 0.5}   # type: ignore[union-attr]
        await again.manager.abort(ro.id)
        assert [e["action"] for e in rollout_events(engine, ro.id)][-1] == "abort"
        # A completed rollout is re-applied while the fleet file still has the weights it started from.
        done = await again.manager.start_rollout(again.spec(steps=[50, 100], criteria={**CRITERIA, "min_requests": 1}))
        again.clock.advance(11.0)
        again.feed(400)
        again.clock.advance(1.0)
        await again.manager.run_once()
        assert done.state == "completed"
        third = rig(engine=engine)
        third.clock.advance(again.clock.time() - third.clock.time() + 1.0)
        await third.manager.resume()
        assert third.versions.get("m").shares() == {"v1": 0.0, "v2": 1.0}   # type: ignore[union-attr]
    finally:
        engine.dispose()
