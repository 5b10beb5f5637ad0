"""The scheduled retrain is a fair comparison, and says what it did (learned/loop.py).

The current predictor (a copy taken when the held-out window opened) and the candidate (fitted on
the answers before the window) are scored on the same held-out answers, which neither trained on;
every outcome is a ``routing:learned`` node event with both errors, a log line and a count in
``inferlb_routing_predictor_retrains_total{outcome}``. The audit trail is replaced by a list of
answers built here (deterministic), and the clock is a ManualClock.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine

import inferlb.learned.loop as loop_mod
from inferlb.learned.audit import LearnedAttempt
from inferlb.learned.loop import EVENT_NODE, LearnedLoop, training_set
from inferlb.learned.metrics import LearnedCollector
from inferlb.node_types import NodeEvent
from inferlb.routing.lifecycle import LifecycleParams, PredictorLifecycle
from inferlb.routing.predictor import Observed, OnlineLinear, Prediction
from inferlb.types import ManualClock

# Each world says how slow each GPU type is (× a base TTFT of 50 ms per request in flight and a
# TPOT of 10 ms). In "swapped" the fast and slow GPUs trade places.
WORLDS = {"true": {"h100": 1.0, "t4": 3.0}, "swapped": {"h100": 3.0, "t4": 1.0}}


def _answers(n: int, *, world: str, start: float, seed: int) -> list[LearnedAttempt]:
    """``n`` streamed answers received one second apart from ``start``, as the audit trail holds them."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        gpu = rng.choice(("h100", "t4"))
        name = f"{gpu}-{rng.randrange(3)}"
        inflight = rng.randrange(12)
        tokens = rng.randrange(20, 400)
        k = WORLDS[world][gpu]
        ttft, tpot = 0.05 * k * (1 + inflight), 0.01 * k
        learned = {"req": {"prompt_tokens": rng.randrange(50, 3000), "output_tokens": tokens, "stream": True},
                   "ctx": {"node": [name], "inflight_requests": [inflight], "inflight_tokens": [inflight * 300],
                           "capacity_tokens": [50_000], "max_concurrency": [64]},
                   "gpu": {name: gpu}}
        out.append(LearnedAttempt(request_id=f"{world}-{seed}-{i}", model="m", learned=learned, node=name,
                                  outcome="ok", stream=True, completion_tokens=tokens, ttfb_s=ttft,
                                  e2e_s=ttft + tpot * (tokens - 1), received_at=start + i))
    return out


class Memorizer:
    """A predictor that remembers every row it learned and knows nothing else: in-sample it is
    perfect, out of sample it predicts a constant. Scored on rows it trained on, it always wins."""

    def __init__(self) -> None:
        self.version = 1
        self.seen = 0
        self.table: dict[tuple[float, ...], Prediction] = {}

    def predict(self, row: Sequence[float]) -> Prediction:
        return self.table.get(tuple(row), Prediction(0.5, 0.05))

    def predict_nodes(self, req: Any, nodes: Any) -> Any:
        raise NotImplementedError

    def update(self, row: Sequence[float], observed: Observed) -> None:
        self.seen += 1
        self.table[tuple(row)] = Prediction(observed.ttft_s or 0.5, observed.tpot_s or 0.05)


PARAMS = LifecycleParams(min_samples=10, train_interval_s=60, retrain_interval_s=0, retrain_min_rows=100,
                         persist=False)


@pytest.fixture
def engine() -> Iterator[Engine]:
    eng = create_engine("sqlite://")   # never read: the audit trail is the list below
    yield eng
    eng.dispose()


