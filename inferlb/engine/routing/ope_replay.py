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
latency predictor is given the *logged* predictions, so it is judged on what was known then.

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

from .explain import Context, context_of
from .ope import Round, estimate
from .profiles import Router, build_router
from .types import NodeView, RouteRequest

__all__ = ["LoggedDecision", "LoggedPredictions", "evaluate", "rounds_for", "target_probabilities"]


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
    for s, _ in router.scorers:
        if hasattr(s, "bind"):
            s.bind(LoggedPredictions(ctx.preds))
    # The profile's own pipeline, without a guard's fallback and without sampling (the logged
    # candidates are the sample the logging policy saw).
    d = Router.decide(router, ctx.req, ctx.views) if router.sample == 0 else _unsampled(router, ctx)
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


def rounds_for(decisions: Iterable[LoggedDecision], policy: str | Router, *, metric: str = "e2e",
               mc_draws: int = 200, seed: int = 0) -> tuple[list[Round], Counter[str]]:
    """One :class:`Round` per usable logged decision, and the skipped ones counted by reason."""
    router = build_router(policy, seed=seed) if isinstance(policy, str) else policy
    rounds: list[Round] = []
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
        qs = {n: _q(ctx.preds.get(n), ctx.req, metric) for n in ctx.preds}
        q_logged = qs.get(pick)
        q_target: float | None = None
        if q_logged is not None and all(qs.get(n) is not None for n in pi):
            q_target = sum(p * (qs[n] or 0.0) for n, p in pi.items())
        rounds.append(Round(dec.reward, float(mu), pi.get(pick, 0.0), q_logged, q_target))
    return rounds, skipped


def evaluate(decisions: Iterable[LoggedDecision], policy: str | Router, *, metric: str = "e2e",
             n_boot: int = 500, seed: int = 0, mc_draws: int = 200) -> dict[str, Any]:
    """Estimate ``policy``'s mean cost on the logged decisions (IPS, SNIPS, DR with intervals)."""
    rounds, skipped = rounds_for(decisions, policy, metric=metric, mc_draws=mc_draws, seed=seed)
    name = policy if isinstance(policy, str) else policy.name
    out: dict[str, Any] = {"policy": name, "metric": metric, "skipped": dict(skipped)}
    if not rounds:
        out["error"] = "no logged decision with a propensity to evaluate on"
        return out
    est = estimate(rounds, n_boot=n_boot, seed=seed)
    out.update({k: (v.to_json() if hasattr(v, "to_json") else v) for k, v in est.items()})
    return out
