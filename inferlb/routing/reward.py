"""Learning from reward: a Thompson-sampling bandit over routing profiles ("arms").

The ``learned`` profile's latency model is *regression* (an online ridge, routing/predictor.py):
it predicts times, it does not learn which routing is better. This module adds the part that
learns from the outcome the operator chose: a **multi-armed bandit** whose arms are whole
routing profiles (``learned``: the predicted-latency scorers; by default also ``token-aware``,
the fallback the guard already holds, ``power-of-two`` and ``least-connections``). It is not
reinforcement learning in the full sense (no state or transition model): each decision is one
pull, its reward the request's realised cost.

Contract:

* :meth:`RewardBandit.choose` samples one mean cost per arm from its posterior and returns the
  arm with the lowest sample (**Thompson sampling**): an arm whose cost is uncertain is tried
  more; as evidence grows the posteriors narrow and exploration shrinks by itself. Randomness
  from the injected ``random.Random`` only.
* The posterior of each arm is Gaussian over its mean cost, from *discounted* sufficient
  statistics: at every observation, of any arm, every arm's weights are multiplied by
  ``discount`` (discounted Thompson sampling), so a fleet whose best profile changes is followed
  and an arm not chosen for a while grows uncertain again and is tried again (discounting only
  an arm's own observations would leave a stale, unlucky estimate in force for ever); the
  variance of the mean is the arm's
  sample variance (with a prior of ``prior_n`` pseudo-observations at the pooled mean) divided by
  its effective count.
* **Regression adjustment** (``adjust: tokens``, the default): most of a request's cost is the
  length of its answer, which no arm chooses, so comparing arms by their raw mean cost needs many
  outcomes to see through that spread, and Thompson keeps trying weak arms meanwhile. Each outcome
  carries its answer's output tokens ``x``; an arm is judged by its cost at the pooled mean
  length, ``mean(c) − β·(mean(x) − X̄)``, with ``β`` the pooled (all arms, discounted) regression
  slope of cost on ``x`` and the residual spread as the variance (a control variate, as CUPED in
  online experiments). The arm is chosen before the answer exists and without looking at the
  request, so ``x`` does not depend on the arm and the adjustment leaves the arms' differences
  unbiased while it removes the spread length explains. A failed request carries ``x`` = 0
  (no answer), which only adds to its cost. ``adjust: none`` compares raw means.
* :meth:`RewardBandit.observe` takes one realised outcome: the cost is the operator's
  ``objective``: ``e2e`` (the node's seconds from dispatch to the last byte: the gateway's own
  queue is not the arm's doing, and is left out), ``slo`` (1 when the answer missed the SLO
  ``slo_ttft_s`` / ``slo_e2e_s``, else 0) or ``e2e-per-token`` (seconds per output token: the
  answer's length, which no arm chooses, divided out). A request that did not complete costs
  ``failure_cost`` (``e2e``/``e2e-per-token``: ``failure_cost_s``; ``slo``: 1).
* Sharing (a cluster's one trainer, learned/share_reward.py): with an :attr:`RewardBandit.outbox`
  (a bounded deque the share sets), :meth:`RewardBandit.observe` only appends ``(arm, cost, x)``
  there (the oldest dropped when full) and learns nothing: the trainer replays them in order
  (:meth:`RewardBandit.learn`). :meth:`RewardBandit.state` is each arm's ``n``, ``s``, ``ss``,
  ``observed`` and the covariate's sums, with the params they mean something under (:meth:`RewardBandit.fit`);
  :meth:`RewardBandit.load` takes another bandit's (:class:`~.predictor_state.IncompatibleState`
  under other params). ``pulls`` stay this process's own choices.
* :meth:`RewardBandit.status` is JSON: per arm its pulls, effective count and posterior of the
  mean cost (learned/metrics.py exports the pulls and means as Prometheus figures).

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferlb.routing.predictor_state import IncompatibleState

__all__ = ["RewardBandit", "RewardParams", "observe_reward"]


class RewardParams(BaseModel):
    """``routing.reward`` in the fleet file (the ``learned`` profile only)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    # the arms: chosen on the train seeds 1-2 of benchmarks/reward_regret.py (docs/benchmarks.md)
    arms: list[str] = Field(default_factory=lambda: ["learned", "token-aware", "power-of-two", "least-connections"],
                            min_length=2)
    objective: Literal["e2e", "slo", "e2e-per-token"] = "e2e"
    discount: float = Field(0.999, gt=0, le=1)      # per observation: ~1 / (1 − d) remembered in all
    prior_n: float = Field(2.0, gt=0)                # pseudo-observations at the pooled mean
    min_pulls: int = Field(20, ge=0)                 # each arm is pulled this often before sampling decides
    adjust: Literal["tokens", "none"] = "tokens"     # regression adjustment on the answer's length (above)
    slo_ttft_s: float = Field(2.0, gt=0)
    slo_e2e_s: float = Field(30.0, gt=0)
    failure_cost_s: float = Field(60.0, gt=0)

    @model_validator(mode="after")
    def _arms(self) -> RewardParams:
        if len(set(self.arms)) != len(self.arms):
            raise ValueError("arms must be distinct profile names")
        if self.arms[0] != "learned":
            raise ValueError("the first arm is the learned profile itself ('learned')")
        return self


