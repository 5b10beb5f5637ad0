"""The latency predictor's life: loaded, warming up, trained, watched, swapped, faulted.

:class:`PredictorLifecycle` owns the active predictor and decides whether routing may use it
(:meth:`usable`). Pure and synchronous; whoever owns it calls, off the request path:

* :meth:`observe` / :meth:`observe_answer` (O(1), on the request path: only a bounded append);
* :meth:`train_pending` (a background loop, learned/loop.py, or the simulator's own loop):
  for each queued observation, first the *prequential* error of the current model (its
  prediction for the features logged at decision time against what was measured, before it learns
  from it), then the update. The rolling mean absolute percentage error (MAPE, the mean of the
  TTFT and TPOT windows of ``window`` observations each) is what is watched; answers of nodes
  the gateway had not measured yet (their prediction is the prior's) train but are not counted;
* :meth:`install`: a retrained model (a higher version) replaces the current one;
  :meth:`restore`: a saved one (learned/loop.py, at start-up) keeps its own version;
  :meth:`follow`: one another process trained (learned/share.py) keeps its version and state;
* :meth:`fault`: a decision found the predictor's answer unusable (NaN, ≤ 0).

States (each change queued as an event, :meth:`take_events`, and counted):

``warming``  fewer than ``min_samples`` observations learned: routing uses the fallback profile;
``active``   the learned profile routes;
``drifted``  rolling MAPE above ``drift_mape``: the fallback routes until it is below ``recover_mape``
             (hysteresis, so it does not flap); the model keeps learning meanwhile;
``faulted``  the predictor could not be loaded or returned NaN / ≤ 0 ``fault_limit`` decisions in a
             row: the fallback routes until a model is installed, or (NaN case) until
             ``fault_limit`` prequential predictions in a row are usable again.

The predictor types are one table, :data:`PREDICTORS` (type → ``"module:attr"``, an
:class:`inferlb.plugins.Table`; ``type: module:attr`` names one of your own, a
:class:`~inferlb.routing.predictor.LatencyPredictor` class). It is resolved when the lifecycle is
built (the fleet file's load builds the router); a type that does not resolve faults the
lifecycle, with the loader's message as the reason, and routing goes on by the fallback.
"""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from inferlb.errors import PluginError
from inferlb.plugins import Table
from inferlb.routing.features import FEATURE_NAMES
from inferlb.routing.predictor import LatencyPredictor, Observed, Prediction

__all__ = ["PREDICTORS", "LifecycleParams", "PredictorLifecycle", "load_predictor", "observe_decision",
           "observe_failure",
           "observed_from"]

# A built-in is constructed with its validated ``Params`` and the version; a user's class with
# ``params`` as keyword arguments (it knows no version).
PREDICTORS = Table("predictor", {"online-linear": "inferlb.routing.predictor:OnlineLinear"})

_APE_CAP = 10.0
_TTFT_UNKNOWN = FEATURE_NAMES.index("ttft_unknown")
_TPOT_UNKNOWN = FEATURE_NAMES.index("tpot_unknown")   # one absurd sample moves a window's mean by at most 10 / window


