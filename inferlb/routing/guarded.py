"""A router whose scorers read a learned latency predictor, guarded by that predictor's lifecycle.

:class:`GuardedRouter` runs its profile (``learned``: filters, ``predicted-latency``,
``softmax-bandit``) only while :meth:`PredictorLifecycle.usable` says so; otherwise, and for any
decision where the predictor's answer is unusable (:class:`~.learned.PredictionFault`: NaN, ≤ 0,
an exception), the fallback router (``token-aware``) decides. Either way the decision carries a
:class:`~.explain.LearnedInfo`: predictions, propensity and whether it explored, or which profile
decided instead and why. Routing never fails because of the predictor.

The filters run before the bandit, so exploration only ever picks among nodes that passed them
(healthy, serving the model, with capacity).

With a :class:`~.reward.RewardBandit` (``routing.reward.enabled``), each decision the learned
profile may make is first given to one *arm*, chosen by Thompson sampling from the realised costs
of earlier decisions: ``learned`` routes by its scorers as above, another arm (``token-aware``, or
any built-in profile without a predictor) routes by that profile. Either way the pick's
prediction is logged, so every answer still trains the latency model, and the arm is in the
decision (``learned.arm``) for the reward to find when the request ends.
"""

from __future__ import annotations

import random
from typing import Any, TypeVar

from pydantic import BaseModel

from inferlb.errors import ConfigError
from inferlb.routing.explain import LearnedInfo
from inferlb.routing.features import features
from inferlb.routing.learned import PredictionFault
from inferlb.routing.lifecycle import LifecycleParams, PredictorLifecycle
from inferlb.routing.predictor import Prediction
from inferlb.routing.profiles import Router, build_router
from inferlb.routing.reward import RewardBandit, RewardParams
from inferlb.routing.types import Decision, Filter, NodeView, Picker, RouteRequest, Scorer

__all__ = ["GuardedRouter", "make_guarded"]

_P = TypeVar("_P", bound=BaseModel)


class GuardedRouter(Router):
    """See the module docstring. ``lifecycle`` is public: the gateway feeds it answers, a
    background loop trains it, metrics read it."""

    def __init__(self, name: str, filters: list[Filter], scorers: list[tuple[Scorer, float]], picker: Picker,
                 rng: random.Random, sample: int, *, fallback: Router, lifecycle: PredictorLifecycle,
                 reward: RewardBandit | None = None, arms: dict[str, Router] | None = None) -> None:
        super().__init__(name, filters, scorers, picker, rng, sample)
        self.fallback = fallback
        fallback.rng = rng
        self.lifecycle = lifecycle
        self.reward = reward
        self.arms = dict(arms or {})
        for r in self.arms.values():
            r.rng = rng
        self._bound = [s for s, _ in scorers if hasattr(s, "bind")]
        self._explainer = next((s for s in self._bound if hasattr(s, "last")), None)
        # The SLO-miss risk learns from the answers through the lifecycle's feedback path.
        if getattr(self._explainer, "risk", None) is not None:
            lifecycle.outcome_hooks.append(self._explainer.observe_outcome)  # type: ignore[union-attr]
        # The interference weight the explainer charges (recorded with its per-candidate terms).
        self._beta = float(getattr(getattr(self._explainer, "p", None), "interference", 0.0) or 0.0)

    def decide(self, req: RouteRequest, nodes: list[NodeView]) -> Decision:
        lc = self.lifecycle
        model = lc.model
        if lc.usable():
            arm = self.reward.choose(self.rng) if self.reward is not None else None
            if arm is not None and arm in self.arms:
                return self._fall_back(req, nodes, f"the reward bandit chose the {arm} arm", with_model=True,
                                       router=self.arms[arm], arm=arm)
            for s in self._bound:
                s.bind(model)
            try:
                d = super().decide(req, nodes)
            except PredictionFault as exc:
                lc.fault(str(exc))
                return self._fall_back(req, nodes, f"prediction unusable: {exc}", with_model=False)
            lc.faults_in_a_row = 0
            d.learned = self._explain(req, d)
            d.learned.arm = arm
            return d
        return self._fall_back(req, nodes, f"predictor {lc.state}: {lc.reason}",
                               with_model=lc.state in ("warming", "drifted"))

    def _explain(self, req: RouteRequest, d: Decision) -> LearnedInfo:
        lc = self.lifecycle
        # Positional (req, version, state, pick): a class call with keywords builds a dict of them.
        info = LearnedInfo(req, lc.version, lc.state, None)
        sc = getattr(self._explainer, "last", None)
        choice = getattr(self.picker, "last", None)
        if sc is None or d.pick is None:
            return info
        nodes = sc.nodes
        info.nodes, info.preds = nodes, sc.preds
        # The pick's first place among the scored nodes (what ``names.index`` gives), found by a
        # walk that stops there: the names are listed only when an exploring decision needs
        # them, or to raise list.index's own error when the pick is not there.
        pick = d.pick
        i = 0
        for n in nodes:
            if n.name == pick:
                break
            i += 1
        else:
            i = [n.name for n in nodes].index(pick)
        info.pick = nodes[i]
        info.pick_pred = Prediction(*sc.preds[i])
        info.pick_slack = sc.slack[i]
        # The scorer's per-candidate terms, for the audit (explain.py bounds them to CTX_NODES).
        info.slack, info.others, info.reserved = sc.slack, sc.others_s, sc.reserved
        info.risk = getattr(sc, "risk", None)
        info.interference = self._beta
        if sc.reserve_cut is not None:
            info.reserve_cut, info.reserve_rule = sc.reserve_cut, getattr(self._explainer, "cut_rule", None)
        if choice is not None and choice.pick == pick and len(choice.probs) == len(nodes):
            info.probs = choice.probs
            info.propensity = choice.propensity
            info.explored = choice.explored
            info.epsilon = choice.epsilon
            if choice.explored:
                lc.explored_total += 1
                rows = d.score_rows   # the greedy choice is by the profile's total score
                info.best = max([n.name for n in nodes], key=lambda n: rows[n][-1] if n in rows else -1.0)
        return info

    def _fall_back(self, req: RouteRequest, nodes: list[NodeView], reason: str, *, with_model: bool,
                   router: Router | None = None, arm: str | None = None) -> Decision:
        """``router`` decides (default: the fallback, counted as one); ``arm``: the reward bandit's
        choice, recorded as such rather than as a fallback."""
        lc = self.lifecycle
        if arm is None:
            lc.note_fallback()
        by = router or self.fallback
        d = by.decide(req, nodes)
        d.profile = self.name
        info = LearnedInfo(req, lc.version, lc.state, None)   # positional, then set: no keywords' dict
        info.fallback = by.name if arm is None else None
        info.reason = reason
        info.arm = arm
        pick = d.pick
        if pick is not None:
            # The pick's view is one the decision holds (its scored or candidate nodes: at most
            # the sample); only when it holds none is the whole list scanned.
            view = d.view_of(pick)
            if view is None:
                view = next((n for n in nodes if n.name == pick), None)
            info.pick = view
            model = lc.model
            if view is not None and with_model and model is not None:
                try:   # the pick's prediction: logged, and what a non-streamed answer's TPOT is net of
                    p = model.predict(features(req, view))
                    if 0 < p.ttft_s < float("inf") and 0 < p.tpot_s < float("inf"):
                        info.pick_pred = p
                except Exception:   # a broken predictor never breaks routing; the state says why
                    pass
        d.learned = info
        return d


