"""The learned profile's audit copy and scorer as they were before their speed work (main at
cbae0a6): ``LearnedInfo.why`` / ``to_json`` with ``_ctx`` (routing/explain.py) and
``PredictedLatency.score_all`` (routing/learned.py), and ``SoftmaxBandit.rank_for`` as it was
at 04c1f97, copied verbatim into subclasses (renamed ``Ref*``), the guarded router's
``_explain`` (routing/guarded.py, ``RefGuardedRouter``) and the predictor's feature rows
(routing/features.py ``request_part`` / ``node_part``, renamed ``ref_*``) as they were at
7d42050, so tests/routing/test_routing_learned_differential.py can hold the optimised ones to
the same decisions, the same rows and the same audit JSON. Everything else comes from the
product's modules.

Not used by the product. Change it only to mirror a deliberate change of behaviour.
"""

from __future__ import annotations

import math
import random
from math import trunc
from typing import Any

from inferlb.routing.explain import CTX_NODES, LearnedInfo, _r, _terms_of
from inferlb.routing.features import _gpu
from inferlb.routing.guarded import GuardedRouter
from inferlb.routing.learned import BanditChoice, PredictedLatency, PredictionFault, Scored, SoftmaxBandit
from inferlb.routing.predictor import Prediction
from inferlb.routing.types import Decision, NodeView, RouteRequest

__all__ = ["RefGuardedRouter", "RefLearnedInfo", "RefPredictedLatency", "RefSoftmaxBandit", "ref_node_part",
           "ref_request_part"]


def ref_request_part(req: RouteRequest, critical: str = "critical") -> list[float]:
    """The request's features (the first five of every row)."""
    return [1.0, math.log1p(max(0, req.prompt_tokens)), math.log1p(max(0, req.output_tokens)),
            1.0 if req.stream else 0.0, 1.0 if req.priority == critical else 0.0]


def ref_node_part(node: NodeView) -> list[float]:
    """The node's features (the rest of every row). Non-finite or non-positive recent times count
    as unknown, so a bad sample cannot poison a prediction."""
    t = node.ttft_s
    tps = node.tokens_per_s
    w = node.waiting
    kv = node.kv_usage
    cap = node.capacity_tokens
    ttft_ok = t is not None and 0 < t < math.inf
    tps_ok = tps is not None and 0 < tps < math.inf
    return [
        math.log(t) if ttft_ok else 0.0, 0.0 if ttft_ok else 1.0,   # type: ignore[arg-type]
        -math.log(tps) if tps_ok else 0.0, 0.0 if tps_ok else 1.0,  # type: ignore[arg-type]
        math.log1p(max(0, node.inflight_tokens) / 1000.0), math.log1p(max(0, node.inflight_requests)),
        math.log1p(max(0, w)) if w is not None else 0.0, 0.0 if w is not None else 1.0,
        min(1.0, max(0.0, kv)) if kv is not None and kv == kv else 0.0, 0.0 if kv is not None else 1.0,
        min(4.0, max(0, node.inflight_tokens) / cap) if cap > 0 else 0.0,
        *_gpu(node.labels),
    ]


def _ctx(nodes: list[NodeView], preds: list[tuple[float, float] | None], probs: list[float | None]
         ) -> dict[str, list[Any]]:
    # _us and _ns written out in the columns (the same values; a call per cell cost more than the cell).
    # math.trunc is int() for a float (the same int, the same errors), without the type call.
    return {
        "node": [n.name for n in nodes],
        "inflight_requests": [n.inflight_requests for n in nodes],
        "inflight_tokens": [n.inflight_tokens for n in nodes],
        "capacity_tokens": [n.capacity_tokens for n in nodes],
        "max_concurrency": [n.max_concurrency for n in nodes],
        "waiting": [n.waiting for n in nodes],
        "kv_permille": [None if (k := n.kv_usage) is None else trunc(k * 1000) for n in nodes],
        "tpot_us": [None if (t := n.tokens_per_s) is None or not t > 0 else trunc(1e6 / t) for n in nodes],
        "ttft_us": [None if (x := n.ttft_s) is None or not x < 1e12 else trunc(x * 1e6) for n in nodes],
        "weight": [n.weight for n in nodes],
        "pred_ttft_us": [None if p is None or not (a := p[0]) < 1e12 else trunc(a * 1e6) for p in preds],
        "pred_tpot_ns": [None if p is None or not (b := p[1]) < 1e9 else trunc(b * 1e9) for p in preds],
        "p": probs,
    }


