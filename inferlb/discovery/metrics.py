"""Prometheus metrics of the discovery sources, read at scrape time.

* ``inferlb_discovery_nodes{source,state}``: discovered nodes, ``state`` = ``serving`` | ``draining``;
* ``inferlb_discovery_synced{source}``: 1 once a list succeeded and while the last call answered;
* ``inferlb_discovery_errors_total{source}``: API errors (the last known nodes were kept);
* ``inferlb_discovery_relists_total{source}``: lists after a watch answered 410 Gone;
* ``inferlb_discovery_events_total{source}``: watch events received.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferlb.discovery.source import KubernetesDiscovery

__all__ = ["DiscoveryCollector"]


class DiscoveryCollector(Collector):
    def __init__(self, sources: Sequence[KubernetesDiscovery]) -> None:
        self.sources = list(sources)

    def collect(self) -> Iterable[Metric]:
        nodes = GaugeMetricFamily("inferlb_discovery_nodes", "Discovered nodes by state", labels=["source", "state"])
        synced = GaugeMetricFamily("inferlb_discovery_synced",
                                   "1 when the source has listed and its last API call answered", labels=["source"])
        errors = CounterMetricFamily("inferlb_discovery_errors", "API errors (last known nodes kept)",
                                     labels=["source"])
        relists = CounterMetricFamily("inferlb_discovery_relists", "Lists after a watch answered 410 Gone",
                                      labels=["source"])
        events = CounterMetricFamily("inferlb_discovery_events", "Watch events received", labels=["source"])
        for s in self.sources:
            draining = sum(1 for r in s.rows.values() if r.drained)
            nodes.add_metric([s.label, "serving"], float(len(s.rows) - draining))
            nodes.add_metric([s.label, "draining"], float(draining))
            synced.add_metric([s.label], 1.0 if s.synced and s.last_error is None else 0.0)
            errors.add_metric([s.label], float(s.errors))
            relists.add_metric([s.label], float(s.relists))
            events.add_metric([s.label], float(s.events))
        yield from (nodes, synced, errors, relists, events)
