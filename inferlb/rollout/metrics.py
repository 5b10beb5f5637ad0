"""Prometheus families of model versions and rollouts, read at scrape time (no per-request work).

==========================================  ========================  ==========================================
name                                        labels                    value
==========================================  ========================  ==========================================
``inferlb_model_version_weight``            model, version            the weight in force (file or rollout)
``inferlb_model_version_share``             model, version            its share of the model's traffic (0..1)
``inferlb_version_attempts_total``          model, version            attempts counted by the version window
``inferlb_version_failed_attempts_total``   model, version            of which failed (5xx, timeout, reset)
``inferlb_version_slo_missed_total``        model, version            successful requests over the SLO
``inferlb_rollout_percent``                 model, rollout, version   the new version's step (running rollouts)
``inferlb_rollouts_active``                 —                         running rollouts
``inferlb_rollout_decisions_total``         model, action             start, promote, hold, rollback, complete,
                                                                      abort
==========================================  ========================  ==========================================

Label values come from the fleet config (models, versions) and the gateway's own rollout ids,
so they are bounded.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferlb.rollout.manager import RolloutManager

__all__ = ["RolloutCollector"]


class RolloutCollector(Collector):
    def __init__(self, manager: RolloutManager) -> None:
        self.manager = manager

    def collect(self) -> Iterable[Metric]:
        m = self.manager
        weight = GaugeMetricFamily("inferlb_model_version_weight", "The weight of the model version in force",
                                   labels=["model", "version"])
        share = GaugeMetricFamily("inferlb_model_version_share", "The version's share of the model's traffic",
                                  labels=["model", "version"])
        for model in m.versions.models():
            mv = m.versions.get(model)
            if mv is None:
                continue
            shares = mv.shares()
            for v in mv.versions:
                weight.add_metric([model, v.name], v.weight)
                share.add_metric([model, v.name], shares[v.name])
        attempts = CounterMetricFamily("inferlb_version_attempts", "Attempts counted for the model version",
                                       labels=["model", "version"])
        failed = CounterMetricFamily("inferlb_version_failed_attempts",
                                     "Failed attempts of the model version (5xx, timeouts, resets, broken streams)",
                                     labels=["model", "version"])
        missed = CounterMetricFamily("inferlb_version_slo_missed", "Successful requests of the version over the SLO",
                                     labels=["model", "version"])
        for (model, version), t in list(m.window.totals.items()):
            attempts.add_metric([model, version], float(t[0]))
            failed.add_metric([model, version], float(t[1]))
            missed.add_metric([model, version], float(t[3]))
        percent = GaugeMetricFamily("inferlb_rollout_percent", "The new version's step of a running rollout (%)",
                                    labels=["model", "rollout", "version"])
        active = 0
        for r in list(m.rollouts.values()):
            if r.running:
                active += 1
                percent.add_metric([r.model, r.id, r.to_version], r.percent)
        decisions = CounterMetricFamily("inferlb_rollout_decisions", "Rollout decisions and actions",
                                        labels=["model", "action"])
        for (model, action), n in list(m.decisions.items()):
            decisions.add_metric([model, action], float(n))
        yield from (weight, share, attempts, failed, missed, percent,
                    GaugeMetricFamily("inferlb_rollouts_active", "Running rollouts", value=float(active)), decisions)