class RefLearnedInfo(LearnedInfo):
    """:class:`LearnedInfo` with the earlier ``why`` and ``to_json``."""

    def why(self) -> str:
        if self.pick is None:
            return "no node could serve"
        pr = self.pick_pred
        what = (f"predicted TTFT {pr.ttft_s:.3f} s, {pr.tpot_s * 1000:.1f} ms/token, "
                f"e2e {pr.e2e_s(self.req.output_tokens):.3f} s" if pr is not None else "no prediction")
        if self.fallback is not None:
            return f"{self.fallback} picked {self.pick.name} ({what}): learned routing off ({self.reason})"
        if self.arm is not None and self.arm != "learned":
            return f"{self.arm} picked {self.pick.name} ({what}): {self.reason}"
        slack = f", slack {self.pick_slack:.2f}" if self.pick_slack is not None else ""
        i = self._pick_index()
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

    def to_json(self) -> dict[str, Any]:
        r = self.req
        out: dict[str, Any] = {"version": self.version, "state": self.state}
        if self.fallback is not None:
            out["fallback"] = self.fallback
            out["reason"] = self.reason
        if self.arm is not None:
            out["arm"] = self.arm
        out.update(propensity=_r(self.propensity), explored=self.explored, epsilon=self.epsilon)
        if self.pick is not None:
            pr = self.pick_pred
            out["pick"] = {"node": self.pick.name,
                           "ttft_s": _r(pr.ttft_s) if pr else None, "tpot_s": _r(pr.tpot_s, 7) if pr else None,
                           "e2e_s": _r(pr.e2e_s(r.output_tokens)) if pr else None, "slack": _r(self.pick_slack, 4)}
            i = self._pick_index() if self.others is not None or self.reserved is not None else None
            if i is not None and self.others is not None and i < len(self.others):
                out["pick"]["others_s"] = _r(self.others[i])
            if i is not None and self.reserved is not None and i < len(self.reserved):
                out["pick"]["reserved"] = _r(self.reserved[i], 4)
        out["why"] = self.why()
        out["req"] = {"prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "stream": r.stream,
                      "priority": r.priority, "deadline_s": _r(r.deadline_s, 3)}
        nodes = self.nodes or ([self.pick] if self.pick is not None else [])
        preds: list[tuple[float, float] | None] = list(self.preds) if self.preds else [
            (self.pick_pred.ttft_s, self.pick_pred.tpot_s) if self.pick_pred is not None else None for _ in nodes]
        probs: list[float | None] = list(self.probs) if self.probs else [None] * len(nodes)
        terms = _terms_of(self, len(nodes)) if self.nodes else {}
        if len(nodes) > CTX_NODES:   # keep the likeliest (the pick always)
            idx = sorted(range(len(nodes)), key=lambda i: -(probs[i] or 0.0))[:CTX_NODES]
            nodes, preds, probs = [nodes[i] for i in idx], [preds[i] for i in idx], [probs[i] for i in idx]
            terms = {k: [col[i] for i in idx] for k, col in terms.items()}
        out["ctx"] = _ctx(nodes, preds, probs)
        out["ctx"].update(terms)
        if self.interference > 0:
            out["interference"] = {"weight": self.interference, "charged": self.others is not None}
        if self.reserve_cut is not None:
            out["reserve"] = {"cut": self.reserve_cut, "rule": self.reserve_rule}
        out["ctx_total"] = len(self.nodes) or len(nodes)
        gpu = {n.name: v for n in nodes for k, v in n.labels if k in ("gpu", "gpu_type")}
        if gpu:
            out["gpu"] = gpu
        return out


