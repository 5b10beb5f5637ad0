"""The learned profile's feedback loop, off the request path: train, retrain, say what changed.

:class:`LearnedLoop` (started by the app's lifespan only when the routing profile learns) runs
one loop on the background runner (:class:`~inferlb.background.Periodic`; a failing turn is
logged and the next one comes):

* every ``train_interval_s``: :meth:`PredictorLifecycle.train_pending` on the queued answers
  (prequential error, then update; at most ``_TRAIN_BATCH`` per turn so the event loop is not held);
* every ``retrain_interval_s`` (0: never): a fair comparison on a **held-out window**. When a
  window opens (at construction, after a restore, after each compared retrain) the loop keeps a
  copy of the current predictor as it is then, and the time. At the retrain it reads the newest
  ``retrain_rows`` answered learned decisions from the audit trail (learned/audit.py, in a
  thread); the answers received since the window opened are held out: the live predictor has
  learned them since, but its copy has not, and the candidate, a fresh predictor fitted on the
  answers received *before* the window (in a thread), has not either. Both are scored on the
  held-out answers (mean absolute percentage error of TTFT and TPOT); the candidate is installed
  as the next version when its error is lower (or when the current predictor cannot be used:
  warming, drifted or faulted), after it has learned the held-out answers too, in time order.
  No comparison (fewer than ``retrain_min_rows`` answers before the window: the window moves to
  now, so the next retrain has them; fewer than ``max(10, retrain_min_rows // 4)`` held out: the
  window stays open and grows) is a refusal too, saying why;
* every retrain's outcome is recorded, whatever it is: a ``node_events`` row (node
  ``routing:learned``: ``installed``, or ``retrain_refused`` with the reason), both errors and
  the answer counts as evidence, one log line, and the counter
  ``inferlb_routing_predictor_retrains_total{outcome}`` (learned/metrics.py);
* after each turn: the lifecycle's state changes become ``node_events`` rows (node
  ``routing:learned``, from / to the predictor states, the reason and the error as evidence) and
  log lines; the Prometheus figures are read at scrape time (learned/metrics.py);
* persistence (``routing.predictor.persist``, on by default): at :meth:`start` the predictor
  saved in the database (learned/store.py) is restored with its version when it fits the
  configured one (routing/predictor_state.py), else ignored with a ``restore_ignored`` event
  saying why (routing then starts from the untrained model, as without a saved one); the state is
  saved after each installed retrain, every ``save_interval_s`` and at :meth:`close`. A database
  that is away only costs a log line: routing never waits on it;
* in a cluster (``share``, learned/share.py: workers of one host, replicas on one Redis) one
  replica trains, the trainer the election chose: the others send it their answers and install its
  snapshots; only it retrains and saves (:meth:`leads`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from inferlb.background import Periodic
from inferlb.errors import StoreError
from inferlb.learned.audit import LearnedAttempt, learned_attempts
from inferlb.learned.share import PredictorShare
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
    """Mean absolute percentage error of ``model`` on the rows (each capped at 10; inf: none to score)."""
    errs: list[float] = []
    for x, y in zip(xs, ys, strict=True):
        p = model.predict(x)
        for yhat, yt in ((p.ttft_s, y.ttft_s), (p.tpot_s, y.tpot_s)):
            if yt:
                errs.append(min(10.0, abs(yhat - yt) / yt) if math.isfinite(yhat) else 10.0)
    return sum(errs) / len(errs) if errs else math.inf


@dataclass(frozen=True, slots=True)
class HeldOut:
    """The open held-out window: answers received from ``since`` (epoch s) on are held out, and
    ``model`` is the predictor of ``version`` as it was then (None: there was none, or it could not
    be copied; it then cannot be scored, and a candidate with a finite error wins)."""

    since: float
    version: int
    model: Any


def _rounded(x: float) -> float | None:
    return None if not math.isfinite(x) else round(x, 4)


class LearnedLoop:
    def __init__(self, lifecycle: PredictorLifecycle, *, clock: Clock, engine: Engine | None,
                 record: Callable[[list[NodeEvent]], None] | None = None, share: PredictorShare | None = None
                 ) -> None:
        self.lc = lifecycle
        self.share = share   # a cluster's one trainer and its snapshots (learned/share.py); None: alone
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
        self.window = self._open_window()

    def leads(self) -> bool:
        """True where this process trains: alone, or the cluster's trainer (learned/share.py). Only
        the trainer retrains from the audit trail and saves."""
        return self.share is None or self.share.leads()

    @property
    def _persist(self) -> bool:
        return self.engine is not None and self.lc.p.persist

    async def start(self) -> None:
        if not self._timer.started:
            if self._persist:
                await self.restore()
            if self.share is not None:   # the cluster's newest snapshot, newer than the database's
                await self.share.start()
            self._timer.start()

    async def close(self) -> None:
        if self._timer.started:
            await self._timer.stop()
            if self._persist and self.leads():
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
            self.window = self._open_window()   # the restored model has not seen what comes next
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
        if self.share is not None:
            await self.share.turn()
            self.publish()
        else:
            self.turn()
        leads = self.leads()
        due = self.clock.monotonic() >= self._next_retrain
        if p.retrain_interval_s > 0 and self.engine is not None and due:
            self._next_retrain = self.clock.monotonic() + p.retrain_interval_s
            if leads:
                await self.retrain()
        if p.save_interval_s > 0 and self._persist and self.clock.monotonic() >= self._next_save and leads:
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
            if ev["kind"] == "state":
                text = f"learned routing: predictor v{ev['version']} {ev['from']} → {ev['to']}: {ev['reason']}"
            else:   # installed, restored, retrain_refused...: the reason says it all
                text = f"learned routing: {ev['kind']} (predictor v{ev['version']}): {ev['reason']}"
            (log.warning if ev["to"] in ("drifted", "faulted") else log.info)(text)
            events.append(NodeEvent(EVENT_NODE, ev["from"], ev["to"] if ev["kind"] == "state" else ev["kind"],
                                     ev["reason"], round(float(ev["at"] or self.clock.time()), 6),
                                     {**ev["evidence"], "version": ev["version"]}))
        if events and self.record is not None:
            self.record(events)

    def _open_window(self) -> HeldOut:
        """A new held-out window from now, with a copy of the current predictor (module docstring)."""
        return HeldOut(self.clock.time(), self.lc.version, self._copy(self.lc.model))

    def _copy(self, model: Any) -> Any:
        """A copy of ``model`` that predicts as it does now. The built-in predictor goes through its
        saved state (routing/predictor_state.py: about 2 ms, on the event loop, as training is):
        a deep copy would also copy its per-node cache (0.8 s for a full one). A predictor of your
        own is deep-copied (keep it small); None when it cannot be."""
        if model is None:
            return None
        state = state_of(model)
        if state is not None:
            with contextlib.suppress(IncompatibleState):
                return restore(state, self.lc.p)
        try:
            return copy.deepcopy(model)
        except Exception:   # a user's predictor that cannot be copied: it cannot be scored out of sample
            return None

    async def retrain(self) -> dict[str, Any]:
        """One scheduled retrain from the audit trail (see the module docstring). Returns what
        happened (``outcome`` installed / refused, ``why``, ``reason``, the errors and counts); the
        same is the node event's evidence."""
        assert self.engine is not None
        window = self.window
        if window.version != self.lc.version:   # another model came in since the window opened
            out: dict[str, Any] = {
                "outcome": "refused", "why": "window_reset", "installed": False,
                "reason": (f"retrain refused: predictor v{self.lc.version} replaced v{window.version} after the "
                           "held-out window opened, so it has no window of its own yet; one opens now"),
                "reopen": True}
        else:
            rows = await asyncio.to_thread(learned_attempts, self.engine, limit=self.lc.p.retrain_rows)
            out = await asyncio.to_thread(self._fit, rows, window)
        fresh = out.pop("install", None)
        reopen = bool(out.pop("reopen"))
        self.retrains += 1
        self.last_retrain = out
        self.lc.retrains_total[out["outcome"]] = self.lc.retrains_total.get(out["outcome"], 0) + 1
        evidence = {k: v for k, v in out.items() if k != "reason"}
        if fresh is not None:
            self.lc.install(fresh, out["reason"], evidence)
        else:
            self.lc.note("retrain_refused", out["reason"], evidence)
        if reopen:
            self.window = self._open_window()
        self.publish()
        if fresh is not None and self._persist:
            await self.save()
        return out

    def _fit(self, rows: list[LearnedAttempt], window: HeldOut) -> dict[str, Any]:
        """Split ``rows`` at the window, fit a candidate on the older part and compare it with the
        window's copy of the current predictor on the held-out part (in a thread: the live
        predictor is not touched here; the candidate is returned under ``install`` when it wins)."""
        since = window.since
        xs, ys = training_set(a for a in rows if a.received_at < since)
        hx, hy = training_set(a for a in rows if a.received_at >= since)
        least = self.lc.p.retrain_min_rows
        least_held = max(10, least // 4)
        out: dict[str, Any] = {"outcome": "refused", "installed": False, "rows": len(xs) + len(hx),
                               "trained_on": len(xs), "held_out": len(hx), "window_since": round(since, 6),
                               "current_version": window.version}
        if len(xs) < least:
            out.update(why="too_few_rows", reopen=True, reason=(
                f"retrain refused: {len(xs)} answered learned decisions before the held-out window, fewer than "
                f"{least} to train a candidate on; the window moves to now"))
            return out
        if len(hx) < least_held:
            out.update(why="held_out_too_small", reopen=False, reason=(
                f"retrain refused: {len(hx)} answered learned decisions held out since the window opened, fewer "
                f"than {least_held} to compare on; the window stays open"))
            return out
        params = getattr(self.lc.model, "p", None)
        fresh = OnlineLinear.fit(xs, ys, params if isinstance(params, OnlineLinear.Params) else None,
                                 version=self.lc.version + 1)
        new_err = _mape(fresh, hx, hy)
        try:
            cur_err = _mape(window.model, hx, hy) if window.model is not None else math.inf
        except Exception:   # a user's predictor: whatever it raises, it cannot be scored
            cur_err = math.inf
        usable = self.lc.usable()
        out.update(mape_candidate=_rounded(new_err), mape_current=_rounded(cur_err), reopen=True)
        scores = (f"held-out MAPE {new_err:.4f} (candidate, trained on {len(xs)} earlier answers) vs "
                  f"{cur_err:.4f} (v{window.version}) on the {len(hx)} answers since the window opened")
        if not math.isfinite(new_err):
            out.update(why="candidate_unscored", reason=f"retrain refused: the candidate cannot be scored; {scores}")
            return out
        if new_err < cur_err or not usable:
            for x, y in zip(hx, hy, strict=True):   # it learns the window too before it routes
                fresh.update(x, y)
            why = "better" if new_err < cur_err else "current_unusable"
            how = ("better" if why == "better" else
                   f"installed without winning: the current predictor is {self.lc.state}, so it does not route")
            out.update(outcome="installed", installed=True, why=why, install=fresh,
                       candidate_version=fresh.version,
                       reason=f"retrain installed predictor v{fresh.version} ({how}): {scores}")
            return out
        out.update(why="not_better", reason=f"retrain refused: the candidate is not better; {scores}; "
                                             f"v{window.version} keeps routing")
        return out