class Setup:
    def __init__(self, lc: PredictorLifecycle, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock = ManualClock()
        self.events: list[NodeEvent] = []
        self.audit: list[LearnedAttempt] = []
        self.lc = lc
        self.loop = LearnedLoop(lc, clock=self.clock, engine=engine, record=self.events.extend)
        monkeypatch.setattr(loop_mod, "learned_attempts", lambda _engine, **_kw: list(self.audit))

    def live(self, answers: list[LearnedAttempt]) -> None:
        """Answers the gateway served: in the audit trail, and learned online by the live predictor."""
        self.audit.extend(answers)
        xs, ys = training_set(answers)
        for x, y in zip(xs, ys, strict=True):
            self.lc.observe(x, y)
        self.lc.train_pending()
        self.loop.publish()
        self.events.clear()

    def metric(self) -> str:
        reg = CollectorRegistry()
        reg.register(LearnedCollector(self.lc))
        return generate_latest(reg).decode()


def _trained_lifecycle(world: str, n: int, seed: int) -> PredictorLifecycle:
    lc = PredictorLifecycle(PARAMS, clock=lambda: 1.0)
    xs, ys = training_set(_answers(n, world=world, start=0.0, seed=seed))
    for x, y in zip(xs, ys, strict=True):
        lc.observe(x, y)
    lc.train_pending()
    return lc


async def test_both_are_scored_on_a_window_neither_trained_on(engine: Engine, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    # The current predictor learns every answer it serves. Scored on answers it has learned (the
    # old rule), a memorizing one is perfect and no candidate ever beats it; its copy from when the
    # window opened has not seen the window's answers, and the candidate is better there.
    lc = PredictorLifecycle(PARAMS, clock=lambda: 1.0, model=Memorizer())
    s = Setup(lc, engine, monkeypatch)
    t0 = s.clock.time()
    s.live(_answers(300, world="true", start=t0 - 400, seed=1))    # before the window
    assert lc.usable()
    s.live(_answers(80, world="true", start=t0 + 10, seed=2))      # the window: learned live too
    with caplog.at_level(logging.INFO, logger="inferlb.learned.loop"):
        out = await s.loop.retrain()
    assert out["outcome"] == "installed" and out["why"] == "better", out
    assert out["trained_on"] == 300 and out["held_out"] == 80
    assert out["mape_candidate"] < out["mape_current"]
    assert isinstance(lc.model, OnlineLinear) and lc.version == 2
    assert lc.model.seen == 300 + 80   # it learned the window too before routing
    ev = [e for e in s.events if e.to_state == "installed"]
    assert len(ev) == 1 and ev[0].node == EVENT_NODE and "installed predictor v2" in ev[0].reason
    assert ev[0].evidence["mape_candidate"] == out["mape_candidate"]
    assert ev[0].evidence["mape_current"] == out["mape_current"]
    lines = [r.getMessage() for r in caplog.records if "retrain" in r.getMessage()]
    assert len(lines) == 1 and "installed predictor v2" in lines[0]
    assert 'inferlb_routing_predictor_retrains_total{outcome="installed"} 1.0' in s.metric()
    # a new window opens with the installed model; nothing is held out yet
    assert s.loop.window.version == 2 and s.loop.window.since == s.clock.time()


async def test_a_better_candidate_is_installed(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # The current predictor learned a fleet whose speeds have since changed (the fast GPUs became
    # the slow ones); the candidate trains on answers since the change, before the window.
    lc = _trained_lifecycle("swapped", 1500, seed=3)
    s = Setup(lc, engine, monkeypatch)
    t0 = s.clock.time()
    s.audit.extend(_answers(300, world="true", start=t0 - 400, seed=4))   # another replica's answers
    s.live(_answers(60, world="true", start=t0 + 5, seed=5))
    # the window's copy is the predictor as it was when the window opened, apart from the live one
    frozen = s.loop.window.model
    assert isinstance(frozen, OnlineLinear) and frozen is not lc.model
    assert frozen.seen == 1500 and lc.learned == 1560
    out = await s.loop.retrain()
    assert out["outcome"] == "installed" and out["mape_candidate"] < out["mape_current"], out
    assert lc.version == 2


async def test_a_worse_candidate_is_refused_and_says_so(engine: Engine, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    # The current predictor knows the fleet; the answers before the window are misleading (another
    # replica's, from the fleet as it was): a candidate fitted on them is worse on the window.
    lc = _trained_lifecycle("true", 1500, seed=6)
    s = Setup(lc, engine, monkeypatch)
    t0 = s.clock.time()
    s.audit.extend(_answers(300, world="swapped", start=t0 - 400, seed=7))
    s.live(_answers(60, world="true", start=t0 + 5, seed=8))
    before = lc.model
    with caplog.at_level(logging.INFO, logger="inferlb.learned.loop"):
        out = await s.loop.retrain()
    assert out["outcome"] == "refused" and out["why"] == "not_better", out
    assert out["mape_candidate"] > out["mape_current"]
    assert lc.model is before and lc.version == 1
    [ev] = [e for e in s.events if e.node == EVENT_NODE]
    assert ev.to_state == "retrain_refused" and "not better" in ev.reason and "v1 keeps routing" in ev.reason
    assert ev.evidence["mape_candidate"] == out["mape_candidate"] and ev.evidence["mape_current"] is not None
    assert ev.evidence["held_out"] == 60 and ev.evidence["trained_on"] == 300
    lines = [r.getMessage() for r in caplog.records if "retrain refused" in r.getMessage()]
    assert len(lines) == 1
    text = s.metric()
    assert 'inferlb_routing_predictor_retrains_total{outcome="refused"} 1.0' in text
    assert 'inferlb_routing_predictor_retrains_total{outcome="installed"} 0.0' in text


async def test_no_comparison_is_a_refusal_saying_why(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    lc = _trained_lifecycle("true", 300, seed=9)
    s = Setup(lc, engine, monkeypatch)
    t0 = s.clock.time()
    # everything is in the window: nothing before it to train on; the window moves to now
    s.live(_answers(150, world="true", start=t0 + 1, seed=10))
    s.clock.advance(600)
    out = await s.loop.retrain()
    assert out["outcome"] == "refused" and out["why"] == "too_few_rows" and out["trained_on"] == 0
    assert s.loop.window.since == s.clock.time()
    first = [e.to_state for e in s.events]
    # now they are all before the window, and too few are held out: the window stays open
    s.live(_answers(5, world="true", start=s.clock.time() + 1, seed=11))
    out = await s.loop.retrain()
    assert out["why"] == "held_out_too_small" and out["held_out"] == 5 and s.loop.window.since == t0 + 600
    assert first == ["retrain_refused"] and [e.to_state for e in s.events] == ["retrain_refused"]
    assert lc.retrains_total == {"installed": 0, "refused": 2}