class LifecycleParams(BaseModel):
    """``routing.predictor`` in the fleet file."""

    model_config = ConfigDict(extra="forbid")
    type: str = "online-linear"                   # a PREDICTORS type, or "module:attr" of your own
    params: dict[str, Any] = Field(default_factory=dict)
    min_samples: int = Field(50, ge=0)            # observations before the learned profile routes
    window: int = Field(200, ge=10)               # observations per rolling error window
    drift_mape: float = Field(0.6, gt=0)          # fall back above this rolling MAPE
    recover_mape: float = Field(0.45, gt=0)       # … and return below this one
    fault_limit: int = Field(3, ge=1)
    max_pending: int = Field(10_000, ge=1)        # observations waiting for training (oldest dropped)
    train_interval_s: float = Field(0.25, gt=0)   # how often the background loop trains
    retrain_interval_s: float = Field(600.0, ge=0)   # scheduled retrain from the audit trail (0: never)
    retrain_rows: int = Field(20_000, ge=100)     # the most recent answers it reads
    retrain_min_rows: int = Field(200, ge=10)     # fewer usable answers: no retrain this time
    # Saved to the database (learned/loop.py) after each retrain, this often (0: only then
    # and at shutdown) and at shutdown; restored at start-up when it fits these settings.
    persist: bool = True
    save_interval_s: float = Field(300.0, ge=0)

    @model_validator(mode="after")
    def _hysteresis(self) -> LifecycleParams:
        if self.recover_mape > self.drift_mape:
            raise ValueError(f"recover_mape ({self.recover_mape}) must be ≤ drift_mape ({self.drift_mape})")
        return self


def load_predictor(p: LifecycleParams, version: int = 1) -> LatencyPredictor:
    """Instantiate ``p.type`` (:data:`PREDICTORS`); PluginError when the type does not resolve,
    ValueError (with why) when its params are bad or a user's class fails to construct."""
    cls = PREDICTORS.load(p.type)
    if p.type in PREDICTORS:
        try:
            built: LatencyPredictor = cls(cls.Params.model_validate(p.params), version=version)
        except ValidationError as exc:
            raise ValueError(f"bad predictor params: {exc.errors()[0]['msg']}") from exc
        return built
    try:
        obj: LatencyPredictor = cls(**p.params) if p.params else cls()
    except Exception as exc:   # a user's class: whatever it raises, routing must go on without it
        raise ValueError(f"cannot load predictor {p.type!r}: {type(exc).__name__}: {exc}") from exc
    return obj


@dataclass
class _Window:
    size: int
    values: collections.deque[float]
    total: float = 0.0

    def add(self, x: float) -> None:
        if len(self.values) == self.size:
            self.total -= self.values.popleft()
        self.values.append(x)
        self.total += x

    def mean(self) -> float | None:
        return self.total / len(self.values) if self.values else None