@dataclass
class _Arm:
    name: str
    n: float = 0.0           # discounted count
    s: float = 0.0           # discounted sum of costs
    ss: float = 0.0          # discounted sum of squared costs
    pulls: int = 0           # choices (not discounted)
    observed: int = 0
    sx: float = 0.0          # discounted sums of the covariate x (output tokens), x², and x·cost
    sxx: float = 0.0
    sxc: float = 0.0

    def scale(self, d: float) -> None:
        self.n *= d
        self.s *= d
        self.ss *= d
        self.sx *= d
        self.sxx *= d
        self.sxc *= d

    def add(self, cost: float, x: float) -> None:
        self.n += 1.0
        self.s += cost
        self.ss += cost * cost
        self.sx += x
        self.sxx += x * x
        self.sxc += x * cost
        self.observed += 1


class RewardBandit:
    """See the module docstring. ``arms`` come from the params; the caller maps a chosen arm's
    name to the router that decides for it."""

    def __init__(self, params: RewardParams | None = None) -> None:
        self.p = params or RewardParams(enabled=True)
        self.arms = [_Arm(name) for name in self.p.arms]
        self._index = {a.name: i for i, a in enumerate(self.arms)}
        #: set by a cluster's share (learned/share_reward.py): outcomes wait here instead of being learned
        self.outbox: deque[tuple[str, float, float]] | None = None

    def _pooled(self) -> tuple[float, float, float, float]:
        """(mean cost, residual variance, β, mean x) over all arms; β = 0 (raw costs) under
        ``adjust: none`` or while x does not vary."""
        arms = self.arms
        n = sum(a.n for a in arms)
        if n <= 0:
            return 0.0, 1.0, 0.0, 0.0
        mean = sum(a.s for a in arms) / n
        var = max(0.0, sum(a.ss for a in arms) / n - mean * mean)
        beta = mx = 0.0
        if self.p.adjust == "tokens":
            mx = sum(a.sx for a in arms) / n
            vx = sum(a.sxx for a in arms) / n - mx * mx
            if vx > 1e-9:
                beta = (sum(a.sxc for a in arms) / n - mean * mx) / vx
                var = max(0.0, var - beta * beta * vx)
        return mean, var if var > 0 else max(1e-12, mean * mean), beta, mx

    def posterior(self, i: int) -> tuple[float, float]:
        """(mean, standard deviation of the mean) of arm ``i``'s cost (at the pooled mean length
        under ``adjust: tokens``: the module docstring)."""
        a = self.arms[i]
        m0, v0, beta, mx = self._pooled()
        s, ss = a.s, a.ss
        if beta != 0.0:
            # sums of the residual r = c − β(x − X̄) from the arm's sums (expanded square)
            s = a.s - beta * (a.sx - a.n * mx)
            ss = (a.ss - 2.0 * beta * (a.sxc - mx * a.s)
                  + beta * beta * (a.sxx - 2.0 * mx * a.sx + a.n * mx * mx))
        n = a.n + self.p.prior_n
        mean = (s + self.p.prior_n * m0) / n
        ex2 = (ss + self.p.prior_n * (v0 + m0 * m0)) / n
        var = max(1e-12, ex2 - mean * mean)
        return mean, math.sqrt(var / n)

    def choose(self, rng: random.Random) -> str:
        """The arm to decide this request (see the module docstring)."""
        under = [i for i, a in enumerate(self.arms) if a.pulls < self.p.min_pulls]
        if under:
            i = min(under, key=lambda k: self.arms[k].pulls)
        else:
            draws = []
            for k in range(len(self.arms)):
                mean, sd = self.posterior(k)
                draws.append(rng.gauss(mean, sd))
            i = min(range(len(draws)), key=draws.__getitem__)
        self.arms[i].pulls += 1
        return self.arms[i].name

    def cost(self, *, ok: bool, stream: bool, ttft_s: float | None, e2e_s: float | None, tokens: int) -> float:
        """The operator's objective for one outcome (module docstring)."""
        p = self.p
        if p.objective == "slo":
            if not ok or e2e_s is None:
                return 1.0
            missed = e2e_s > p.slo_e2e_s or (stream and (ttft_s is None or ttft_s > p.slo_ttft_s))
            return 1.0 if missed else 0.0
        if not ok or e2e_s is None:
            return p.failure_cost_s if p.objective == "e2e" else p.failure_cost_s / max(1, tokens)
        if p.objective == "e2e-per-token":
            return e2e_s / max(1, tokens)
        return e2e_s

    def observe(self, arm: str | None, cost: float, x: float = 0.0) -> bool:
        """One realised cost of a request ``arm`` decided, with its answer's output tokens ``x``
        (0 for no answer); False for an arm this bandit has not, or a cost or ``x`` not finite.
        With an :attr:`outbox`, only queued there (module docstring)."""
        if self.outbox is None:
            return self.learn(arm, cost, x)      # one gateway: its checks are learn's own
        if (arm or "") not in self._index or not math.isfinite(cost) or not math.isfinite(x):
            return False
        self.outbox.append((str(arm), cost, x))
        return True

    def learn(self, arm: str | None, cost: float, x: float = 0.0) -> bool:
        """What :meth:`observe` does without an outbox: learn one outcome here."""
        i = self._index.get(arm or "")
        if i is None or not math.isfinite(cost) or not math.isfinite(x):
            return False
        d = self.p.discount
        for a in self.arms:
            a.scale(d)
        self.arms[i].add(cost, x)
        return True

    def fit(self) -> str:
        """The params an outcome's cost and the statistics mean something under (all but ``enabled``
        and ``min_pulls``, which change no cost)."""
        return self.p.model_dump_json(exclude={"enabled", "min_pulls"})

    def state(self) -> dict[str, Any]:
        """What another bandit loads (:meth:`load`; JSON): :meth:`fit` and each arm's
        ``[name, n, s, ss, observed, sx, sxx, sxc]``."""
        return {"fit": self.fit(),
                "arms": [[a.name, a.n, a.s, a.ss, a.observed, a.sx, a.sxx, a.sxc] for a in self.arms]}

    def load(self, state: dict[str, Any]) -> None:
        """Take the statistics of ``state`` (another's :meth:`state`), keeping this bandit's pulls.
        Raises :class:`IncompatibleState` under other params, ``TypeError`` / ``ValueError`` /
        ``KeyError`` when it is not a state; either way nothing here changes."""
        if state["fit"] != self.fit():
            raise IncompatibleState("the reward bandit's params differ (routing.reward)")
        rows = state["arms"]
        if not isinstance(rows, list) or [r[0] for r in rows] != [a.name for a in self.arms]:
            raise ValueError("the arms differ")
        stats: list[tuple[list[float], int]] = []
        for _, n, s, ss, observed, sx, sxx, sxc in rows:
            vals = [float(n), float(s), float(ss), float(sx), float(sxx), float(sxc)]
            if not all(math.isfinite(v) for v in vals) or not isinstance(observed, int) or observed < 0:
                raise ValueError(f"arm statistics not finite: {vals} / {observed!r}")
            stats.append((vals, observed))
        for a, (vals, observed) in zip(self.arms, stats, strict=True):
            a.n, a.s, a.ss, a.sx, a.sxx, a.sxc = vals
            a.observed = observed

    def learned(self) -> int:
        """Outcomes learned (in a cluster: the trainer's, installed with its snapshot)."""
        return sum(a.observed for a in self.arms)

    def status(self) -> dict[str, Any]:
        arms: list[dict[str, Any]] = []
        for i, a in enumerate(self.arms):
            mean, sd = self.posterior(i)
            arms.append({"arm": a.name, "pulls": a.pulls, "observed": a.observed,
                                "effective_n": round(a.n, 1), "mean_cost": round(mean, 6),
                                "sd_of_mean": round(sd, 6)})
        _, _, beta, mx = self._pooled()
        return {"objective": self.p.objective, "adjust": self.p.adjust, "beta": round(beta, 9),
                "mean_tokens": round(mx, 3), "arms": arms}


def observe_reward(router: Any, decision: Any, *, ok: bool, stream: bool, ttft_s: float | None,
                   e2e_s: float | None, tokens: int) -> str | None:
    """Give ``router``'s reward bandit (if it has one) the realised cost of ``decision`` (if a bandit
    arm made it); the arm, or None. Times are the node's, from the attempt's start."""
    bandit = getattr(router, "reward", None)
    info = getattr(decision, "learned", None)
    arm = getattr(info, "arm", None)
    if bandit is None or arm is None:
        return None
    bandit.observe(arm, bandit.cost(ok=ok, stream=stream, ttft_s=ttft_s, e2e_s=e2e_s, tokens=tokens),
                   float(tokens) if ok else 0.0)
    return str(arm)
