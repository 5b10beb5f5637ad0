"""Prometheus metrics of the KV-event service (registered on /metrics when a fleet uses it).

::

  inferlb_kv_index_decisions_total{model, outcome}   routing decisions that used the index / fell back
  inferlb_kv_index_fallbacks_total{model, reason}    fallbacks to the gateway-side hash, by reason
                                                     (no tokenizer, no full block, no events, gap,
                                                     lagging, silent, disconnected, no prompt text)
  inferlb_kv_index_stale{node, reason}               1 while a node's stream is stale, for its reason
  inferlb_kv_index_blocks{node}                      blocks the index holds for the node
  inferlb_kv_events_total{node, type}                events applied (BlockStored, BlockRemoved, AllBlocksCleared)
  inferlb_kv_event_batches_total{node}               batches applied
  inferlb_kv_event_errors_total{node}                messages that did not decode (skipped)
  inferlb_kv_event_gaps_total{node, outcome}         sequence gaps: replayed / lost
  inferlb_kv_index_orphan_blocks_total{node}         stored blocks whose parent the index did not know
  inferlb_kv_index_evicted_blocks_total{node}        blocks dropped by the index's own bounds
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferlb.kvevents.service import KVEventsService

__all__ = ["KVEventsCollector"]

_REASONS = ("gap", "lagging", "silent", "disconnected")


class KVEventsCollector(Collector):
    def __init__(self, service: KVEventsService) -> None:
        self.s = service

    def collect(self) -> Iterable[Metric]:
        s = self.s
        d = CounterMetricFamily("inferlb_kv_index_decisions", "Routing decisions for models with kv_events, by "
                                "whether the KV-event index was used or they fell back to the hash",
                                labels=["model", "outcome"])
        for (m, o), n in sorted(s.decisions.items()):
            d.add_metric([m, o], float(n))
        yield d
        f = CounterMetricFamily("inferlb_kv_index_fallbacks", "Decisions that fell back to the gateway-side hash "
                                "affinity, by reason", labels=["model", "reason"])
        for (m, r), n in sorted(s.fallbacks.items()):
            f.add_metric([m, r], float(n))
        yield f
        st = GaugeMetricFamily("inferlb_kv_index_stale", "1 while a node's KV event stream is stale, by reason",
                               labels=["node", "reason"])
        b = GaugeMetricFamily("inferlb_kv_index_blocks", "Blocks the KV-event index holds for a node", labels=["node"])
        orph = CounterMetricFamily("inferlb_kv_index_orphan_blocks", "Stored blocks whose parent the index did "
                                   "not know (not indexed)", labels=["node"])
        ev = CounterMetricFamily("inferlb_kv_index_evicted_blocks", "Blocks dropped by the index's own memory "
                                 "bounds", labels=["node"])
        for node in sorted(s.nodes):
            why = s.stale(node)
            for r in _REASONS:
                st.add_metric([node, r], 1.0 if why == r else 0.0)
            b.add_metric([node], float(s.index.blocks(node)))
            nx = s.index.nodes.get(node)
            orph.add_metric([node], float(nx.orphans if nx is not None else 0))
            ev.add_metric([node], float(nx.evicted if nx is not None else 0))
        yield st
        yield b
        yield orph
        yield ev
        e = CounterMetricFamily("inferlb_kv_events", "KV events applied, by type", labels=["node", "type"])
        for (node, t), n in sorted(s.events.items()):
            e.add_metric([node, t], float(n))
        yield e
        for name, doc, src in (("inferlb_kv_event_batches", "KV event batches applied", s.batches),
                               ("inferlb_kv_event_errors", "KV event messages that did not decode", s.errors)):
            c = CounterMetricFamily(name, doc, labels=["node"])
            for node, n in sorted(src.items()):
                c.add_metric([node], float(n))
            yield c
        g = CounterMetricFamily("inferlb_kv_event_gaps", "KV event sequence gaps, by outcome (replayed / lost)",
                                labels=["node", "outcome"])
        for (node, o), n in sorted(s.gaps.items()):
            g.add_metric([node, o], float(n))
        yield g
