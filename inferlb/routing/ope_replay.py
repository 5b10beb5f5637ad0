"""Replay logged learned decisions under a candidate routing policy: the inputs of off-policy evaluation.

A :class:`LoggedDecision` is one decision from the audit trail (or from a simulator): the model,
the ``learned`` part of the decision JSON (routing/explain.py: request, candidates as routing saw
them, logged predictions, the pick and its propensity) and the reward (cost) measured for the
pick. :func:`rounds_for` rebuilds each decision's context, asks the candidate policy (a profile
name, or a built Router) for its probability of the logged pick, and computes the reward model's
terms from the logged predictions; :func:`evaluate` runs the estimators (routing/ope.py).

The candidate's probabilities: exact for pickers that state them (``softmax-bandit``:
``probabilities``) and for ``max-score`` (1 / number of tied best nodes); by Monte Carlo
(``mc_draws`` seeded draws of its ``rank``) for the others. A candidate whose scorers need a
latency predictor is given the *logged* predictions, so it is judged on what was known then, and
a ``predicted-latency`` scorer whose tail-reservation cut is drawn by the logged rule is given the
*logged* cut (an adaptive cut is a quantile of the traffic before the decision, not in the record),
and one with the SLO-miss risk on is charged the *logged* P(miss) (the ``risk`` column) where the record
has them (where it has none, the replayed scorer's own counts, which a replay never feeds: its
prior, the same for every candidate, a charge that changes no ranking).

Rounds are skipped, and counted by reason, when the logging policy was not the bandit (no
propensity: a fallback decided), when the context was cut (more than ``CTX_NODES`` candidates),
or when the candidate cannot be evaluated on it (no logged prediction for a candidate).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inferlb.routing.explain import Context, context_of
from inferlb.routing.ope import Round, estimate
from inferlb.routing.ope_reward import cross_fit, reward_features
from inferlb.routing.profiles import Router, build_router
from inferlb.routing.types import NodeView, RouteRequest

__all__ = ["MIN_ESS", "REWARD_MODELS", "LoggedDecision", "LoggedPredictions", "evaluate", "rounds_for",
           "softmax_policy", "target_probabilities"]


@dataclass(frozen=True, slots=True)
class LoggedDecision:
    model: str
    learned: Mapping[str, Any]     # the decision's "learned" JSON
    reward: float                  # the measured cost of the logged pick (e.g. e2e seconds)


class LoggedPredictions:
    """A predictor that answers with the predictions logged at decision time (by node name)."""

    version = 0

    def __init__(self, preds: Mapping[str, tuple[float, float] | None]) -> None:
        self.preds = preds

    def predict_nodes(self, req: RouteRequest, nodes: list[NodeView]) -> list[tuple[float, float]]:
        out = []
        for n in nodes:
            p = self.preds.get(n.name)
            if p is None:
                raise KeyError(f"no logged prediction for {n.name}")
            out.append(p)
        return out


def target_probabilities(router: Router, ctx: Context, *, mc_draws: int = 200, seed: int = 0) -> dict[str, float]:
    """The candidate ``router``'s probability of picking each node of ``ctx`` (absent: 0)."""
    pinned = []
    for s, _ in router.scorers:
        if hasattr(s, "bind"):
            s.bind(LoggedPredictions(ctx.preds))
        pin = getattr(s, "pin_cut", None)
        if pin is not None:   # the logged long-output cut, which no single record can rebuild
            pin(ctx.reserve)
            pinned.append(pin)
        pin_risk = getattr(s, "pin_risk", None)
        if pin_risk is not None and ctx.risk is not None:   # the logged SLO-miss risk: earlier answers' counts
            pin_risk(ctx.risk)
            pinned.append(pin_risk)
    # The profile's own pipeline, without a guard's fallback and without sampling (the logged
    # candidates are the sample the logging policy saw).
    try:
        d = Router.decide(router, ctx.req, ctx.views) if router.sample == 0 else _unsampled(router, ctx)
    finally:
        for pin in pinned:
            pin(None)
    if not d.ranked:
        return {}
    live = [n for n in ctx.views if n.name in d.score_rows]
    totals = [d.score_rows[n.name][-1] for n in live]
    scored = list(zip(live, totals, strict=True))
    probs_fn = getattr(router.picker, "probabilities", None)
    if probs_fn is not None:
        return {n.name: p for n, p in zip(live, probs_fn(ctx.req, scored), strict=True)}
    if router.picker.type_name == "max-score":
        best = max(totals)
        ties = [n.name for n, t in scored if t >= best]
        return {n: 1.0 / len(ties) for n in ties}
    rng = random.Random(seed)
    rank_for = getattr(router.picker, "rank_for", None)
    counts: Counter[str] = Counter()
    for _ in range(mc_draws):
        ranked = rank_for(ctx.req, scored, rng) if rank_for is not None else router.picker.rank(scored, rng)
        if ranked:
            counts[ranked[0]] += 1
    return {n: c / mc_draws for n, c in counts.items()}


