"""The ``learned`` profile's plugins: the ``predicted-latency`` scorer and the ``softmax-bandit`` picker.

Both are synchronous, pure apart from the injected ``rng`` and the predictor they are bound to, and
keep what their last call saw (``last``) so the router that called them can explain the decision in
the same ``decide`` call (routing/guarded.py). Neither reads a clock or does I/O.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferlb.errors import InferlbError
from inferlb.routing.miss_risk import MissRisk
from inferlb.routing.predictor import OnlineLinear
from inferlb.routing.quantile import WindowQuantile
from inferlb.routing.types import NodeView, RouteRequest

__all__ = ["BanditChoice", "PredictedLatency", "PredictedLatencyParams", "PredictionFault", "Scored",
           "SoftmaxBandit", "SoftmaxBanditParams"]


class PredictionFault(InferlbError):
    """The predictor's answer cannot be used (NaN, infinite, ≤ 0, missing, or it raised)."""


class PredictedLatencyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttft_slo_s: float = Field(1.0, gt=0)      # TTFT budget of a streamed request
    e2e_slo_s: float = Field(30.0, gt=0)      # end-to-end budget when the request has no deadline
    # Interference (0: off, the request's own predicted latency alone): the weight of the slowdown
    # this request is predicted to cause the requests in flight on the node, added to its own
    # predicted e2e before the slack is taken (see PredictedLatency).
    interference: float = Field(0.0, ge=0)
    # d log(TPOT) / d log(in-flight tokens) used by the interference term; None: the predictor's
    # own learned response (its ``tpot_elasticity(node)``, floored at 0; 0 when it has none).
    elasticity: float | None = Field(0.5, ge=0, le=2)
    # Size-aware: charge the interference term only to requests whose output budget is at most
    # this (None: to every request), so short work is kept off the busy nodes the long outputs need.
    interference_max_output: int | None = Field(None, ge=0)
    # Tail reservation (0: off): the share of a *fast* node's token capacity held back for long
    # requests (output budget ≥ ``reserve_min_output``); a shorter request pays ``reserve_weight``
    # of slack, in proportion to how deep into that reserve it would reach (see PredictedLatency).
    reserve: float = Field(0.0, ge=0, lt=1)
    reserve_min_output: int = Field(256, ge=1)
    # Adaptive cut (None: the fixed ``reserve_min_output``): a request is long when its output
    # budget is ≥ this quantile of the output budgets of the last ``reserve_window`` requests
    # scored (``reserve_min_output`` until ``RESERVE_MIN_SAMPLES`` have been seen), so the
    # reservation holds the fast nodes for the same share of the traffic, the share that forms
    # the tail, whatever the workload's lengths are.
    reserve_quantile: float | None = Field(None, gt=0, lt=1)
    reserve_window: int = Field(4096, ge=1, le=1_000_000)
    # A candidate is fast when its predicted TPOT ≤ (1 + reserve_fast) × the fastest candidate's.
    reserve_fast: float = Field(0.25, ge=0)
    reserve_weight: float = Field(1.0, ge=0)
    # Prefill interference (0: off): the weight of the stall this request's prompt is predicted to
    # cause the requests in flight on the node (a step that prefills a prompt, or a chunk of one,
    # is longer for every running sequence); see PredictedLatency.
    prefill_interference: float = Field(0.0, ge=0)
    # SLO miss (0: off): slack charged, as a step, on a candidate where this request's own
    # predicted latency misses its SLO: TTFT > ``miss_ttft_s`` (streams) or e2e > the deadline when
    # the request has one, else ``miss_e2e_s`` (None: ``ttft_slo_s`` / ``e2e_slo_s``). Goodput
    # counts a request by whether it met its SLO, a step the linear slack does not have.
    miss_weight: float = Field(0.0, ge=0)
    miss_ttft_s: float | None = Field(None, gt=0)
    miss_e2e_s: float | None = Field(None, gt=0)
    # SLO-miss risk (0: off): slack charged as ``risk_weight`` × a learned P(miss) of this request on
    # the candidate (routing/miss_risk.py: decayed Beta-Bernoulli counts per node, band of the
    # gateway's in-flight tokens ÷ capacity at the decision (``risk_bands``' edges) and stream),
    # learned from the answers' outcomes judged against the same budgets as ``miss_weight``.
    risk_weight: float = Field(0.0, ge=0)
    risk_bands: list[float] = Field(default_factory=lambda: [0.8, 0.9, 0.95], min_length=1)
    risk_half_life: float = Field(200.0, gt=0)     # answers of one key until an answer weighs 1/2
    risk_prior: float = Field(0.01, ge=0, le=1)     # prior miss rate of a band never seen
    risk_prior_n: float = Field(20.0, gt=0)         # its strength, in answers
    # What counts as a stream's miss: "ttft" (its TTFT alone) or "slo" (TTFT or e2e: goodput's test).
    risk_judge: Literal["ttft", "slo"] = "ttft"
    # Prompt-token edges that split the counts by prompt size as well (empty: no split), so a long
    # document and a chat turn on the same node and band are counted apart.
    risk_prompt_bands: list[int] = Field(default_factory=list)
    # What the counts are kept per: "node" (each node apart) or "class" (the nodes of one GPU class
    # pooled: its gpu / gpu_type label, else its token capacity; routing/miss_risk.py class_of).
    risk_key: Literal["node", "class"] = "node"
    # Whether an attempt that got no answer on the node (a failure, or the client's deadline cut
    # it there: what the gateway and the DES see) counts as a miss; False: only answers teach it.
    risk_failures: bool = False

    @field_validator("risk_bands", "risk_prompt_bands")
    @classmethod
    def _increasing(cls, v: list[Any]) -> list[Any]:
        if any(not x > 0 for x in v) or any(b <= a for a, b in itertools.pairwise(v)):
            raise ValueError(f"band edges must be > 0 and increasing, got {v!r}")
        return v