class PredictorLifecycle:
    """See the module docstring. ``clock``: epoch seconds for event times (injected)."""

    def __init__(self, params: LifecycleParams | None = None, *, clock: Callable[[], float] | None = None,
                 model: LatencyPredictor | None = None) -> None:
        self.p = params or LifecycleParams()
        self._clock = clock or (lambda: 0.0)
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=1000)
        self.state = "warming"
        self.reason = "no observations yet"
        self.model: LatencyPredictor | None = None
        self.version = 0
        self.learned = 0                  # observations learned by the current model
        self.pending: collections.deque[tuple[Sequence[float], Observed]] = collections.deque()
        self.dropped = 0
        self.faults_in_a_row = 0
        self.faults_total = 0
        self.fallbacks_total = 0
        self.transitions_total = 0
        self.explored_total = 0
        # Scheduled retrains by outcome ("installed" / "refused"): counted by learned/loop.py,
        # exported by learned/metrics.py next to the counters above.
        self.retrains_total: dict[str, int] = {"installed": 0, "refused": 0}
        self._ok_in_a_row = 0
        self.windows = (_Window(self.p.window, collections.deque()), _Window(self.p.window, collections.deque()))
        # Called by observe_outcome with each measured answer's request, pick view and times: what
        # else learns from the answers (the predicted-latency scorer's SLO-miss risk, registered by
        # routing/guarded.py when it is on). Empty: nothing is called.
        self.outcome_hooks: list[Callable[..., None]] = []
        if model is not None:
            self.install(model, "configured")
        else:
            try:
                self.install(load_predictor(self.p), "configured")
            except (PluginError, ValueError) as exc:
                self._to("faulted", str(exc), {"type": self.p.type})

    # ------------------------------------------------------------------ what routing asks

    def usable(self) -> bool:
        return self.state == "active" and self.model is not None

    def mape(self) -> dict[str, float | None]:
        t, o = (w.mean() for w in self.windows)
        both = None if t is None and o is None else (t if o is None else o if t is None else (t + o) / 2)
        return {"ttft": t, "tpot": o, "both": both}

    def status(self) -> dict[str, Any]:
        m = self.mape()
        return {"state": self.state, "reason": self.reason, "version": self.version, "learned": self.learned,
                "pending": len(self.pending), "dropped": self.dropped, "faults_total": self.faults_total,
                "fallbacks_total": self.fallbacks_total,
                "mape": {k: (None if v is None else round(v, 4)) for k, v in m.items()},
                "thresholds": {"drift_mape": self.p.drift_mape, "recover_mape": self.p.recover_mape,
                               "min_samples": self.p.min_samples}}

    # ------------------------------------------------------------------ the request path (O(1))

    def observe(self, row: Sequence[float], observed: Observed) -> None:
        """Queue one measured answer for training (never trains here)."""
        if len(self.pending) >= self.p.max_pending:
            self.pending.popleft()
            self.dropped += 1
        self.pending.append((row, observed))

    def observe_answer(self, row: Sequence[float] | None, predicted: Prediction | None, *, stream: bool,
                       completion_tokens: int, ttfb_s: float | None, e2e_s: float | None) -> Observed | None:
        """Turn one successful attempt's times (seconds from its start at the node, as
        ``Fleet.report_success`` takes them) into an :class:`Observed` and queue it. Like with
        like: a streamed answer gives TTFT and (e2e − TTFT) / (tokens − 1); a non-streamed one
        gives no TTFT, and TPOT = (e2e − the TTFT predicted at decision time) / tokens."""
        if row is None:
            return None
        obs = observed_from(stream=stream, completion_tokens=completion_tokens, ttfb_s=ttfb_s, e2e_s=e2e_s,
                            predicted_ttft_s=predicted.ttft_s if predicted is not None else None)
        if obs is not None:
            self.observe(row, obs)
        return obs

    def observe_outcome(self, req: Any, view: Any, *, ttfb_s: float | None, e2e_s: float | None,
                        failed: bool = False) -> None:
        """One answer of ``req``, placed on ``view`` (the node as routing saw it at the decision),
        with the times ``observe_answer`` takes, given to each of ``outcome_hooks``; ``failed``:
        the attempt got no answer (the node failed it, or the client's deadline cut it there; no
        times), given to the hooks with ``failed=True``."""
        for hook in self.outcome_hooks:
            if failed:
                hook(req, view, ttfb_s=None, e2e_s=None, failed=True)
            else:
                hook(req, view, ttfb_s=ttfb_s, e2e_s=e2e_s)

    def fault(self, reason: str) -> None:
        """A decision could not use the predictor's answer (it fell back for that decision)."""
        self.faults_total += 1
        self.faults_in_a_row += 1
        self._ok_in_a_row = 0
        if self.faults_in_a_row >= self.p.fault_limit and self.state != "faulted":
            self._to("faulted", f"{self.faults_in_a_row} unusable predictions in a row: {reason}",
                     {"faults_total": self.faults_total})

    def note_fallback(self) -> None:
        self.fallbacks_total += 1

    # ------------------------------------------------------------------ off the request path

    def train_pending(self, limit: int | None = None) -> int:
        """Score then learn each queued observation (at most ``limit``); returns how many."""
        n = 0
        model = self.model
        while self.pending and (limit is None or n < limit):
            row, obs = self.pending.popleft()
            n += 1
            if model is None:
                continue
            try:
                pred = model.predict(row)
                ok = _usable(pred)
            except Exception:   # a user's predictor: whatever it raises counts as unusable
                ok = False
            if ok:
                self._ok_in_a_row += 1
            if ok and not (row[_TTFT_UNKNOWN] or row[_TPOT_UNKNOWN]):
                # A node never measured is predicted by the prior, not by what the model learned:
                # its first answers train the model but are not counted as the model's error.
                pairs = ((self.windows[0], obs.ttft_s, pred.ttft_s), (self.windows[1], obs.tpot_s, pred.tpot_s))
                for w, y, yhat in pairs:
                    if y is not None and y > 0:
                        w.add(min(_APE_CAP, abs(yhat - y) / y))
            elif not ok:
                self._ok_in_a_row = 0
            try:
                model.update(row, obs)
            except Exception as exc:
                self._to("faulted", f"predictor update failed: {type(exc).__name__}: {exc}", {})
                return n
            self.learned += 1
        if n:
            self._check()
        return n

    def restore(self, model: LatencyPredictor, reason: str, evidence: dict[str, Any] | None = None) -> None:
        """Make a saved ``model`` the active predictor with its own version (at start-up, over the
        configured untrained one), so versions go on from where the saved one was."""
        self.version = 0
        self.install(model, reason, evidence, kind="restored")

    def follow(self, model: LatencyPredictor, state: str, reason: str) -> None:
        """Make ``model``, trained by another process (the cluster's trainer, learned/share.py),
        the active predictor with its own version, in the ``state`` that process judged it
        (warming / active / drifted / faulted; another value is ignored). Queues no event and
        counts no transition: the trainer records those once for the cluster."""
        self.model = model
        self.version = int(getattr(model, "version", 0) or 0)
        self.learned = int(getattr(model, "seen", 0) or 0)
        self.faults_in_a_row = 0
        self._ok_in_a_row = 0
        if state in ("warming", "active", "drifted", "faulted"):
            self.state, self.reason = state, reason

    def note(self, kind: str, reason: str, evidence: dict[str, Any] | None = None) -> None:
        """Queue an event that changes no state (a saved predictor ignored, say)."""
        self.events.append({"kind": kind, "from": self.state, "to": self.state, "version": self.version,
                            "reason": reason, "at": self._clock(), "evidence": dict(evidence or {})})

    def install(self, model: LatencyPredictor, reason: str, evidence: dict[str, Any] | None = None, *,
                kind: str = "installed") -> None:
        """Make ``model`` the active predictor; its version is kept (or assigned, if not higher)."""
        version = max(int(getattr(model, "version", 0) or 0), self.version + 1)
        with contextlib.suppress(AttributeError):   # a user's predictor may not let us set it
            model.version = version
        self.model = model
        self.version = version
        self.learned = int(getattr(model, "seen", 0) or 0)
        self.faults_in_a_row = 0
        self._ok_in_a_row = 0
        self.events.append({"kind": kind, "from": None, "to": self.state, "version": version,
                            "reason": reason, "at": self._clock(), "evidence": dict(evidence or {})})
        if self.state == "faulted":
            self._to("warming", f"predictor v{version} installed ({reason})", {"version": version})
        self._check()

    def take_events(self) -> list[dict[str, Any]]:
        out = list(self.events)
        self.events.clear()
        return out

    # ------------------------------------------------------------------ transitions

    def _check(self) -> None:
        p = self.p
        mape = self.mape()["both"]
        s = self.state
        if s == "faulted":
            if self.model is not None and self.faults_in_a_row >= p.fault_limit and self._ok_in_a_row >= p.fault_limit:
                self.faults_in_a_row = 0
                self._to("warming", f"{self._ok_in_a_row} usable predictions in a row", {})
            else:
                return
        s = self.state
        enough = self.learned >= p.min_samples
        if s == "warming":
            if enough and (mape is None or mape <= p.drift_mape):
                self._to("active", f"{self.learned} observations learned", self._ev(mape))
            elif enough and mape is not None:
                self._to("drifted", f"prediction error {mape:.2f} > {p.drift_mape:g} after warm-up", self._ev(mape))
        elif s == "active":
            n = min(len(w.values) for w in self.windows if w.values) if any(w.values for w in self.windows) else 0
            if mape is not None and mape > p.drift_mape and n >= min(p.window, max(10, p.min_samples)):
                self._to("drifted", f"prediction error {mape:.2f} > {p.drift_mape:g}: routing falls back",
                         self._ev(mape))
        elif s == "drifted" and mape is not None and mape < p.recover_mape:
            self._to("active", f"prediction error {mape:.2f} < {p.recover_mape:g}: learned routing resumes",
                     self._ev(mape))

    def _ev(self, mape: float | None) -> dict[str, Any]:
        m = self.mape()
        return {"mape": None if mape is None else round(mape, 4),
                "mape_ttft": None if m["ttft"] is None else round(m["ttft"], 4),
                "mape_tpot": None if m["tpot"] is None else round(m["tpot"], 4),
                "version": self.version, "learned": self.learned}

    def _to(self, state: str, reason: str, evidence: dict[str, Any]) -> None:
        old = self.state
        self.state, self.reason = state, reason
        if old == state:
            return
        self.transitions_total += 1
        self.events.append({"kind": "state", "from": old, "to": state, "version": self.version, "reason": reason,
                            "at": self._clock(), "evidence": evidence})


