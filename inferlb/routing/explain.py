"""What a learned decision records, and how to read it back.

:class:`LearnedInfo` hangs on :attr:`Decision.learned`; its ``to_json()`` is the ``learned`` part
of the audit record's decision (bounded: at most :data:`CTX_NODES` candidates, ≈ 1.5 KB):

* ``version``, ``state``: the predictor version and lifecycle state at decision time;
* ``propensity``, ``explored``, ``epsilon``: the probability the picker had of choosing this node,
  whether it explored, the exploration rate that applied (None when a fallback profile decided);
* ``fallback``, ``reason``: the profile that decided instead and why (absent when learned decided);
* ``pick``: the chosen node's predicted TTFT, TPOT, e2e and slack; ``why``: one sentence;
* ``req`` and ``ctx``: the request (tokens, stream, priority, deadline) and, per candidate, what
  routing saw (:data:`CTX_KEYS`, one column each) with its predictions and pick probability: enough to rebuild the
  decision's context, which off-policy evaluation (routing/ope_replay.py) and the retrain from the
  audit trail read back with :func:`context_of`;
* the ``predicted-latency`` scorer's per-candidate terms, as more ``ctx`` columns (same candidates,
  same order): ``slack_permille`` (the predicted slack × 1000, what the score is made of), and when
  the scorer charged them, ``others_us`` (interference: the predicted slowdown this request would
  cause the requests in flight there, µs, before the weight) and ``reserved_permille`` (tail
  reservation: the slack charged × 1000); ``interference`` holds the weight and whether this
  request was charged, ``pick`` the pick's own ``others_s`` / ``reserved``;
* ``reserve`` (with a tail reservation): ``cut``, the output budget from which this decision
  counted a request as long, and ``rule``, how the scorer draws it. An adaptive cut is a quantile
  of recent traffic, state no single record holds, so the replay of a policy with the same rule
  uses the logged cut (``PredictedLatency.pin_cut``);
* ``risk`` (a ``ctx`` column, with the SLO-miss risk on): the P(miss) the scorer charged each
  candidate, before the weight, to 9 decimals (a replay's totals move by less than the logged
  propensity's rounding). It comes from counts of earlier answers that no
  single record holds, so a replay charges the logged values (``PredictedLatency.pin_risk``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from math import trunc
from typing import Any

from inferlb.routing.features import features
from inferlb.routing.predictor import Prediction
from inferlb.routing.types import NodeView, RouteRequest, _round_to, set_ctx

__all__ = ["CTX_KEYS", "CTX_NODES", "Context", "LearnedInfo", "context_of"]

CTX_NODES = 16
# The context's columns (``ctx``: one list per key, aligned with ``ctx["node"]``). Times are
# integer µs (rounding floats costs more than the rest of the record on the request path), but the
# predicted TPOT is integer ns: the scorer's terms multiply it by the output budget and by the
# overlapping decode steps (thousands), so µs would move a replayed score by more than the
# logged propensity's own rounding (routing/ope_replay.py replays from these columns).
CTX_KEYS = ("node", "inflight_requests", "inflight_tokens", "capacity_tokens", "max_concurrency", "waiting",
            "kv_permille", "tpot_us", "ttft_us", "weight", "pred_ttft_us", "pred_tpot_ns", "p")


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else _round_to(x, nd)


def _us(x: float | None) -> int | None:
    return None if x is None or not x < 1e12 else trunc(x * 1e6)


def _permille(xs: list[float]) -> list[int | None]:
    return [trunc(x * 1000) if -1e9 < x < 1e9 else None for x in xs]


def _view_ctx(n: NodeView) -> tuple[Any, ...]:
    """The view's own columns of the context (:data:`CTX_KEYS` up to ``weight``), then its GPU
    label (the value of its last ``gpu`` / ``gpu_type`` label, None without one), memoised on the
    view (``NodeView._ctx``: a view never changes, so neither do they). ``_us`` written out (the
    same values); math.trunc is int() for a float (the same int, the same errors: a NaN KV use
    raises as before, and then nothing is memoised), without the type call."""
    gpu = None
    for k, v in n.labels:
        if k in ("gpu", "gpu_type"):
            gpu = v
    row = (n.name, n.inflight_requests, n.inflight_tokens, n.capacity_tokens, n.max_concurrency, n.waiting,
           None if (kv := n.kv_usage) is None else trunc(kv * 1000),
           None if (t := n.tokens_per_s) is None or not t > 0 else trunc(1e6 / t),
           None if (x := n.ttft_s) is None or not x < 1e12 else trunc(x * 1e6),
           n.weight, gpu)
    set_ctx(n, row)
    return row


def _columns_raise(nodes: list[NodeView]) -> None:
    """The view columns that can fail, computed column after column over ``nodes`` (as the
    context was built before its memo), so that the first failing column raises its error."""
    for n in nodes:
        if (kv := n.kv_usage) is not None:
            trunc(kv * 1000)
    for n in nodes:
        if (t := n.tokens_per_s) is not None and t > 0:
            trunc(1e6 / t)
    for n in nodes:
        if (x := n.ttft_s) is not None and x < 1e12:
            trunc(x * 1e6)


def _ctx(nodes: list[NodeView], preds: list[tuple[float, float] | None], probs: list[float | None]
         ) -> tuple[dict[str, list[Any]], dict[str, str] | None]:
    """The context's columns, and the candidates' GPU labels by name (None when none has one)."""
    # Most candidates of a decision were candidates before (a view is rebuilt only when its node
    # changes), so their columns come from the memo; one transposition (zip, in C) turns the rows
    # into the columns, the same values in the same order as a comprehension per column.
    if len(nodes) == 1 and len(preds) == 1:
        # One candidate (the pick of a fallback decision): the same columns, each of one value,
        # without the transposition's calls.
        n = nodes[0]
        name, ir, it, cap, conc, wait, kv, tpot, ttft, weight, g = n._ctx or _view_ctx(n)
        p = preds[0]
        return {
            "node": [name], "inflight_requests": [ir], "inflight_tokens": [it], "capacity_tokens": [cap],
            "max_concurrency": [conc], "waiting": [wait], "kv_permille": [kv], "tpot_us": [tpot], "ttft_us": [ttft],
            "weight": [weight],
            "pred_ttft_us": [None if p is None or not (a := p[0]) < 1e12 else trunc(a * 1e6)],
            "pred_tpot_ns": [None if p is None or not (b := p[1]) < 1e9 else trunc(b * 1e9)],
            "p": probs,
        }, None if g is None else {name: g}
    try:
        rows = [n._ctx or _view_ctx(n) for n in nodes]   # a row is never empty: falsy only when None
    except Exception:
        # A value that cannot be recorded (a NaN KV use, say): raise what the columns built one
        # after the other raised, the first bad column's error, not the first bad row's.
        _columns_raise(nodes)
        raise
    if rows:
        # Rows of one length (a tuple of _view_ctx's): zip's strict keyword, parsed per call, is not needed.
        name, ir, it, cap, conc, wait, kv, tpot, ttft, weight, gpus = map(list, zip(*rows))  # noqa: B905
    else:
        name, ir, it, cap, conc, wait, kv, tpot, ttft, weight, gpus = [], [], [], [], [], [], [], [], [], [], []
    # {name: label} in the candidates' order, a later one of the same name overwriting (as a dict
    # built node by node does); looked through only when some candidate has one.
    gpu = None
    if gpus.count(None) < len(gpus):
        gpu = {nm: g for nm, g in zip(name, gpus) if g is not None}  # noqa: B905 (two columns of the same rows)
    return {
        "node": name, "inflight_requests": ir, "inflight_tokens": it, "capacity_tokens": cap,
        "max_concurrency": conc, "waiting": wait, "kv_permille": kv, "tpot_us": tpot, "ttft_us": ttft,
        "weight": weight,
        # ``for a in [x]``: a comprehension's own name for x (an assignment), where a walrus would
        # make the name a cell of the enclosing function, dearer to read and write. No prediction
        # reads as the bound (None, as before).
        "pred_ttft_us": [None if not a < 1e12 else trunc(a * 1e6)
                         for p in preds for a in [1e12 if p is None else p[0]]],
        "pred_tpot_ns": [None if not b < 1e9 else trunc(b * 1e9)
                         for p in preds for b in [1e9 if p is None else p[1]]],
        "p": probs,
    }, gpu


@dataclass
class LearnedInfo:
    """One decision's learned part (see the module docstring). Built on the request path from
    references; formatted only by :meth:`to_json`."""

    req: RouteRequest
    version: int
    state: str
    pick: NodeView | None
    pick_pred: Prediction | None = None
    pick_slack: float | None = None
    propensity: float | None = None
    explored: bool | None = None
    epsilon: float | None = None
    fallback: str | None = None
    reason: str | None = None
    nodes: list[NodeView] = field(default_factory=list)           # the candidates scored, in order
    preds: list[tuple[float, float]] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    best: str | None = None                                       # the greedy choice, when it explored
    # The predicted-latency scorer's per-candidate terms (aligned with ``nodes``; see the module
    # docstring): slack, interference (seconds, before the weight; None: not charged), reservation.
    slack: list[float] = field(default_factory=list)
    others: list[float] | None = None
    reserved: list[float] | None = None
    interference: float = 0.0                                     # the interference weight β in force
    reserve_cut: int | None = None                                # tail reservation: the long-output cut used
    reserve_rule: str | None = None                               # ... and how the scorer draws it
    arm: str | None = None                                        # the reward bandit's arm (routing/reward.py)
    risk: list[float] | None = None                               # SLO-miss risk: P(miss) charged per candidate

    @property
    def pick_row(self) -> list[float] | None:
        """The pick's feature row (what the predictor learns from when the answer comes)."""
        return None if self.pick is None else features(self.req, self.pick)

    def why(self) -> str:
        """One sentence: who picked which node, with what prediction, and why."""
        pr = self.pick_pred
        return self._why(None if self.pick is None or pr is None else pr.e2e_s(self.req.output_tokens))

    def _why(self, e2e: float | None) -> str:
        """:meth:`why` given the pick's predicted e2e (``pick_pred.e2e_s`` of the request's output
        budget; None without a pick or a prediction), which :meth:`to_json` has computed already."""
        if self.pick is None:
            return "no node could serve"
        pr = self.pick_pred
        what = (f"predicted TTFT {pr.ttft_s:.3f} s, {pr.tpot_s * 1000:.1f} ms/token, "
                f"e2e {e2e:.3f} s" if pr is not None else "no prediction")
        if self.fallback is not None:
            return f"{self.fallback} picked {self.pick.name} ({what}): learned routing off ({self.reason})"
        if self.arm is not None and self.arm != "learned":
            return f"{self.arm} picked {self.pick.name} ({what}): {self.reason}"
        slack = f", slack {self.pick_slack:.2f}" if self.pick_slack is not None else ""
        # The pick's place is read only where it is used (with the interference terms).
        i = self._pick_index() if self.others is not None else None
        if i is not None and self.others is not None and i < len(self.others) and self.others[i] > 0:
            slack += (f", slowing the requests in flight there by {self.others[i]:.3f} s in all "
                      f"(interference weight {self.interference:g})")
        n = len(self.nodes)
        if self.explored:
            return (f"explored: picked {self.pick.name} ({what}{slack}) with probability {self.propensity:.3f} "
                    f"instead of the best, {self.best} (exploration rate {self.epsilon:g})")
        return (f"{self.pick.name} had the best score of {n} candidate(s): predicted slack with the "
                f"profile's other scorers ({what}{slack}); "
                f"picked greedily, probability {self.propensity:.3f}")

    def _pick_index(self) -> int | None:
        pick = self.pick
        if pick is None:
            return None
        for i, n in enumerate(self.nodes):
            if n is pick or n.name == pick.name:
                return i
        return None

    def to_json(self) -> dict[str, Any]:
        r = self.req
        out: dict[str, Any] = {"version": self.version, "state": self.state}
        if self.fallback is not None:
            out["fallback"] = self.fallback
            out["reason"] = self.reason
        if self.arm is not None:
            out["arm"] = self.arm
        # Set one by one: the same keys in the same order as update(**...), without the keywords' dict.
        out["propensity"] = _r(self.propensity)
        out["explored"] = self.explored
        out["epsilon"] = self.epsilon
        # The pick's predicted e2e, computed once for its record and the sentence (the same float).
        e2e = None
        if self.pick is not None:
            pr = self.pick_pred
            if pr is not None:
                e2e = pr.e2e_s(r.output_tokens)
            out["pick"] = {"node": self.pick.name,
                           "ttft_s": _r(pr.ttft_s) if pr else None, "tpot_s": _r(pr.tpot_s, 7) if pr else None,
                           "e2e_s": _r(e2e) if pr else None, "slack": _r(self.pick_slack, 4)}
            i = self._pick_index() if self.others is not None or self.reserved is not None else None
            if i is not None and self.others is not None and i < len(self.others):
                out["pick"]["others_s"] = _r(self.others[i])
            if i is not None and self.reserved is not None and i < len(self.reserved):
                out["pick"]["reserved"] = _r(self.reserved[i], 4)
        out["why"] = self._why(e2e)
        out["req"] = {"prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "stream": r.stream,
                      "priority": r.priority, "deadline_s": _r(r.deadline_s, 3)}
        nodes = self.nodes or ([self.pick] if self.pick is not None else [])
        # Without the scorer's predictions, the pick's own for each candidate (one: the pick), one
        # pair repeated rather than a comprehension building equal pairs (read, never changed).
        pp = self.pick_pred
        preds: list[tuple[float, float] | None] = list(self.preds) if self.preds else \
            [(pp.ttft_s, pp.tpot_s) if pp is not None else None] * len(nodes) if nodes else []
        probs: list[float | None] = list(self.probs) if self.probs else [None] * len(nodes)
        terms = _terms_of(self, len(nodes)) if self.nodes else {}
        if len(nodes) > CTX_NODES:   # keep the likeliest (the pick always)
            idx = sorted(range(len(nodes)), key=lambda i: -(probs[i] or 0.0))[:CTX_NODES]
            nodes, preds, probs = [nodes[i] for i in idx], [preds[i] for i in idx], [probs[i] for i in idx]
            terms = {k: [col[i] for i in idx] for k, col in terms.items()}
        out["ctx"], gpu = _ctx(nodes, preds, probs)
        out["ctx"].update(terms)
        if self.interference > 0:
            out["interference"] = {"weight": self.interference, "charged": self.others is not None}
        if self.reserve_cut is not None:
            out["reserve"] = {"cut": self.reserve_cut, "rule": self.reserve_rule}
        out["ctx_total"] = len(self.nodes) or len(nodes)
        if gpu:
            out["gpu"] = gpu
        return out