RESERVE_MIN_SAMPLES = 100   # output budgets seen before the adaptive cut replaces the fixed one


def _check(preds: list[tuple[float, float]]) -> None:
    """PredictionFault for the first prediction that is not finite and > 0."""
    inf = math.inf
    for a, b in preds:
        if not (0 < a < inf and 0 < b < inf):
            raise PredictionFault(f"predictor returned TTFT {a!r}, TPOT {b!r} (must be finite, > 0)")


# predict_nodes of the built-in predictor: its answers are each NaN or finite and > 0 (see score_all).
_BOUNDED_PREDICT = OnlineLinear.predict_nodes


@dataclass
class Scored:
    """What the scorer's last call saw: the nodes, their predicted (TTFT, TPOT), slack and score."""

    nodes: list[NodeView]
    preds: list[tuple[float, float]]
    slack: list[float]
    scores: list[float]
    others_s: list[float] | None = None    # interference: predicted slowdown of the others, seconds
    reserved: list[float] | None = None    # tail reservation: slack charged per node (short requests)
    reserve_cut: int | None = None         # tail reservation: the output budget that counted as long
    risk: list[float] | None = None        # SLO-miss risk: the P(miss) charged per node (before the weight)


class PredictedLatency:
    """Scores each candidate by its predicted *slack*: the smallest share of a budget left after
    the predicted latency, over the budgets that apply: TTFT (``ttft_slo_s``, streamed requests
    only) and end to end (``req.deadline_s`` when the request has a deadline, else ``e2e_slo_s``),
    predicted e2e = TTFT + TPOT × (output budget − 1). score = clamp(0.5 + 0.5 × slack, 0, 1):
    1 for an instant answer, 0.5 at the budget, 0 at twice the budget, so the node with the most
    slack scores highest and the picker can tell "all late" from "all fine".

    Reads the candidates through the bound predictor (``bind``; the predictor reads the request's
    tokens, stream and priority and each node's in-flight tokens and requests, waiting, KV use,
    recent TTFT and tokens/s, capacity and GPU label). Raises :class:`PredictionFault` when the
    predictor has no usable answer; the router then falls back for this decision.

    Interference (``interference`` = β > 0): a request placed on a node also slows the requests
    already decoding there (they share its batch steps), which a per-request slack cannot see. With
    T the node's in-flight tokens, n its in-flight requests, d this request's tokens (prompt +
    output budget), o its output budget, τ its predicted TPOT there and e the elasticity
    (``elasticity``, or the predictor's learned one):

        others = τ · e · d / (T + d)  ×  min(n · o, T)

    the predicted rise of the node's time per token times the decode steps of the others that
    overlap this request (at most o each, at most the tokens in flight in all), and the latency
    judged is own e2e + β · others. With ``interference_max_output`` = m only requests with o ≤ m
    are charged (size-aware: short work kept off the busy nodes, long outputs judged on their own
    latency). O(candidates), no I/O; the per-node terms are in ``last``.

    Tail reservation (``reserve`` = r > 0; trunk reservation across speed classes): the p99 of a
    heavy-tailed workload is its long outputs, and their time is TPOT × length, so they need fast
    nodes whose batches are light *when they arrive*, which a greedy per-request score cannot keep.
    A candidate is *fast* when its predicted TPOT for this request is within ``reserve_fast`` of
    the fastest candidate's. On a fast node with token capacity C and in-flight tokens T, the top
    r · C tokens are held for requests with output budget ≥ ``reserve_min_output``: a shorter
    request of d tokens has its slack lowered by

        reserve_weight × clamp((T + d − (1 − r) · C) / (r · C), 0, 1)

    (nothing while it fits below the reserve, the full weight when it would fill it), so short
    work spreads to the slower classes while they have slack, and still takes a fast node when
    every other choice is worse by more than the charge. Long requests are scored as without it.

    Prefill interference (``prefill_interference`` = γ > 0): an engine step that prefills a prompt
    delays every sequence running there by that prefill, and prefill speed differs across GPU
    classes far more than decode speed (a long prompt on a slow-prefill node stalls its whole
    batch). The stall is taken as the request's predicted TTFT there (its prefill plus any wait: an
    upper bound on the prefill alone, as the router has no separate prefill estimate) times the
    node's in-flight requests n, and the latency judged is own e2e + γ · TTFT · n (on top of the
    decode interference above, when that is on). Applies to every request, long or short.

    SLO miss (``miss_weight`` = m > 0): goodput counts a request by whether it met its SLO, a step
    in its latency that the linear slack does not have. On a candidate where the request's own
    predicted latency misses its SLO (predicted TTFT > ``miss_ttft_s`` for a stream, or predicted
    e2e > the request's deadline, else ``miss_e2e_s``; each None: ``ttft_slo_s`` / ``e2e_slo_s``),
    its slack is lowered by m, so a request that can meet its SLO somewhere goes where it does.
    The interference terms are not part of that prediction (they are the others' latency). A
    charge every candidate pays changes no ranking (the picker ranks totals).

    SLO-miss risk (``risk_weight`` = w > 0): the step above tests the *mean* prediction, which stays
    low on a node where one answer in eight waits seconds (a nearly full KV cache). This charge
    learns the *share* of misses instead: P(miss) per (node, band of its in-flight tokens ÷
    capacity as the gateway counts them at the decision, stream), from the outcomes of the answers
    this scorer's decisions placed (:meth:`observe_outcome`, called by the predictor lifecycle's
    feedback path), and lowers each candidate's slack by w × P(miss). A streamed answer misses when
    its TTFT exceeds ``miss_ttft_s`` (None: ``ttft_slo_s``), another when its e2e exceeds the
    request's deadline, else ``miss_e2e_s`` (None: ``e2e_slo_s``): like with like; with
    ``risk_judge`` "slo" a stream misses also when its e2e exceeds that budget (goodput's test).
    ``risk_prompt_bands`` splits the counts by the request's prompt tokens too; ``risk_key``
    "class" pools them over the nodes of one GPU class; ``risk_failures`` counts an attempt that
    got no answer on the node (failed, or cut there by the client's deadline) as a miss. O(candidates),
    one lookup each; the P(miss) charged are in ``last.risk`` (and the decision's audit, for a
    replay: :meth:`pin_risk`). The counts are kept in memory only (routing/miss_risk.py)."""

    type_name = "predicted-latency"
    Params = PredictedLatencyParams

    def __init__(self, params: PredictedLatencyParams | None = None) -> None:
        self.p = params or PredictedLatencyParams()
        self.predictor: Any = None
        self.last: Scored | None = None
        q = self.p.reserve_quantile
        self._lengths = WindowQuantile(self.p.reserve_window) if q is not None and self.p.reserve > 0 else None
        # How this scorer draws the long-output cut, logged with each decision's cut (``rule``, None
        # without a reservation): a replay may use a logged cut only if it was drawn the same way.
        self.cut_rule: str | None = None
        if self.p.reserve > 0:
            # "<fixed cut>" or "q<quantile>/w<window>/<cut before RESERVE_MIN_SAMPLES budgets>"
            self.cut_rule = (str(self.p.reserve_min_output) if self._lengths is None else
                             f"q{q:g}/w{self.p.reserve_window}/{self.p.reserve_min_output}")
        self._pinned_cut: int | None = None
        p = self.p
        self.risk = MissRisk(p.risk_bands, half_life=p.risk_half_life, prior_rate=p.risk_prior,
                             prior_n=p.risk_prior_n, key=p.risk_key) if p.risk_weight > 0 else None
        self._pinned_risk: Mapping[str, float] | None = None

    def observe_outcome(self, req: RouteRequest, view: NodeView, *, ttfb_s: float | None,
                        e2e_s: float | None, failed: bool = False) -> None:
        """One successful answer of a request this scorer's decision placed on ``view`` (the
        node as the gateway saw it at the decision; times from the start at the node, the first
        byte of a streamed answer its first token): teach the miss risk whether it met its SLO
        (see the class docstring). Nothing when the risk term is off or a time is missing.
        ``failed``: the attempt got no answer there; a miss with ``risk_failures``, else nothing."""
        risk = self.risk
        if risk is None:
            return
        p = self.p
        if failed:
            if p.risk_failures:
                risk.observe(risk.key_of(view), view.inflight_tokens, view.capacity_tokens,
                             self._risk_kind(req), True)
            return
        budget = req.deadline_s if req.deadline_s is not None and req.deadline_s > 0 \
            else (p.miss_e2e_s or p.e2e_slo_s)
        if req.stream:
            if ttfb_s is None:
                return
            missed = ttfb_s > (p.miss_ttft_s or p.ttft_slo_s)
            if p.risk_judge == "slo" and not missed:
                if e2e_s is None:
                    return
                missed = e2e_s > budget
        else:
            if e2e_s is None:
                return
            missed = e2e_s > budget
        risk.observe(risk.key_of(view), view.inflight_tokens, view.capacity_tokens, self._risk_kind(req), missed)

    def _risk_kind(self, req: RouteRequest) -> int:
        """The miss counts' kind of ``req``: streamed or not, and its prompt band when split."""
        kind = 1 if req.stream else 0
        edges = self.p.risk_prompt_bands
        return kind + 2 * bisect.bisect_right(edges, req.prompt_tokens) if edges else kind

    def pin_risk(self, logged: Mapping[str, float] | None) -> None:
        """Off-policy replay (routing/ope_replay.py): charge the next decisions the P(miss) a
        logged decision charged (node name → probability; a node not in it: 0) instead of this
        scorer's own counts, which a replay cannot rebuild; ``None``: back to its own counts."""
        self._pinned_risk = logged

    def pin_cut(self, logged: Mapping[str, Any] | None) -> None:
        """Off-policy replay (routing/ope_replay.py): score the next decisions with the cut a logged
        decision used (its ``reserve`` record: ``cut`` and ``rule``) when this scorer draws its cut by
        the same rule; the window then learns nothing from them, since a replay is not traffic. With
        another adaptive rule, or ``None``, the scorer goes back to its own window (for a rule
        other than the logged one the replayed window is an approximation: the log holds the
        budgets of logged decisions only, in completion order). A fixed cut needs no pinning."""
        cut = None if logged is None else logged.get("cut")
        ok = self._lengths is not None and isinstance(cut, int) and logged is not None \
            and logged.get("rule") == self.cut_rule
        self._pinned_cut = cut if ok else None

    def reserve_cut(self) -> int:
        """The output budget from which a request counts as long for the tail reservation: the
        ``reserve_quantile`` of the recent budgets once enough were seen, else ``reserve_min_output``."""
        w = self._lengths
        if w is None or len(w) < RESERVE_MIN_SAMPLES or self.p.reserve_quantile is None:
            return self.p.reserve_min_output
        cut = w.quantile(self.p.reserve_quantile)
        return max(1, cut) if cut is not None else self.p.reserve_min_output

    def bind(self, predictor: Any) -> None:
        """``predictor``: anything with ``predict_nodes(req, nodes)`` (a model, or the lifecycle's
        current model through :class:`~inferlb.routing.guarded.GuardedRouter`)."""
        self.predictor = predictor

    def score(self, req: RouteRequest, node: NodeView) -> float:
        return self.score_all(req, [node])[0]

    def score_all(self, req: RouteRequest, nodes: list[NodeView]) -> list[float]:
        model = self.predictor
        if model is None:
            raise PredictionFault("no predictor loaded")
        try:
            raw = model.predict_nodes(req, nodes)
            preds = raw if isinstance(raw, list) else [(float(a), float(b)) for a, b in raw]
        except PredictionFault:
            raise
        except Exception as exc:   # a user's predictor may raise anything: fall back, say why
            raise PredictionFault(f"predictor raised {type(exc).__name__}: {exc}") from exc
        if len(preds) != len(nodes):
            raise PredictionFault(f"predictor returned {len(preds)} predictions for {len(nodes)} nodes")
        # The params read from the model's own dict, where pydantic keeps each field's value (what
        # ``self.p.x`` returns, assignments included), without the attribute hook that a
        # BaseModel's ``__getattr__`` puts on every read (≈ 0.5 k instructions each, eight here).
        pv = self.p.__dict__
        e2e_budget = req.deadline_s if req.deadline_s is not None and req.deadline_s > 0 else pv["e2e_slo_s"]
        ttft_budget = pv["ttft_slo_s"] if req.stream else None
        beta = pv["interference"]
        cap_o = pv["interference_max_output"]
        reserve = pv["reserve"]
        charged = beta > 0 and (cap_o is None or req.output_tokens <= cap_o)
        # The built-in predictor's answers are each NaN or finite and > 0 (its log-predictions
        # clipped before the exp), and a NaN prediction makes that node's slack NaN: in the
        # common case (no interference charged, no reservation, not streamed: nothing is
        # changed or called between the check and the slack) the check waits for the slack and
        # runs only when their sum is NaN, raising what it raised before (the first bad pair's).
        deferred = getattr(type(model), "predict_nodes", None) is _BOUNDED_PREDICT and not charged \
            and ttft_budget is None and not reserve > 0
        if not deferred:
            _check(preds)
        rest = max(0, req.output_tokens - 1)
        slack: list[float] = []
        others = self._others(req, nodes, preds, model) if charged else None
        cut: int | None = None
        reserved = None
        if reserve > 0:
            if self._pinned_cut is not None:   # a replay of a logged decision (pin_cut)
                cut = self._pinned_cut
            else:
                cut = self.reserve_cut()
                if self._lengths is not None:   # seen after the cut is read: a request is not its own reference
                    self._lengths.add(max(0, req.output_tokens))
            if req.output_tokens < cut:
                reserved = self._reserved(req, nodes, preds)
        bp = pv["prefill_interference"]
        # min() and max() of two written out: the same floats (every term is finite here), no calls.
        if others is None and reserved is None and ttft_budget is None:
            # The common case (no interference charged, no reservation, not streamed) as one
            # comprehension: the loop's own expression, term for term in the same order
            # (``a + b·rest``, then ``+ bp·a·k``), so the same floats.
            if bp > 0:
                # ``for k in [x]``: the comprehension's own name (an assignment; a walrus would make
                # it a cell of this function, dearer to read and write here and in the loop below).
                slack = [(e2e_budget - (a + b * rest + bp * a * (k if k > 0 else 0))) / e2e_budget
                         for n, (a, b) in zip(nodes, preds)  # noqa: B905 (lengths checked above)
                         for k in [n.inflight_requests]]
            else:
                slack = [(e2e_budget - (a + b * rest)) / e2e_budget for a, b in preds]
            if deferred and (sm := sum(slack)) != sm:
                _check(preds)
        else:
            for i, (a, b) in enumerate(preds):
                own = a + b * rest
                if others is not None:
                    own += beta * others[i]
                if bp > 0:
                    own += bp * a * (k if (k := nodes[i].inflight_requests) > 0 else 0)
                s = (e2e_budget - own) / e2e_budget
                if ttft_budget is not None:
                    t = (ttft_budget - a) / ttft_budget
                    s = t if t < s else s
                if reserved is not None:
                    s -= reserved[i]
                slack.append(s)
        mw = pv["miss_weight"]
        if mw > 0:   # the SLO-miss step, last, as the loop would subtract it: the same floats
            self._charge_misses(req, preds, rest, e2e_budget, slack, mw)
        risk = None
        if self.risk is not None:   # the SLO-miss risk, after the step: w × P(miss) per candidate
            pinned = self._pinned_risk
            risk = self.risk.probabilities(nodes, self._risk_kind(req)) if pinned is None else \
                [pinned.get(n.name, 0.0) for n in nodes]
            rw = self.p.risk_weight
            for i, q in enumerate(risk):
                slack[i] -= rw * q
        scores = [(x if x < 1.0 else 1.0) if x > 0.0 else 0.0 for s in slack for x in [0.5 + 0.5 * s]]
        self.last = Scored(list(nodes), preds, slack, scores, others, reserved, cut, risk)
        return scores

    def _charge_misses(self, req: RouteRequest, preds: Sequence[tuple[float, float]], rest: int,
                       e2e_budget: float, slack: list[float], mw: float) -> None:
        """Lower ``slack`` (in place) by ``mw`` where the request's own predicted latency misses its
        SLO: TTFT past ``miss_ttft_s`` (streams) or e2e past its deadline, else ``miss_e2e_s``."""
        p = self.p
        miss_e2e = e2e_budget if req.deadline_s is not None and req.deadline_s > 0 else (p.miss_e2e_s or p.e2e_slo_s)
        miss_ttft = (p.miss_ttft_s or p.ttft_slo_s) if req.stream else math.inf
        for i, (a, b) in enumerate(preds):
            if a + b * rest > miss_e2e or a > miss_ttft:
                slack[i] -= mw

    def _reserved(self, req: RouteRequest, nodes: Sequence[NodeView],
                  preds: Sequence[tuple[float, float]]) -> list[float]:
        """The slack a short request is charged on each node for reaching into its reserve (see
        the class docstring): 0 on the slower candidates and below the reserve."""
        r = self.p.reserve
        w = self.p.reserve_weight
        fast = (1.0 + self.p.reserve_fast) * min([b for _, b in preds])
        d = max(0, req.tokens)
        out: list[float] = []
        for n, (_, b) in zip(nodes, preds, strict=True):
            cap = n.capacity_tokens
            if b > fast or cap <= 0:
                out.append(0.0)
                continue
            over = ((t if (t := n.inflight_tokens) > 0 else 0) + d - (1.0 - r) * cap) / (r * cap)
            out.append(w * (over if over < 1.0 else 1.0) if over > 0.0 else 0.0)
        return out

    def _others(self, req: RouteRequest, nodes: Sequence[NodeView], preds: Sequence[tuple[float, float]],
                model: Any) -> list[float]:
        """The predicted slowdown (seconds, summed over the requests in flight) that placing ``req``
        on each node causes the others there (see the class docstring)."""
        d = max(0, req.tokens)
        o = max(0, req.output_tokens)
        fixed = self.p.elasticity
        learned = None if fixed is not None else getattr(model, "tpot_elasticity", None)
        out: list[float] = []
        for n, (_, tpot) in zip(nodes, preds, strict=True):
            t = n.inflight_tokens
            k = n.inflight_requests
            if t <= 0 or k <= 0 or d <= 0:
                out.append(0.0)
                continue
            if fixed is not None:
                e = fixed
            else:
                try:
                    e = float(learned(n)) if learned is not None else 0.0
                except Exception:   # a user's predictor: no learned response, no interference term
                    e = 0.0
                e = min(2.0, e) if e > 0 else 0.0   # NaN and negative → 0
            out.append(tpot * e * d / (t + d) * (t if t < (ko := k * o) else ko))
        return out