def _unsampled(router: Router, ctx: Context) -> Any:
    k = router.sample
    router.sample = 0
    try:
        return Router.decide(router, ctx.req, ctx.views)
    finally:
        router.sample = k


def _q(pred: tuple[float, float] | None, req: RouteRequest, metric: str) -> float | None:
    if pred is None:
        return None
    return pred[0] if metric == "ttft" else pred[0] + pred[1] * max(0, req.output_tokens - 1)


def softmax_policy(profile: str, temperature: float, *, seed: int = 0) -> Router:
    """A stochastic version of ``profile``: its filters and scorers, and a softmax over its total
    score at ``temperature`` as the picker (``softmax-bandit`` with ε = 1, every class), so it
    puts weight on every candidate and the logged decisions overlap it. A deterministic profile
    (token-aware picks its best node) mostly disagrees with the logging policy and cannot be
    estimated from its log; this one can, and its value is measured on-policy the same way."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    r = build_router(profile, picker="softmax-bandit", seed=seed,
                     params={"softmax-bandit": {"epsilon": 1.0, "temperature": temperature, "never_explore": []}})
    r.name = f"{profile}~softmax({temperature:g})"
    return r


REWARD_MODELS = ("fitted", "predictions", "none")


def rounds_for(decisions: Iterable[LoggedDecision], policy: str | Router, *, metric: str = "e2e",
               mc_draws: int = 200, seed: int = 0, reward_model: str = "fitted"
               ) -> tuple[list[Round], Counter[str]]:
    """One :class:`Round` per usable logged decision, and the skipped ones counted by reason.

    ``reward_model``: DR's q̂: ``fitted`` (default): a cross-fitted regression of the measured
    costs on the logged contexts (routing/ope_reward.py); ``predictions``: the logged latency
    predictions themselves (the logging policy's view; biased toward it); ``none``: DR = IPS."""
    if reward_model not in REWARD_MODELS:
        raise ValueError(f"reward_model must be one of {', '.join(REWARD_MODELS)}")
    router = build_router(policy, seed=seed) if isinstance(policy, str) else policy
    kept: list[tuple[LoggedDecision, Context, dict[str, float], str, float]] = []
    skipped: Counter[str] = Counter()
    for i, dec in enumerate(decisions):
        lj = dec.learned
        mu = lj.get("propensity")
        pick = (lj.get("pick") or {}).get("node")
        if mu is None or pick is None or lj.get("fallback"):
            skipped["no propensity (a fallback profile decided)"] += 1
            continue
        try:
            ctx = context_of(lj, dec.model)
        except (KeyError, TypeError, ValueError):
            skipped["malformed record"] += 1
            continue
        if not ctx.complete:
            skipped["context cut (more candidates than logged)"] += 1
            continue
        try:
            pi = target_probabilities(router, ctx, mc_draws=mc_draws, seed=seed + i)
        except KeyError:
            skipped["a candidate had no logged prediction"] += 1
            continue
        kept.append((dec, ctx, pi, pick, float(mu)))
    qs = _q_tables(kept, metric, reward_model)
    rounds: list[Round] = []
    for (dec, _, pi, pick, mu), q in zip(kept, qs, strict=True):
        q_logged = q.get(pick)
        q_target: float | None = None
        if q_logged is not None and all(q.get(n) is not None for n in pi):
            q_target = sum(p * (q[n] or 0.0) for n, p in pi.items())
        rounds.append(Round(dec.reward, mu, pi.get(pick, 0.0), q_logged, q_target))
    return rounds, skipped


def _q_tables(kept: list[tuple[LoggedDecision, Context, dict[str, float], str, float]], metric: str,
              reward_model: str) -> list[dict[str, float | None]]:
    """q̂ per candidate name, per kept round."""
    if reward_model == "none":
        return [{} for _ in kept]
    if reward_model == "predictions":
        return [{n: _q(ctx.preds.get(n), ctx.req, metric) for n in ctx.preds} for _, ctx, _, _, _ in kept]
    picked: list[list[float]] = []
    cands: list[list[list[float]]] = []
    names: list[list[str]] = []
    for _, ctx, _, pick, _ in kept:
        views = {v.name: v for v in ctx.views}
        picked.append(reward_features(ctx.req, views[pick], ctx.preds.get(pick)))
        names.append([v.name for v in ctx.views])
        cands.append([reward_features(ctx.req, v, ctx.preds.get(v.name)) for v in ctx.views])
    fitted = cross_fit(picked, [dec.reward for dec, *_ in kept], cands)
    return [dict(zip(ns, (float(v) for v in qv), strict=True)) for ns, qv in zip(names, fitted, strict=True)]


MIN_ESS = 100.0


def evaluate(decisions: Iterable[LoggedDecision], policy: str | Router, *, metric: str = "e2e",
             n_boot: int = 500, seed: int = 0, mc_draws: int = 200, reward_model: str = "fitted",
             min_ess: float = MIN_ESS, keep_refused: bool = False) -> dict[str, Any]:
    """Estimate ``policy``'s mean cost on the logged decisions (IPS, SNIPS, DR with intervals).

    Refusal: when the effective sample size (Σw)² / Σw² is below ``min_ess``, the logged
    decisions hardly overlap the policy (it mostly picks what the logging policy did not), and an
    estimate would rest on a few dozen rounds: the result then has ``refused`` ("insufficient
    overlap: …") and no ``ips`` / ``snips`` / ``dr`` (with ``keep_refused`` they are kept under
    ``withheld``, for measuring the estimators themselves). The ±5 % accuracy measured in the
    simulator (docs/benchmarks.md) holds only where the overlap exists."""
    rounds, skipped = rounds_for(decisions, policy, metric=metric, mc_draws=mc_draws, seed=seed,
                                 reward_model=reward_model)
    name = policy if isinstance(policy, str) else policy.name
    out: dict[str, Any] = {"policy": name, "metric": metric, "skipped": dict(skipped),
                           "reward_model": reward_model, "min_ess": min_ess}
    if not rounds:
        out["error"] = "no logged decision with a propensity to evaluate on"
        return out
    est = estimate(rounds, n_boot=n_boot, seed=seed)
    vals = {k: (v.to_json() if hasattr(v, "to_json") else v) for k, v in est.items()}
    if est["ess"] < min_ess:
        out["refused"] = (f"insufficient overlap: effective sample size {est['ess']:.0f} of {est['n']} decisions "
                          f"< {min_ess:g}; the logged decisions rarely agree with {name}, so no estimate is given")
        out.update({k: vals[k] for k in ("logged", "ess", "n")})
        if keep_refused:
            out["withheld"] = {k: vals[k] for k in ("ips", "snips", "dr", "switch_dr")}
        return out
    out.update(vals)
    return out