class RefPredictedLatency(PredictedLatency):
    """:class:`PredictedLatency` with the earlier ``score_all``."""

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
        inf = math.inf
        for a, b in preds:
            if not (0 < a < inf and 0 < b < inf):
                raise PredictionFault(f"predictor returned TTFT {a!r}, TPOT {b!r} (must be finite, > 0)")
        e2e_budget = req.deadline_s if req.deadline_s is not None and req.deadline_s > 0 else self.p.e2e_slo_s
        ttft_budget = self.p.ttft_slo_s if req.stream else None
        rest = max(0, req.output_tokens - 1)
        slack: list[float] = []
        scores: list[float] = []
        beta = self.p.interference
        cap_o = self.p.interference_max_output
        charged = beta > 0 and (cap_o is None or req.output_tokens <= cap_o)
        others = self._others(req, nodes, preds, model) if charged else None
        cut: int | None = None
        reserved = None
        if self.p.reserve > 0:
            if self._pinned_cut is not None:   # a replay of a logged decision (pin_cut)
                cut = self._pinned_cut
            else:
                cut = self.reserve_cut()
                if self._lengths is not None:   # seen after the cut is read: a request is not its own reference
                    self._lengths.add(max(0, req.output_tokens))
            if req.output_tokens < cut:
                reserved = self._reserved(req, nodes, preds)
        bp = self.p.prefill_interference
        # The SLO-miss charge (issue 22 item 4, after cbae0a6): mirrored as the product has it.
        mw = self.p.miss_weight
        miss_e2e = miss_ttft = math.inf
        if mw > 0:
            miss_e2e = e2e_budget if req.deadline_s is not None and req.deadline_s > 0 else \
                (self.p.miss_e2e_s or self.p.e2e_slo_s)
            if req.stream:
                miss_ttft = self.p.miss_ttft_s or self.p.ttft_slo_s
        # min() and max() of two written out: the same floats (every term is finite here), no calls.
        for i, (a, b) in enumerate(preds):
            own = a + b * rest
            missed = mw > 0 and (own > miss_e2e or a > miss_ttft)
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
            if missed:
                s -= mw
            slack.append(s)
            x = 0.5 + 0.5 * s
            scores.append((x if x < 1.0 else 1.0) if x > 0.0 else 0.0)
        self.last = Scored(list(nodes), preds, slack, scores, others, reserved, cut)
        return scores


class RefSoftmaxBandit(SoftmaxBandit):
    """:class:`SoftmaxBandit` with the earlier ``rank_for`` (a ``rank_for`` of its own: the router
    then ranks it from (node, total) pairs, as it did)."""

    def rank_for(self, req: RouteRequest | None, scored: list[tuple[NodeView, float]],
                 rng: random.Random) -> list[str]:
        if not scored:
            self.last = None
            return []
        eps = self.epsilon_for(req)
        totals = [s for _, s in scored]
        probs, best, ex, ties, k = self._probabilities(eps, totals)
        # The best nodes' places (where s >= best); one search when there is one best.
        greedy = [ties.index(True)] if k == 1 else [i for i, tie in enumerate(ties) if tie]
        explore = eps > 0 and rng.random() < eps
        if explore:
            x = rng.random() * sum(ex)
            i = len(ex) - 1
            for j, e in enumerate(ex):
                x -= e
                if x <= 0:
                    i = j
                    break
        else:
            i = greedy[math.trunc(rng.random() * len(greedy))] if len(greedy) > 1 else greedy[0]
        pick = scored[i][0].name
        # The rest by score, best first, equal scores in the order given (a stable sort on −score).
        neg = [-s for s in totals]
        order = sorted(range(len(totals)), key=neg.__getitem__)
        self.last = BanditChoice(pick, probs[i], explore and i not in greedy, eps, probs)
        return [pick, *[scored[j][0].name for j in order if j != i]]


class RefGuardedRouter(GuardedRouter):
    """The guarded router with ``_explain`` as it was (the pick's place by ``names.index``)."""

    def _explain(self, req: RouteRequest, d: Decision) -> LearnedInfo:
        lc = self.lifecycle
        # Positional (req, version, state, pick): a class call with keywords builds a dict of them.
        info = LearnedInfo(req, lc.version, lc.state, None)
        sc = getattr(self._explainer, "last", None)
        choice = getattr(self.picker, "last", None)
        if sc is None or d.pick is None:
            return info
        info.nodes, info.preds = sc.nodes, sc.preds
        names = [n.name for n in sc.nodes]
        i = names.index(d.pick)
        info.pick = sc.nodes[i]
        info.pick_pred = Prediction(*sc.preds[i])
        info.pick_slack = sc.slack[i]
        # The scorer's per-candidate terms, for the audit (explain.py bounds them to CTX_NODES).
        info.slack, info.others, info.reserved = sc.slack, sc.others_s, sc.reserved
        info.interference = self._beta
        if sc.reserve_cut is not None:
            info.reserve_cut, info.reserve_rule = sc.reserve_cut, getattr(self._explainer, "cut_rule", None)
        if choice is not None and choice.pick == d.pick and len(choice.probs) == len(names):
            info.probs = choice.probs
            info.propensity = choice.propensity
            info.explored = choice.explored
            info.epsilon = choice.epsilon
            if choice.explored:
                lc.explored_total += 1
                rows = d.score_rows   # the greedy choice is by the profile's total score
                info.best = max(names, key=lambda n: rows[n][-1] if n in rows else -1.0)
        return info
