"""The learned routing predictor survives a restart (routing/predictor_state.py, learned/store.py,
learned/loop.py): saved at shutdown and after a retrain, restored at start with its version
and the very same predictions; a damaged or incompatible saved state is ignored with an event,
and routing goes on."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from inferlb.learned.loop import EVENT_NODE, LearnedLoop
from inferlb.learned.store import load_saved_predictor, save_predictor
from inferlb.node_types import NodeEvent
from inferlb.routing.features import features
from inferlb.routing.lifecycle import LifecycleParams, PredictorLifecycle
from inferlb.routing.predictor import Observed, OnlineLinear
from inferlb.routing.predictor_state import IncompatibleState, restore, state_of
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeView, RouteRequest
from inferlb.store.db import make_engine, upgrade
from inferlb.types import ManualClock


def _node(name: str, inflight: int, gpu: str) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=50_000, max_concurrency=64,
                    inflight_requests=inflight, inflight_tokens=inflight * 400, labels=(("gpu", gpu),))


def _data(n: int, seed: int = 5) -> list[tuple[RouteRequest, NodeView, Observed]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        fast = rng.random() < 0.5
        node = _node(("fast" if fast else "slow") + str(rng.randrange(3)), rng.randrange(12),
                     "h100" if fast else "t4")
        req = RouteRequest("m", rng.randrange(50, 3000), rng.randrange(10, 500), stream=rng.random() < 0.5)
        k = 1.0 if fast else 3.0
        out.append((req, node, Observed(0.02 * k * (1 + node.inflight_requests), 0.01 * k)))
    return out


def _trained(params: LifecycleParams, n: int = 300) -> PredictorLifecycle:
    lc = PredictorLifecycle(params, clock=lambda: 1.0)
    for req, node, obs in _data(n):
        lc.observe(features(req, node), obs)
    lc.train_pending()
    return lc


def _probe() -> list[tuple[RouteRequest, list[NodeView]]]:
    return [(req, [node, _node("other", 3, "a100")]) for req, node, _ in _data(20, seed=9)]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _loop(lc: PredictorLifecycle, engine: Engine, events: list[NodeEvent]) -> LearnedLoop:
    return LearnedLoop(lc, clock=ManualClock(), engine=engine, record=events.extend)


# ---------------------------------------------------------------- the state, pure


def test_state_round_trips_through_json_with_identical_predictions() -> None:
    lc = _trained(LifecycleParams(min_samples=10))
    model = lc.model
    assert isinstance(model, OnlineLinear) and model.seen == 300
    back = restore(json.loads(json.dumps(state_of(model))), lc.p)
    assert back.version == model.version and back.seen == model.seen
    for req, nodes in _probe():
        assert back.predict_nodes(req, nodes) == model.predict_nodes(req, nodes)
    assert state_of(object()) is None                      # a predictor of the operator's own: not saved


@pytest.mark.parametrize(("change", "why"), [
    ({"format": "something-else/9"}, "format"),
    ({"features": ["bias"]}, "other features"),
    ({"params": {"forget": 0.99}}, "saved with params"),
    ({"version": True}, "version"),
    ({"seen": -1}, "seen"),
    ({"w": [[0.0, 0.0]]}, "w: shape"),
    ({"d": "garbage"}, "d: missing or not numbers"),
    ({"e": [[float("nan")] * 40, [0.0] * 40]}, "e:"),
])
def test_an_incompatible_or_damaged_state_is_refused_saying_why(change: dict[str, Any], why: str) -> None:
    lc = _trained(LifecycleParams(), n=20)
    state = {**(state_of(lc.model) or {}), **change}
    with pytest.raises(IncompatibleState, match=why):
        restore(state, lc.p)
    with pytest.raises(IncompatibleState, match="configured 'pkg:Mine'"):
        restore(state_of(lc.model), LifecycleParams(type="pkg:Mine"))
    with pytest.raises(IncompatibleState, match="not a mapping"):
        restore([1, 2], lc.p)


# ---------------------------------------------------------------- through the feedback loop and the database


async def test_a_restart_over_the_same_database_restores_version_and_predictions(engine: Engine) -> None:
    params = LifecycleParams(min_samples=10, train_interval_s=60, retrain_interval_s=0)
    lc = _trained(params)
    fitted = OnlineLinear.fit([features(r, n) for r, n, _ in _data(400, 7)], [o for *_, o in _data(400, 7)])
    lc.install(fitted, "a retrain")                        # version 2, as a scheduled retrain makes
    lc.observe(features(*_data(1, 3)[0][:2]), Observed(0.05, 0.01))
    lc.train_pending()                                     # …and it learned online since
    events: list[NodeEvent] = []
    first = _loop(lc, engine, events)
    await first.start()
    assert first.restored is None                          # nothing saved yet
    await first.close()                                    # shutdown saves
    assert first.saves == 1 and first.last_saved is not None and first.last_saved["version"] == 2
    saved = load_saved_predictor(engine, EVENT_NODE)
    assert saved is not None and saved.version == 2 and saved.type == "online-linear"

    again = PredictorLifecycle(params, clock=lambda: 2.0)  # a new gateway: the configured, untrained model
    assert again.version == 1 and again.state == "warming"
    second = _loop(again, engine, events)
    await second.start()
    try:
        assert again.version == lc.version == 2 and again.state == "active"
        assert again.learned == lc.learned
        assert again.model is not None and lc.model is not None
        for req, nodes in _probe():
            assert again.model.predict_nodes(req, nodes) == lc.model.predict_nodes(req, nodes)
        restored = [e for e in events if e.to_state == "restored"]
        assert len(restored) == 1 and restored[0].node == EVENT_NODE
        assert restored[0].evidence["saved_version"] == 2 and restored[0].evidence["version"] == 2
        # the version sequence goes on from the restored one
        again.install(OnlineLinear.fit([features(r, n) for r, n, _ in _data(50)], [o for *_, o in _data(50)]), "x")
        assert again.version == 3
    finally:
        await second.close()


@pytest.mark.parametrize("damage", ["params", "json"])
async def test_a_damaged_or_incompatible_save_is_ignored_with_an_event(engine: Engine, damage: str) -> None:
    params = LifecycleParams(min_samples=10, train_interval_s=60, retrain_interval_s=0)
    lc = _trained(params)
    save_predictor(engine, EVENT_NODE, state_of(lc.model) or {}, at=5.0)
    if damage == "json":
        with engine.begin() as conn:
            conn.execute(text("UPDATE routing_predictors SET state = '{\"format\": [1, 2' WHERE name = :n"),
                         {"n": EVENT_NODE})
        fresh = PredictorLifecycle(params)
    else:   # the operator changed the predictor's params since it was saved
        fresh = PredictorLifecycle(params.model_copy(update={"params": {"ridge": 5.0}}))
    events: list[NodeEvent] = []
    loop = _loop(fresh, engine, events)
    await loop.start()
    try:
        assert fresh.version == 1 and fresh.state == "warming" and fresh.learned == 0   # the untrained model
        ignored = [e for e in events if e.to_state == "restore_ignored"]
        assert len(ignored) == 1 and ignored[0].from_state == "warming"
        assert ("not valid JSON" if damage == "json" else "saved with params") in ignored[0].reason
        assert loop.restored is not None and loop.restored["restored"] is False
        # routing goes on: the guard's fallback decides while the fresh model warms up
        router = build_router("learned", lifecycle=fresh, seed=1)
        d = router.decide(RouteRequest("m", 10, 10), [_node("a", 0, "h100")])
        assert d.pick == "a" and d.learned is not None and d.learned.fallback == "token-aware"
    finally:
        await loop.close()
    assert loop.saves == 1                                 # shutdown replaced the damaged row with a usable one
    saved = load_saved_predictor(engine, EVENT_NODE)
    assert saved is not None and saved.problem is None and restore(saved.state, fresh.p).seen == 0


async def test_persistence_off_saves_and_restores_nothing(engine: Engine) -> None:
    params = LifecycleParams(min_samples=10, persist=False)
    loop = _loop(_trained(params), engine, [])
    await loop.start()
    await loop.close()
    assert loop.saves == 0 and load_saved_predictor(engine, EVENT_NODE) is None


async def test_an_idle_or_untrained_replica_never_overwrites_a_trained_save(engine: Engine) -> None:
    """Replicas share the saved row: one that learned nothing since it restored, or never
    trained, leaves a trained predictor in place (at shutdown and on the save interval)."""
    params = LifecycleParams(min_samples=10, train_interval_s=60, retrain_interval_s=0)
    trained = _trained(params)
    writer = _loop(trained, engine, [])
    await writer.start()
    await writer.close()
    saved = load_saved_predictor(engine, EVENT_NODE)
    assert writer.saves == 1 and saved is not None
    seen = json.loads(json.dumps(saved.state))["seen"]
    assert seen > 0

    idle = _loop(PredictorLifecycle(params, clock=lambda: 2.0), engine, [])
    await idle.start()                                     # restores the trained state, learns nothing
    assert await idle.save() is False
    await idle.close()
    assert idle.saves == 0

    fresh = PredictorLifecycle(params, clock=lambda: 3.0)  # untrained, and never restored (as after a failed read)
    untrained = _loop(fresh, engine, [])
    assert await untrained.save() is False and untrained.saves == 0
    after = load_saved_predictor(engine, EVENT_NODE)
    assert after is not None and after.saved_at == saved.saved_at and after.state["seen"] == seen
