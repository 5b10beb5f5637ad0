"""Prometheus figures of the learned routing profile's predictor, read at scrape time.

* ``inferlb_routing_predictor_state{state}``: 1 for the lifecycle's current state
  (warming / active / drifted / faulted), 0 for the others; ``active`` is 1 exactly while the
  learned profile routes, the others mean ``token-aware`` decides (routing/lifecycle.py);
* ``inferlb_routing_predictor_mape{target}``: rolling prequential MAPE (ttft, tpot, both);
* ``inferlb_routing_predictor_version``, ``inferlb_routing_predictor_learned`` (answers the
  active predictor learned), ``inferlb_routing_predictor_pending`` (answers queued for training);
* counters ``inferlb_routing_predictor_fallback_decisions_total``,
  ``inferlb_routing_predictor_faults_total`` (unusable predictions), ``inferlb_routing_explored_total``
  (decisions where the bandit explored), ``inferlb_routing_predictor_transitions_total``;
* ``inferlb_routing_predictor_retrains_total{outcome}``: scheduled retrains (learned/loop.py) by
  outcome, ``installed`` or ``refused`` (why is in the ``routing:learned`` node event);
* with the reward bandit on (``routing.reward``, routing/reward.py):
  ``inferlb_routing_reward_pulls_total{arm}`` (decisions each arm made) and
  ``inferlb_routing_reward_mean_cost{arm}`` (its discounted mean realised cost, in the objective's unit)
  and ``inferlb_routing_reward_learned`` (outcomes the bandit learned; in a cluster the trainer's,
  learned/share_reward.py).

:class:`LengthCollector` (the output-length predictor, routing/length.py; with or without the
learned profile): ``inferlb_routing_output_length_learned`` (answers it learned; in a cluster the
trainer's, learned/share_length.py) and ``inferlb_routing_output_length_keys`` (histograms kept).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferlb.routing.length import LengthPredictor
from inferlb.routing.lifecycle import PredictorLifecycle

__all__ = ["LearnedCollector", "LengthCollector"]

_STATES = ("warming", "active", "drifted", "faulted")


class LearnedCollector(Collector):
    def __init__(self, lifecycle: PredictorLifecycle, router_of: Callable[[], object] | None = None) -> None:
        self.lc = lifecycle
        self.router_of = router_of   # the router in force (a reload replaces it): its reward bandit, if any

    def collect(self) -> Iterable[Metric]:
        lc = self.lc
        st = GaugeMetricFamily("inferlb_routing_predictor_state",
                               "1 for the latency predictor's current state (active: the learned profile routes)",
                               labels=["state"])
        for s in _STATES:
            st.add_metric([s], 1.0 if lc.state == s else 0.0)
        yield st
        mape = GaugeMetricFamily("inferlb_routing_predictor_mape",
                                 "Rolling prequential mean absolute percentage error of the latency predictor",
                                 labels=["target"])
        for k, v in lc.mape().items():
            if v is not None:
                mape.add_metric([k], v)
        yield mape
        yield GaugeMetricFamily("inferlb_routing_predictor_version", "Version of the active latency predictor",
                                value=float(lc.version))
        yield GaugeMetricFamily("inferlb_routing_predictor_learned",
                                "Answers the active latency predictor learned (in a cluster: the trainer's, "
                                "learned/share.py)", value=float(lc.learned))
        yield GaugeMetricFamily("inferlb_routing_predictor_pending", "Answers queued for the predictor's training",
                                value=float(len(lc.pending)))
        for name, doc, v in (
                ("inferlb_routing_predictor_fallback_decisions", "Decisions the fallback profile made",
                 lc.fallbacks_total),
                ("inferlb_routing_predictor_faults", "Decisions whose predictions were unusable (NaN, ≤ 0, error)",
                 lc.faults_total),
                ("inferlb_routing_explored", "Decisions where the bandit picker explored", lc.explored_total),
                ("inferlb_routing_predictor_transitions", "Predictor state changes", lc.transitions_total)):
            yield CounterMetricFamily(name, doc, value=float(v))
        rt = CounterMetricFamily("inferlb_routing_predictor_retrains",
                                 "Scheduled retrains of the latency predictor by outcome (installed / refused)",
                                 labels=["outcome"])
        for outcome, n in sorted(lc.retrains_total.items()):
            rt.add_metric([outcome], float(n))
        yield rt
        bandit = getattr(self.router_of(), "reward", None) if self.router_of is not None else None
        if bandit is not None:
            pulls = CounterMetricFamily("inferlb_routing_reward_pulls", "Decisions each reward-bandit arm made",
                                        labels=["arm"])
            cost = GaugeMetricFamily("inferlb_routing_reward_mean_cost",
                                     "Discounted mean realised cost of each reward-bandit arm (the objective's unit)",
                                     labels=["arm"])
            for i, arm in enumerate(bandit.arms):
                pulls.add_metric([arm.name], float(arm.pulls))
                cost.add_metric([arm.name], bandit.posterior(i)[0])
            yield pulls
            yield cost
            yield GaugeMetricFamily("inferlb_routing_reward_learned",
                                    "Outcomes the reward bandit learned (in a cluster: the trainer's, "
                                    "learned/share_reward.py)", value=float(bandit.learned()))


class LengthCollector(Collector):
    """The output-length predictor's figures (module docstring), read at scrape time."""

    def __init__(self, lengths: LengthPredictor) -> None:
        self.lp = lengths

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("inferlb_routing_output_length_learned",
                                "Answers the output-length predictor learned (in a cluster: the trainer's, "
                                "learned/share_length.py)", value=float(self.lp.learned))
        yield GaugeMetricFamily("inferlb_routing_output_length_keys",
                                "Histograms the output-length predictor keeps (model, endpoint, tenant, band)",
                                value=float(self.lp.kept()))