def _softmax_draw(ex: Sequence[float], x: float) -> int:
    """The exploring branch's pick: the first place where ``x`` (a uniform draw times
    ``sum(ex)``) minus the softmax terms so far reaches 0; the last place if rounding never gets
    there."""
    for j, e in enumerate(ex):
        x -= e
        if x <= 0:
            return j
    return len(ex) - 1


class SoftmaxBanditParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    epsilon: float = Field(0.05, ge=0, le=1)          # exploration rate
    temperature: float = Field(0.05, gt=0)           # softmax temperature over the total score
    never_explore: list[str] = Field(default_factory=lambda: ["critical"])   # priority classes


@dataclass
class BanditChoice:
    pick: str
    propensity: float          # probability this policy picks ``pick`` for this context
    explored: bool             # the exploring branch chose a node other than the greedy best
    epsilon: float             # the exploration rate that applied (0 for never-explore classes)
    probs: list[float]         # per scored node, in the order given


class SoftmaxBandit:
    """An ε-greedy bandit with softmax exploration over the profile's total score (the filters
    ran first, so exploration only ever picks among nodes that may serve):

        P(node) = (1 − ε) · [node is a best node] / (number of best nodes)
                  + ε · exp(total / T) / Σ exp(total' / T)

    ε = 0 for the priority classes in ``never_explore`` (critical by default). The pick's
    probability is its *propensity*, logged with the decision for off-policy evaluation. The rest
    of the ranking (fallbacks) is by score. Randomness from ``rng`` only."""

    type_name = "softmax-bandit"
    Params = SoftmaxBanditParams

    def __init__(self, params: SoftmaxBanditParams | None = None) -> None:
        self.p = params or SoftmaxBanditParams()
        self._never = frozenset(self.p.never_explore)
        self.last: BanditChoice | None = None

    def epsilon_for(self, req: RouteRequest | None) -> float:
        if req is not None and req.priority in self._never:
            return 0.0
        return self.p.epsilon

    def probabilities(self, req: RouteRequest | None, scored: Sequence[tuple[NodeView, float]]) -> list[float]:
        """The exact probability of each scored node being picked."""
        if not scored:
            return []
        return self._probabilities(self.epsilon_for(req), [s for _, s in scored])[0]

    def _probabilities(self, eps: float, totals: list[float]
                       ) -> tuple[list[float], float, list[float], list[bool], int]:
        """:meth:`probabilities` from the totals alone, with the best total, the softmax terms,
        which totals are the best (``s >= best``) and how many."""
        best = max(totals)
        ties = [s >= best for s in totals]
        k = sum(ties)
        t = self.p.temperature
        exp = math.exp
        ex = [exp((s - best) / t) for s in totals]
        z = sum(ex)
        keep = 1 - eps
        return ([keep * (1.0 / k if tie else 0.0) + eps * e / z for tie, e in zip(ties, ex, strict=True)], best, ex,
                ties, k)

    def rank(self, scored: list[tuple[NodeView, float]], rng: random.Random) -> list[str]:
        return self.rank_for(None, scored, rng)

    def rank_for(self, req: RouteRequest | None, scored: list[tuple[NodeView, float]],
                 rng: random.Random) -> list[str]:
        return self.rank_totals_for(req, [n for n, _ in scored], [s for _, s in scored], rng)

    def rank_totals_for(self, req: RouteRequest | None, nodes: list[NodeView], totals: list[float],
                        rng: random.Random) -> list[str]:
        """``rank_for(req, list(zip(nodes, totals)), rng)`` without building the pairs (what the
        router calls): the same ranking, the same :attr:`last`, the same draws. ``nodes`` and
        ``totals`` must be of one length (ValueError otherwise)."""
        if len(nodes) != len(totals):
            raise ValueError("nodes and totals of unequal length")
        if not totals:
            self.last = None
            return []
        eps = self.epsilon_for(req)
        best = max(totals)
        # One best node and no NaN (the common case): its probability and the others' as
        # _probabilities gives them, term for term, without the per-node tie flags. ``s >= best``
        # is ``s == best`` for every s when the sum is not NaN (no NaN total, so the best is a
        # number); ``keep · 0.0 + y`` is ``y`` for the others' ``y = ε · e / z ≥ +0.0``.
        if (k := totals.count(best)) == 1 and (sm := sum(totals)) == sm:
            t = self.p.temperature
            exp = math.exp
            ex = [exp((s - best) / t) for s in totals]
            z = sum(ex)
            g = totals.index(best)
            probs = [eps * e / z for e in ex]
            probs[g] = (1 - eps) * (1.0 / k) + eps * ex[g] / z
            explore = eps > 0 and rng.random() < eps
            i = _softmax_draw(ex, rng.random() * z) if explore else g
            # The rest by score, best first, equal totals in the order given: a stable sort on
            # the totals reversed is the stable sort on −total (no NaN: the same comparisons).
            order = sorted(range(len(totals)), key=totals.__getitem__, reverse=True)
            self.last = BanditChoice(nodes[i].name, probs[i], explore and i != g, eps, probs)
            return [nodes[i].name, *[nodes[j].name for j in order if j != i]]
        probs, best, ex, ties, k = self._probabilities(eps, totals)
        # The best nodes' places (where s >= best); one search when there is one best.
        greedy = [ties.index(True)] if k == 1 else [i for i, tie in enumerate(ties) if tie]
        explore = eps > 0 and rng.random() < eps
        if explore:
            i = _softmax_draw(ex, rng.random() * sum(ex))
        else:
            i = greedy[math.trunc(rng.random() * len(greedy))] if len(greedy) > 1 else greedy[0]
        pick = nodes[i].name
        # The rest by score, best first, equal scores in the order given (a stable sort on −score).
        neg = [-s for s in totals]
        order = sorted(range(len(totals)), key=neg.__getitem__)
        self.last = BanditChoice(pick, probs[i], explore and i not in greedy, eps, probs)
        return [pick, *[nodes[j].name for j in order if j != i]]