def observed_from(*, stream: bool, completion_tokens: int, ttfb_s: float | None, e2e_s: float | None,
                  predicted_ttft_s: float | None) -> Observed | None:
    """What one successful attempt teaches (see :meth:`PredictorLifecycle.observe_answer`)."""
    if e2e_s is None or not math.isfinite(e2e_s) or e2e_s <= 0:
        return None
    ttft: float | None = None
    tpot: float | None = None
    if stream:
        if ttfb_s is not None and math.isfinite(ttfb_s) and ttfb_s > 0:
            ttft = ttfb_s
            if completion_tokens > 1 and e2e_s > ttfb_s:
                tpot = (e2e_s - ttfb_s) / (completion_tokens - 1)
    elif completion_tokens > 0:
        prefill = predicted_ttft_s if predicted_ttft_s is not None and math.isfinite(predicted_ttft_s) else 0.0
        tpot = (e2e_s - min(max(0.0, prefill), e2e_s / 2)) / completion_tokens
    if ttft is None and tpot is None:
        return None
    return Observed(ttft, tpot)


def observe_decision(lifecycle: PredictorLifecycle, decision: Any, *, stream: bool, completion_tokens: int,
                     ttfb_s: float | None, e2e_s: float | None) -> Observed | None:
    """The gateway's hook: one successful attempt of ``decision`` (a routing Decision whose
    ``learned`` part names the pick) measured these times; queue what the predictor learns."""
    info = getattr(decision, "learned", None)
    if info is None or getattr(info, "pick", None) is None:
        return None
    if lifecycle.outcome_hooks:
        lifecycle.observe_outcome(info.req, info.pick, ttfb_s=ttfb_s, e2e_s=e2e_s)
    return lifecycle.observe_answer(info.pick_row, info.pick_pred, stream=stream,
                                    completion_tokens=completion_tokens, ttfb_s=ttfb_s, e2e_s=e2e_s)


def observe_failure(lifecycle: PredictorLifecycle, decision: Any) -> None:
    """The gateway's hook for an attempt of ``decision`` that got no answer from its pick (a node
    failure or the client's deadline on the node): told to ``outcome_hooks`` as failed, when any."""
    info = getattr(decision, "learned", None)
    if info is None or getattr(info, "pick", None) is None or not lifecycle.outcome_hooks:
        return
    lifecycle.observe_outcome(info.req, info.pick, ttfb_s=None, e2e_s=None, failed=True)


def _usable(pred: Prediction) -> bool:
    return (math.isfinite(pred.ttft_s) and math.isfinite(pred.tpot_s) and pred.ttft_s > 0 and pred.tpot_s > 0)