def _terms_of(info: LearnedInfo, n: int) -> dict[str, list[Any]]:
    """The scorer's per-candidate columns that line up with the ``n`` candidates (none that do not)."""
    out: dict[str, list[Any]] = {}
    if len(info.slack) == n:
        out["slack_permille"] = _permille(info.slack)
    if info.others is not None and len(info.others) == n:
        out["others_us"] = [_us(x) for x in info.others]
    if info.reserved is not None and len(info.reserved) == n:
        out["reserved_permille"] = _permille(info.reserved)
    if info.risk is not None and len(info.risk) == n:
        out["risk"] = [round(x, 9) for x in info.risk]
    return out


@dataclass
class Context:
    """A logged decision's context, rebuilt: the request, the candidates' views as routing saw
    them, their logged predictions (None where not logged) and pick probabilities."""

    req: RouteRequest
    views: list[NodeView]
    preds: dict[str, tuple[float, float] | None]
    probs: dict[str, float | None]
    complete: bool            # every candidate is in the log (ctx_total ≤ CTX_NODES)
    reserve: Mapping[str, Any] | None = None   # the logged tail-reservation cut and its rule
    risk: dict[str, float] | None = None       # the logged SLO-miss risk per candidate (None: not logged)


def context_of(learned: Mapping[str, Any], model: str) -> Context:
    """Rebuild a decision's :class:`Context` from its logged ``learned`` JSON (KeyError /
    TypeError / ValueError on a malformed record)."""
    q = learned["req"]
    req = RouteRequest(model=model, prompt_tokens=int(q["prompt_tokens"]), output_tokens=int(q["output_tokens"]),
                       priority=q.get("priority"), stream=bool(q.get("stream")),
                       deadline_s=None if q.get("deadline_s") is None else float(q["deadline_s"]))
    ctx = learned["ctx"]
    gpu = learned.get("gpu") or {}
    views: list[NodeView] = []
    preds: dict[str, tuple[float, float] | None] = {}
    probs: dict[str, float | None] = {}

    def col(k: str, i: int) -> Any:
        c = ctx.get(k)
        return None if c is None or i >= len(c) else c[i]

    for i, name in enumerate(ctx["node"]):
        tpot, ttft, kv, w = col("tpot_us", i), col("ttft_us", i), col("kv_permille", i), col("waiting", i)
        views.append(NodeView(
            name=name, models=frozenset({model}), capacity_tokens=int(col("capacity_tokens", i) or 1),
            max_concurrency=int(col("max_concurrency", i) or 1), weight=float(col("weight", i) or 1.0),
            inflight_requests=int(col("inflight_requests", i) or 0),
            inflight_tokens=int(col("inflight_tokens", i) or 0),
            waiting=None if w is None else int(w), kv_usage=None if kv is None else kv / 1000,
            tokens_per_s=None if not tpot else 1e6 / tpot, ttft_s=None if ttft is None else ttft / 1e6,
            labels=(("gpu", str(gpu[name])),) if name in gpu else ()))
        a, b_ns, b_us = col("pred_ttft_us", i), col("pred_tpot_ns", i), col("pred_tpot_us", i)
        b = b_ns / 1e9 if b_ns is not None else None if b_us is None else b_us / 1e6   # older records: µs
        preds[name] = None if a is None or b is None else (a / 1e6, b)
        p = col("p", i)
        probs[name] = None if p is None else float(p)
    total = int(learned.get("ctx_total") or len(views))
    reserve = learned.get("reserve")
    rc = ctx.get("risk")
    risk = None if rc is None else {name: float(x) for name, x in zip(ctx["node"], rc, strict=False)
                                    if x is not None}
    return Context(req, views, preds, probs, complete=total <= len(views),
                   reserve=reserve if isinstance(reserve, Mapping) else None, risk=risk)
