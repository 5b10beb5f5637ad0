"""Prometheus families of model aliases with tiers, read at scrape time (no per-request work).

===================================  ===========  ===================================================
name                                 labels       value
===================================  ===========  ===================================================
``inferlb_tier_chosen_total``        alias, tier  requests the classifier sent to the tier
``inferlb_tier_requests_total``      alias, tier  finished requests counted for the tier
``inferlb_tier_errors_total``        alias, tier  of which failed (any status but ok; not the client's)
``inferlb_tier_slo_missed_total``    alias, tier  successful requests over the alias's SLO
``inferlb_tier_cost_total``          alias, tier  their cost (currency units, cost.py)
``inferlb_tier_guard_tripped``       alias, tier  1 while the tier's guard sends its traffic onward
``inferlb_tier_guard_trips_total``   alias, tier  guard trips since start
``inferlb_tier_learned_ready``       alias, tier  1 when the learned model decides for the tier
===================================  ===========  ===================================================

Label values are the fleet file's alias and tier model names, so they are bounded.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferlb.tiers.router import TierRouter

__all__ = ["TierCollector"]


class TierCollector(Collector):
    def __init__(self, tiers: TierRouter) -> None:
        self.tiers = tiers

    def collect(self) -> Iterable[Metric]:
        t = self.tiers
        labels = ["alias", "tier"]
        chosen = CounterMetricFamily("inferlb_tier_chosen", "Requests the classifier sent to the tier", labels=labels)
        requests = CounterMetricFamily("inferlb_tier_requests", "Finished requests of the tier", labels=labels)
        errors = CounterMetricFamily("inferlb_tier_errors", "Failed requests of the tier", labels=labels)
        missed = CounterMetricFamily("inferlb_tier_slo_missed", "Successful requests of the tier over the SLO",
                                     labels=labels)
        cost = CounterMetricFamily("inferlb_tier_cost", "Cost of the tier's requests (currency units)", labels=labels)
        for (alias, tier), s in list(t.stats.items()):
            chosen.add_metric([alias, tier], float(s.chosen))
            requests.add_metric([alias, tier], float(s.requests))
            errors.add_metric([alias, tier], float(s.errors))
            missed.add_metric([alias, tier], float(s.slo_missed))
            cost.add_metric([alias, tier], s.cost)
        tripped = GaugeMetricFamily("inferlb_tier_guard_tripped", "1 while the tier's guard sends its traffic onward",
                                    labels=labels)
        trips = CounterMetricFamily("inferlb_tier_guard_trips", "Guard trips of the tier", labels=labels)
        for (alias, tier), g in list(t.guards.items()):
            tripped.add_metric([alias, tier], 1.0 if g.tripped else 0.0)
            trips.add_metric([alias, tier], float(g.trips))
        ready = GaugeMetricFamily("inferlb_tier_learned_ready", "1 when the tier's learned model decides",
                                  labels=labels)
        for (alias, tier), m in list(t.models.items()):
            ready.add_metric([alias, tier], 1.0 if m.ready else 0.0)
        yield from (chosen, requests, errors, missed, cost, tripped, trips, ready)
