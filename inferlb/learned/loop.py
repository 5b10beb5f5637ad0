"""The learned profile's feedback loop, off the request path: train, retrain, say what changed.

:class:`LearnedLoop` (started by the app's lifespan only when the routing profile learns) runs
one loop on the background runner (:class:`~inferlb.background.Periodic`; a failing turn is
logged and the next one comes):

* every ``train_interval_s``: :meth:`PredictorLifecycle.train_pending` on the queued answers
  (prequential error, then update; at most ``_TRAIN_BATCH`` per turn so the event loop is not held);
* every ``retrain_interval_s`` (0: never): reads the newest ``retrain_rows`` answered learned
  decisions from the audit trail (learned/audit.py, in a thread), fits a fresh predictor
  on the older 80 % (in a thread) and installs it as the next version when its error on the newest
  20 % is lower than the current model's, or when the current one cannot be used;
* after each turn: the lifecycle's state changes become ``node_events`` rows (node
  ``routing:learned``, from / to the predictor states, the reason and the error as evidence) and
  log lines; the Prometheus figures are read at scrape time (learned/metrics.py);
* persistence (``routing.predictor.persist``, on by default): at :meth:`start` the predictor
  saved in the database (learned/store.py) is restored with its version when it fits the
  configured one (routing/predictor_state.py), else ignored with a ``restore_ignored`` event
  saying why (routing then starts from the untrained model, as without a saved one); the state is
  saved after each installed retrain, every ``save_interval_s`` and at :meth:`close`. A database
  that is away only costs a log line: routing never waits on it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy.engine import Engine

from inferlb.background import Periodic
from inferlb.errors import StoreError
from inferlb.learned.audit import LearnedAttempt, learned_attempts
from inferlb.learned.store import load_saved_predictor, save_predictor
from inferlb.node_types import NodeEvent
from inferlb.routing.explain import context_of
from inferlb.routing.features import features
from inferlb.routing.lifecycle import PredictorLifecycle, observed_from
from inferlb.routing.predictor import Observed, OnlineLinear
from inferlb.routing.predictor_state import IncompatibleState, restore, state_of
from inferlb.types import Clock

__all__ = ["EVENT_NODE", "LearnedLoop", "training_set"]

log = logging.getLogger(__name__)

EVENT_NODE = "routing:learned"
_TRAIN_BATCH = 2000


def training_set(rows: Iterable[LearnedAttempt]) -> tuple[list[list[float]], list[Observed]]:
    """Feature rows and observations of the answered attempts (the gateway's like-with-like rule)."""
    xs: list[list[float]] = []
    ys: list[Observed] = []
    for a in rows:
        if a.outcome != "ok" or a.e2e_s is None:
            continue
        try:
            ctx = context_of(a.learned, a.model)
        except (KeyError, TypeError, ValueError):
            continue
        view = next((v for v in ctx.views if v.name == a.node), None)
        if view is None:
            continue
        pred = ctx.preds.get(a.node)
        obs = observed_from(stream=a.stream, completion_tokens=a.completion_tokens or 0, ttfb_s=a.ttfb_s,
                            e2e_s=a.e2e_s, predicted_ttft_s=pred[0] if pred else None)
        if obs is not None:
            xs.append(features(ctx.req, view))
            ys.append(obs)
    return xs, ys


def _mape(model: Any, xs: Sequence[Sequence[float]], ys: Sequence[Observed]) -> float:
    errs: list[float] = []
    for x, y in zip(xs, ys, strict=True):
        p = model.predict(x)
        for yhat, yt in ((p.ttft_s, y.ttft_s), (p.tpot_s, y.tpot_s)):
            if yt:
                errs.append(min(10.0, abs(yhat - yt) / yt) if math.isfinite(yhat) else 10.0)
    return sum(errs) / len(errs) if errs else math.inf


class LearnedLoop:
    def __init__(self, lifecycle: PredictorLifecycle, *, clock: Clock, engine: Engine | None,
                 record: Callable[[list[NodeEvent]], None] | None = None) -> None:
        self.lc = lifecycle
        self.clock = clock
        self.engine = engine
        self.record = record
        self.retrains = 0
        self.last_retrain: dict[str, Any] | None = None
        self._timer: Periodic[None] = Periodic(
            "inferlb-learned-routing", self._turn, interval_s=lambda: self.lc.p.train_interval_s, logger=log)
        self._next_retrain = clock.monotonic() + lifecycle.p.retrain_interval_s
        self._next_save = clock.monotonic() + lifecycle.p.save_interval_s
        self.saves = 0
        self.last_saved: dict[str, Any] | None = None
        self.restored: dict[str, Any] | None = None
        self._stored: tuple[Any, Any] | None = None   # (version, seen) the database holds from here
        self._replace_untrained = False   # True once the saved row proved unusable: any save helps then

    @property
    def _persist(self) -> bool:
        return self.engine is not None and self.lc.p.persist

    async def start(self) -> None:
        if not self._timer.started:
            if self._persist:
                await self.restore()
            self._timer.start()

    async def close(self) -> None:
        if self._timer.started:
            await self._timer.stop()
            if self._persist:
                await self.save()

    async def restore(self) -> dict[str, Any] | None:
        """Restore the saved predictor (see the module docstring); what happened, or None when
        nothing was saved."""
        assert self.engine is not None
        try:
            saved = await asyncio.to_thread(load_saved_predictor, self.engine, EVENT_NODE)
        except StoreError as exc:
            log.warning("learned routing: the saved predictor cannot be read (%s); starting untrained", exc)
            return {"restored": False, "why": str(exc)}
        if saved is None:
            return None
        evidence = {"saved_version": saved.version, "saved_at": saved.saved_at, "type": saved.type}
        try:
            if saved.problem is not None:
                raise IncompatibleState(saved.problem)
            model = restore(saved.state, self.lc.p)
        except IncompatibleState as exc:
            self.lc.note("restore_ignored", f"saved predictor v{saved.version} ignored: {exc}; "
                         "starting from the untrained model", evidence)
            out: dict[str, Any] = {"restored": False, "why": str(exc), **evidence}
            self._replace_untrained = True
        else:
            self.lc.restore(model, "restored from the database", {**evidence, "seen": model.seen})
            out = {"restored": True, **evidence}
            self._stored = (saved.version, model.seen)
        self.restored = out
        self.publish()
        return out

    async def save(self) -> bool:
        """Save the current predictor (a snapshot taken here, on the loop; written in a thread).
        False when there is nothing this gateway saves, nothing new to save (the very state restored
        or saved last; or a predictor that has seen nothing, unless the saved row was unusable:
        replicas share the row, so an idle or untrained replica must not overwrite a trained
        one's), or the database refused (logged)."""
        assert self.engine is not None
        state = state_of(self.lc.model)
        if state is None or (state["version"], state["seen"]) == self._stored:
            return False
        if not state["seen"] and not self._replace_untrained:
            return False
        at = self.clock.time()
        try:
            await asyncio.to_thread(save_predictor, self.engine, EVENT_NODE, state, at=at)
        except StoreError as exc:
            log.warning("learned routing: saving predictor v%s failed: %s", state["version"], exc)
            return False
        self.saves += 1
        self._stored = (state["version"], state["seen"])
        self.last_saved = {"version": state["version"], "seen": state["seen"], "at": round(at, 6)}
        return True

    async def _turn(self) -> None:
        # A failing turn is logged by the timer and the next one comes; routing falls back by itself.
        p = self.lc.p
        self.turn()
        due = self.clock.monotonic() >= self._next_retrain
        if p.retrain_interval_s > 0 and self.engine is not None and due:
            self._next_retrain = self.clock.monotonic() + p.retrain_interval_s
            await self.retrain()
        if p.save_interval_s > 0 and self._persist and self.clock.monotonic() >= self._next_save:
            self._next_save = self.clock.monotonic() + p.save_interval_s
            await self.save()

    def turn(self) -> int:
        """Train on what is queued, then publish the state changes. Returns observations trained."""
        n = self.lc.train_pending(limit=_TRAIN_BATCH)
        self.publish()
        return n

    def publish(self) -> None:
        events = []
        for ev in self.lc.take_events():
            text = f"learned routing: predictor v{ev['version']} {ev['from']} → {ev['to']}: {ev['reason']}"
            (log.warning if ev["to"] in ("drifted", "faulted") else log.info)(text)
            events.append(NodeEvent(EVENT_NODE, ev["from"], ev["to"] if ev["kind"] == "state" else ev["kind"],
                                     ev["reason"], round(float(ev["at"] or self.clock.time()), 6),
                                     {**ev["evidence"], "version": ev["version"]}))
        if events and self.record is not None:
            self.record(events)

    async def retrain(self) -> dict[str, Any]:
        """One scheduled retrain from the audit trail (see the module docstring)."""
        assert self.engine is not None
        rows = await asyncio.to_thread(learned_attempts, self.engine, limit=self.lc.p.retrain_rows)
        out = await asyncio.to_thread(self._fit, rows)
        self.retrains += 1
        self.last_retrain = out
        if out.get("install") is not None:
            self.lc.install(out.pop("install"), "scheduled retrain from the audit trail", out)
            if self._persist:
                await self.save()
        self.publish()
        return out

    def _fit(self, rows: list[LearnedAttempt]) -> dict[str, Any]:
        xs, ys = training_set(rows)
        least = self.lc.p.retrain_min_rows
        if len(xs) < least:
            return {"rows": len(xs), "installed": False, "why": f"fewer than {least} answered learned decisions"}
        cut = int(len(xs) * 0.8)
        params = getattr(self.lc.model, "p", None)
        fresh = OnlineLinear.fit(xs[:cut], ys[:cut], params if isinstance(params, OnlineLinear.Params) else None,
                                 version=self.lc.version + 1)
        new_err = _mape(fresh, xs[cut:], ys[cut:])
        cur = self.lc.model
        try:
            cur_err = _mape(cur, xs[cut:], ys[cut:]) if cur is not None else math.inf
        except Exception:
            cur_err = math.inf
        better = new_err < cur_err or not self.lc.usable()
        out: dict[str, Any] = {"rows": len(xs), "holdout": len(xs) - cut, "mape_new": round(new_err, 4),
                               "mape_current": None if math.isinf(cur_err) else round(cur_err, 4),
                               "installed": better}
        if better:
            out["install"] = fresh
        return out