def make_guarded(profile: str, filters: list[Filter], scorers: list[tuple[Scorer, float]], picker: Picker,
                 rng: random.Random, sample: int, *, fallback: Router, predictor: dict[str, Any] | None,
                 lifecycle: PredictorLifecycle | None, clock: Any = None,
                 reward: dict[str, Any] | None = None) -> GuardedRouter:
    """Build the guarded router (``build_router`` calls this); bad ``predictor`` or ``reward``
    params raise ConfigError (so does a reward arm that is not a built-in profile without a predictor)."""
    bandit, arms = _reward(reward, fallback, sample)
    if lifecycle is None:
        lifecycle = PredictorLifecycle(_params(LifecycleParams, predictor, "routing.predictor"), clock=clock)
    return GuardedRouter(profile, filters, scorers, picker, rng, sample, fallback=fallback, lifecycle=lifecycle,
                         reward=bandit, arms=arms)


def _params(model: type[_P], raw: dict[str, Any] | None, path: str) -> _P:
    """``raw`` validated as ``model``; its first problem as a ConfigError at ``path``."""
    try:
        return model.model_validate(raw or {})
    except Exception as exc:
        errs = getattr(exc, "errors", None)
        first = errs()[0] if callable(errs) else {"msg": str(exc), "loc": ()}
        raise ConfigError(f"{first['msg']} ({'.'.join(str(x) for x in first['loc'])})", path=path) from exc


def _reward(raw: dict[str, Any] | None, fallback: Router, sample: int) -> tuple[RewardBandit | None, dict[str, Router]]:
    p = _params(RewardParams, raw, "routing.reward")
    if not p.enabled:
        return None, {}
    arms: dict[str, Router] = {}
    for name in p.arms[1:]:
        r = fallback if name == fallback.name else build_router(name, sample=sample)
        if getattr(r, "lifecycle", None) is not None:
            raise ConfigError(f"reward arm {name!r} needs a predictor of its own; arms after 'learned' are "
                              "profiles without one", path="routing.reward.arms")
        arms[name] = r
    return RewardBandit(p), arms
