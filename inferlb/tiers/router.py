"""The tier choice of a model alias, the outcome feedback, and what operators see. No I/O.

Contract:

* :meth:`TierRouter.choose` is called by ``request/evaluate`` for a request naming an alias
  (a model with ``tiers:``, config/tiers.py). It scores the request (tiers/classify.py) and walks
  the tiers cheapest first: a cheaper tier takes the request when its rule says so (the score is
  at most its ``max_score``; or, with ``learned.enabled`` and that tier's model ready, the learned
  P(success) is at least ``learned.min_success``, or the request is in its ``explore_share``),
  the request fits its context and output limits (``fits``), and its guard takes it
  (tiers/guard.py: not tripped, or a probe). Otherwise the next tier is tried; the last tier
  takes what is left. The :class:`TierChoice` says which tier, the
  score, every feature's value and contribution, and why in words; ``request/evaluate`` puts
  :meth:`TierChoice.to_json` in the audit record (``tags["tier"]`` and every routing decision).
* :meth:`TierRouter.observe` is a request-end step (app.py): a record with a tier choice feeds
  that tier's counters, its guard (errors: any status but ``ok``, except the client's own end
  ``client_closed`` and every ``rejected*`` status, which come before a tier served anything;
  SLO misses: ``ok`` but over the alias's ``slos:`` entry, else ``*``) and, when enabled, its
  learned model. A guard's trip or restore is logged (``inferlb.tiers``), counted, and kept in
  :attr:`TierRouter.transitions`.
* State is keyed by (alias, tier model) and survives a fleet reload; the config is read from the
  request's own fleet config at each choice, so a reload changes the tiers at once. A guard or a
  learned model takes the reloaded settings and keeps its counts.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferlb.config.tiers import TierPolicy
from inferlb.store.records import RequestRecord
from inferlb.tiers.classify import Score, features, score, weights_of
from inferlb.tiers.guard import TierGuard, Transition
from inferlb.tiers.learned import Example, TierModel, examples_from_rows
from inferlb.types import Clock
from inferlb.versions.assign import unit_hash

__all__ = ["TierChoice", "TierRouter", "TierStats"]

log = logging.getLogger("inferlb.tiers")

_MAX_TRANSITIONS = 100


@dataclass(frozen=True, slots=True)
class TierChoice:
    """Which tier of ``alias`` serves a request, and why."""

    alias: str
    model: str
    index: int
    score: Score
    why: str
    guard: str | None = None          # a cheaper tier passed over by its guard, in words
    probe: bool = False               # sent to a tripped tier as one of its guard's probes
    p_success: float | None = None    # the learned estimate that decided (the tier taken, or the last passed over)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alias": self.alias, "model": self.model, "index": self.index,
                               "score": self.score.value, "why": self.why,
                               "contributions": self.score.contributions, "features": self.score.features}
        if self.guard is not None:
            out["guard"] = self.guard
        if self.probe:
            out["probe"] = True
        if self.p_success is not None:
            out["p_success"] = round(self.p_success, 6)
        return out


@dataclass
class TierStats:
    """Counts of one tier since start: requests, errors, SLO misses, cost (currency units), probes."""

    requests: int = 0
    errors: int = 0
    slo_missed: int = 0
    cost: float = 0.0
    probes: int = 0
    chosen: int = 0


class TierRouter:
    """Every alias's tier state (see the module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.guards: dict[tuple[str, str], TierGuard] = {}
        self.models: dict[tuple[str, str], TierModel] = {}
        self.stats: dict[tuple[str, str], TierStats] = {}
        self.transitions: deque[dict[str, Any]] = deque(maxlen=_MAX_TRANSITIONS)
        self._slo: dict[str, tuple[float | None, float | None]] = {}   # alias -> (ttft_max_s, e2e_max_s)
        self._policy: dict[str, TierPolicy] = {}

    # -- state -------------------------------------------------------------------------------------

    def _guard(self, alias: str, model: str, policy: TierPolicy) -> TierGuard:
        g = self.guards.get((alias, model))
        if g is None:
            g = self.guards[(alias, model)] = TierGuard(policy.guard)
        elif g.cfg != policy.guard:
            g.cfg = policy.guard          # a reload: new settings, counts kept
        return g

    def _model(self, alias: str, model: str, policy: TierPolicy) -> TierModel:
        m = self.models.get((alias, model))
        if m is None:
            m = self.models[(alias, model)] = TierModel(policy.learned)
        elif m.cfg != policy.learned:
            m.cfg = policy.learned
        return m

    def _stats(self, alias: str, model: str) -> TierStats:
        s = self.stats.get((alias, model))
        if s is None:
            s = self.stats[(alias, model)] = TierStats()
        return s

    def _note(self, alias: str, model: str, t: Transition) -> None:
        what = "tripped" if t.tripped else "restored"
        log.warning("tier guard %s: alias %s tier %s: %s", what, alias, model, t.reason)
        self.transitions.append({"at": round(self.clock.time(), 6), "alias": alias, "tier": model, "event": what,
                                 "reason": t.reason, "requests": t.requests, "error_rate": round(t.error_rate, 6),
                                 "slo_miss_rate": round(t.slo_miss_rate, 6)})

    # -- the choice --------------------------------------------------------------------------------

    def choose(self, alias: str, policy: TierPolicy, body: Mapping[str, Any], *, prompt_tokens: int,
               max_tokens: int | None, request_id: str, text: str | None = None,
               fits: Callable[[str], bool] | None = None, slos: Sequence[Any] = ()) -> TierChoice:
        """The tier of ``alias`` a request goes to (module docstring). ``slos``: the fleet's
        ``slos:`` (the alias's entry, else ``*``, is what the feedback counts as a miss)."""
        self._policy[alias] = policy
        self._slo[alias] = _slo_of(alias, slos)
        now = self.clock.monotonic()
        sc = score(features(body, prompt_tokens=prompt_tokens, max_tokens=max_tokens, scales=policy.scales,
                            text=text), weights_of(policy.weights))
        probe_draw = unit_hash(b"tiers-probe", request_id)
        passed: list[str] = []
        guard_note: str | None = None
        learned_p: float | None = None   # the learned estimate that decided last (a tier taken or passed over)
        tiers = policy.models
        for j, tier in enumerate(tiers):
            if j == len(tiers) - 1:
                why = "; ".join(passed) if passed else "the only tier left"
                choice = TierChoice(alias, tier.model, j, sc, f"{tier.model}: {why}", guard=guard_note,
                                    p_success=learned_p)
                break
            lm = self._model(alias, tier.model, policy) if policy.learned.enabled else None
            if lm is not None and lm.ready:
                p_success = learned_p = lm.predict(sc.features)
                wants = p_success >= policy.learned.min_success
                rule = f"learned P(success) {p_success:.3f} {'>=' if wants else '<'} {policy.learned.min_success:g}"
                if not wants and unit_hash(b"tiers-explore", request_id) < policy.learned.explore_share:
                    wants, rule = True, rule + " (exploration)"
            else:
                assert tier.max_score is not None   # config/tiers.py: every tier but the last has one
                wants = sc.value <= tier.max_score
                rule = f"score {sc.value:.3f} {'<=' if wants else '>'} {tier.max_score:g}"
                top = sc.top()
                if not wants and top:
                    rule += f" (mostly {', '.join(top)})"
            if not wants:
                passed.append(f"{tier.model} passed over: {rule}")
                continue
            if fits is not None and not fits(tier.model):
                passed.append(f"{tier.model} passed over: the request does not fit its context or output limit")
                continue
            probe = False
            if policy.guard.enabled:
                g = self._guard(alias, tier.model, policy)
                t = g.update(now)
                if t is not None:
                    self._note(alias, tier.model, t)
                if not g.takes(probe_draw):
                    guard_note = f"{tier.model} guard tripped: {g.reason}"
                    passed.append(f"{tier.model} passed over: its guard is tripped ({g.reason})")
                    continue
                probe = g.tripped
            why = f"{tier.model}: {rule}" + (" (guard probe)" if probe else "")
            choice = TierChoice(alias, tier.model, j, sc, "; ".join([why, *passed]), guard=guard_note, probe=probe,
                                p_success=learned_p)
            break
        st = self._stats(alias, choice.model)
        st.chosen += 1
        st.probes += choice.probe
        return choice

    # -- the feedback ------------------------------------------------------------------------------

    def observe(self, rec: RequestRecord) -> None:
        """A request-end step: feed the chosen tier's counters, guard and learned model."""
        tier = rec.tags.get("tier") if isinstance(rec.tags, dict) else None
        if not isinstance(tier, dict) or rec.status.startswith("rejected") or rec.status == "client_closed":
            return
        alias, model = str(tier.get("alias")), str(tier.get("model"))
        error = rec.status != "ok"
        ttft_max, e2e_max = self._slo.get(alias, (None, None))
        missed = False
        if not error:
            e2e, ttft = rec.e2e_s, rec.ttft_s
            missed = (e2e_max is not None and e2e is not None and e2e > e2e_max) or (
                rec.stream and ttft_max is not None and ttft is not None and ttft > ttft_max)
        st = self._stats(alias, model)
        st.requests += 1
        st.errors += error
        st.slo_missed += missed
        st.cost += rec.cost_est or 0.0
        policy = self._policy.get(alias)
        if policy is None or int(tier.get("index", 0)) >= len(policy.models) - 1:
            return                     # the strongest tier has no guard: nowhere stronger to go
        if policy.guard.enabled:
            t = self._guard(alias, model, policy).observe(self.clock.monotonic(), error=error, slo_missed=missed)
            if t is not None:
                self._note(alias, model, t)
        if policy.learned.enabled and isinstance(tier.get("features"), dict):
            self._model(alias, model, policy).learn(Example(rec.request_id, model, dict(tier["features"]),
                                                            not error and not missed))

    def warm_start(self, models: Sequence[Any], slos: Sequence[Any], rows: Sequence[Mapping[str, Any]]) -> int:
        """Train the learned model of every cheaper tier of each alias with ``learned.enabled`` from
        stored audit rows (tiers/audit.py ``tier_rows``, oldest first), with the same split and
        labels as at run time; the number of outcomes used. Counts and guards are not touched: they
        describe this gateway's own traffic."""
        used = 0
        for m in models:
            policy: TierPolicy | None = getattr(m, "tiers", None)
            if policy is None or not policy.learned.enabled:
                continue
            self._policy[m.name] = policy
            ttft_max, e2e_max = self._slo[m.name] = _slo_of(m.name, slos)
            cheaper = {t.model for t in policy.models[:-1]}
            mine = [r for r in rows if ((r.get("tags") or {}).get("tier") or {}).get("alias") == m.name]
            for ex in examples_from_rows(mine, e2e_max_s=e2e_max, ttft_max_s=ttft_max):
                if ex.tier in cheaper:
                    self._model(m.name, ex.tier, policy).learn(ex)
                    used += 1
        return used

    # -- reading -----------------------------------------------------------------------------------

    def describe(self, models: Sequence[Any]) -> list[dict[str, Any]]:
        """Each alias of ``models`` (a fleet's models): its tiers with thresholds, counts, guard and
        learned state, and the recent guard transitions (JSON)."""
        now = self.clock.monotonic()
        out = []
        for m in models:
            policy: TierPolicy | None = getattr(m, "tiers", None)
            if policy is None:
                continue
            tiers = []
            for j, t in enumerate(policy.models):
                st = self.stats.get((m.name, t.model), TierStats())
                entry: dict[str, Any] = {
                    "model": t.model, "max_score": t.max_score, "chosen": st.chosen, "requests": st.requests,
                    "errors": st.errors, "slo_missed": st.slo_missed, "probes": st.probes, "cost": round(st.cost, 6),
                    "error_rate": round(st.errors / st.requests, 6) if st.requests else None,
                    "slo_attainment": round(1 - (st.errors + st.slo_missed) / st.requests, 6) if st.requests else None}
                if j < len(policy.models) - 1:
                    g = self.guards.get((m.name, t.model))
                    entry["guard"] = g.describe(now) if g is not None else {"tripped": False, "trips": 0}
                    lm = self.models.get((m.name, t.model))
                    if policy.learned.enabled:
                        entry["learned"] = lm.describe() if lm is not None else {"ready": False, "trained": 0}
                tiers.append(entry)
            out.append({"alias": m.name, "tiers": tiers, "weights": weights_of(policy.weights),
                        "guard": policy.guard.model_dump(), "learned": policy.learned.model_dump(),
                        "transitions": [t for t in self.transitions if t["alias"] == m.name][-20:]})
        return out


def _slo_of(alias: str, slos: Sequence[Any]) -> tuple[float | None, float | None]:
    exact = next((s for s in slos if s.model == alias), None)
    s = exact or next((s for s in slos if s.model == "*"), None)
    return (s.ttft_max_s, s.e2e_max_s) if s is not None else (None, None)
