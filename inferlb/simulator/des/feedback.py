"""The feedback hook of a discrete-event run: what a router that learns is told when a request ends.

Contract:

* A :class:`Feedback` given to :class:`~.sim.Simulation` (``feedback=``) has its
  :meth:`Feedback.on_finish` called once for every request that got a routing decision, when that
  request ends (``ok``, ``failed``, ``timeout``, or ``no_node`` at once), with a :class:`Finished`:
  the request, the :class:`~inferlb.routing.types.Decision` that placed it and what the
  node measured. Times are **the node's**: from the request's start on the node (its dispatch),
  so the gateway's queue is not in them, as the gateway's attempt timings are not
  (``Fleet.report_success``); ``queue_s`` gives the gateway's queue apart.
* :meth:`Feedback.tick` is called every ``tick_s`` virtual seconds (first at ``start + tick_s``),
  between events and never inside a routing decision: the place to train, off the request path,
  as the gateway's background loop does (``PredictorLifecycle.p.train_interval_s``).
* :class:`LearnedFeedback` is the feedback of a router with a latency-predictor lifecycle (the
  ``learned`` profile, routing/guarded.py): each successful answer goes to
  ``lifecycle.observe_answer`` by the gateway's rule (a streamed answer's first byte is its first
  token; a non-streamed answer's first byte is the whole answer), training is
  ``lifecycle.train_pending()`` on each tick. With ``log=True`` it also keeps, for every decision
  the learned policy made itself (one with a propensity), a
  :class:`~inferlb.routing.ope_replay.LoggedDecision` whose reward is the request's cost as
  the client saw it (gateway queue + node e2e; a request that did not complete costs
  ``failure_cost_s``): the input of off-policy evaluation, as the audit trail is in production.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from inferlb.routing.lifecycle import observe_decision, observe_failure
from inferlb.routing.ope_replay import LoggedDecision
from inferlb.routing.reward import observe_reward
from inferlb.routing.types import Decision

__all__ = ["Feedback", "Finished", "LearnedFeedback"]


@dataclass(frozen=True, slots=True)
class Finished:
    """One routed request that ended. ``ttft_s`` / ``e2e_s``: seconds from its start on the node
    (None when it produced no token / did not complete); ``queue_s``: its wait in the gateway."""

    row: int                  # the request's row in the results (its index in the plan)
    request: Any              # the plan's request (RequestLike)
    model: str
    decision: Decision
    node: str | None          # the node it ran on (None: no node could serve it)
    outcome: str              # "ok" | "failed" | "timeout" | "no_node"
    stream: bool
    tokens: int               # output tokens produced
    ttft_s: float | None
    e2e_s: float | None
    queue_s: float
    at: float                 # virtual time it ended


class Feedback(Protocol):
    """What :class:`~.sim.Simulation` calls (see the module docstring)."""

    tick_s: float

    def on_finish(self, done: Finished) -> None: ...

    def tick(self, now: float) -> None: ...


@dataclass
class LearnedFeedback:
    """Feeds a learned router's predictor lifecycle and (optionally) logs its decisions for OPE.

    ``router``: a router with a ``lifecycle`` (``build_router("learned", ...)``);
    ``tick_s``: the training period (default: the lifecycle's ``train_interval_s``)."""

    router: Any
    log: bool = False
    failure_cost_s: float = 60.0
    tick_s: float = 0.0
    logged: list[LoggedDecision] = field(default_factory=list)
    logged_rows: list[int] = field(default_factory=list)   # the request row of each logged decision
    observed: int = 0           # answers given to the lifecycle
    trained: int = 0            # observations it trained on
    arms: list[tuple[int, str]] = field(default_factory=list)   # (request row, arm) of each bandit decision

    def __post_init__(self) -> None:
        lc = getattr(self.router, "lifecycle", None)
        if lc is None:
            raise ValueError("LearnedFeedback needs a router with a predictor lifecycle (the learned profile)")
        self.lifecycle = lc
        if self.tick_s <= 0:
            self.tick_s = float(lc.p.train_interval_s)

    def on_finish(self, done: Finished) -> None:
        info = done.decision.learned
        if info is None or info.pick is None:
            return
        arm = observe_reward(self.router, done.decision, ok=done.outcome == "ok", stream=done.stream,
                             ttft_s=done.ttft_s, e2e_s=done.e2e_s, tokens=done.tokens)
        if arm is not None:
            self.arms.append((done.row, arm))
        if done.outcome == "ok" and done.e2e_s is not None:
            ttfb = done.ttft_s if done.stream else done.e2e_s
            # the gateway's own hook: the predictor's row and the SLO-miss risk, when on
            obs = observe_decision(self.lifecycle, done.decision, stream=done.stream, completion_tokens=done.tokens,
                                   ttfb_s=ttfb, e2e_s=done.e2e_s)
            self.observed += obs is not None
        elif done.outcome in ("failed", "timeout"):
            # no answer from the pick (it failed, or the client's timeout cut it there): the
            # gateway's hook for that
            observe_failure(self.lifecycle, done.decision)
        if self.log and info.propensity is not None and info.fallback is None:
            cost = done.queue_s + done.e2e_s if done.outcome == "ok" and done.e2e_s is not None \
                else self.failure_cost_s
            self.logged.append(LoggedDecision(done.model, info.to_json(), cost))
            self.logged_rows.append(done.row)

    def tick(self, now: float) -> None:
        self.trained += self.lifecycle.train_pending()
