"""Prometheus metrics of the gateway (prometheus-client), on a registry of the app's own.

Contract:

* :class:`RequestMetrics` is fed one finished :class:`~inferlb.store.records.RequestRecord`
  at a time (``observe``), from the audit submit hook, the one place every request ends,
  rejections included, on the event loop. It never raises into the caller's path (the hook
  guards it) and does only dictionary look-ups and additions: no I/O, no locks. It is itself the
  collector of those families, read when ``/metrics`` is scraped.
* Counters and histograms (the ``inferlb_`` prefix is implied below):

  ============================================  ===========================================  ====================
  name                                          labels                                       observed for
  ============================================  ===========================================  ====================
  ``requests_total``                            model, node, status, priority, tenant        every request
  ``request_duration_seconds`` (histogram)      model, node, priority                        ok requests (e2e)
  ``time_to_first_token_seconds`` (histogram)   model, node, priority                        ok streamed requests
  ``time_per_output_token_seconds`` (hist.)     model, node                                  ok streamed, > 1 token
  ``prompt_tokens_total``                       model, node, tenant                          requests with usage
  ``completion_tokens_total``                   model, node, tenant                          requests with usage
  ``attempts_total``                            model, node, outcome                         every attempt
  ``retries_total``                             model, node                                  attempts after the 1st
  ``shed_requests_total``                       model, priority, tenant, reason              429/503 rejections
  ``request_cost_total``                        model, node, tenant                          the gateway's estimate
  ``engine_seconds`` (histogram)                engine                                       workflow execution
  ``routing_affinity_escapes_total``            model, kind (``prefix`` / ``session``)       load escapes (below)
  ============================================  ===========================================  ====================

* ``routing_affinity_escapes_total`` counts routing decisions (retries included) whose ``affinity``
  pick left the key's own node because that node was past the bounded-load rule; the decision's
  ``pick_detail.escape`` says the same in words (routing/affinity.py).
* Label values are bounded: ``model`` and ``node`` only from the fleet config (else ``other``),
  ``tenant`` only from ``observability.metrics.tenants`` or the first ``max_tenants`` well-formed
  values seen (else ``other``), ``priority``/``status``/``outcome``/``reason`` capped the same way;
  a missing value is ``none``. No request id or free text is ever a label.
* :class:`GatewayCollector` produces the gauges at scrape time from live state (no per-request
  work): per node in-flight requests and tokens, capacity, state (one series per state, 1 for the
  current one), ejections, price; the admission queue depth (per pool); the audit writer's backlog; readiness.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from inferlb.config.observability import MetricsConfig
from inferlb.fleet.state import Fleet
from inferlb.observability.history import NODE_STATES, node_states
from inferlb.store.records import RequestRecord

__all__ = [
    "E2E_BUCKETS",
    "ENGINE_BUCKETS",
    "TPOT_BUCKETS",
    "TTFT_BUCKETS",
    "GatewayCollector",
    "LabelGuard",
    "RequestMetrics",
    "ScrapeSources",
]

# LLM-fit buckets: an e2e request runs from tens of ms (embeddings) to minutes (long generations;
# the default total timeout is 600 s); TTFT up to the first-token timeout (60 s); TPOT around the
# 10-100 ms of decode steps. Engine time is the gateway's own work: tens of µs to ms.
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
               180.0, 300.0, 600.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0,
                60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                1.0, 2.5)
ENGINE_BUCKETS = (2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25)

NONE = "none"
OTHER = "other"
_SAFE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")   # no "@" or "/": e-mail addresses and paths stay out
_CACHE_MAX = 4096   # raw values remembered per guard; past it values are re-checked (still bounded)


class LabelGuard:
    """Maps raw values to a bounded set of label values (``allowed``, or the first ``cap`` seen)."""

    __slots__ = ("_admitted", "_allowed", "_cache", "_cap")

    def __init__(self, allowed: Iterable[str] | None = None, cap: int = 20) -> None:
        self._allowed = frozenset(allowed) if allowed is not None else None
        self._cap = cap
        self._admitted: set[str] = set()
        self._cache: dict[str, str] = {}

    def allow(self, values: Iterable[str]) -> None:
        """Add ``values`` to the allowed set (a fleet reload added models or nodes)."""
        if self._allowed is not None and not self._allowed.issuperset(values):
            self._allowed = self._allowed | frozenset(values)
            self._cache.clear()

    def __call__(self, value: str | None) -> str:
        if value is None:
            return NONE
        hit = self._cache.get(value)
        if hit is not None:
            return hit
        if self._allowed is not None:
            label = value if value in self._allowed else OTHER
        elif value in self._admitted:
            label = value
        elif len(self._admitted) < self._cap and value not in (NONE, OTHER) and _SAFE.fullmatch(value):
            self._admitted.add(value)
            label = value
        else:
            label = OTHER
        if len(self._cache) < _CACHE_MAX:
            self._cache[value] = label
        return label


def _shed(rec: RequestRecord) -> bool:
    """A load-shedding rejection: the gateway refused work it could not take (not bad input)."""
    return rec.status in ("rejected", "shed") and rec.http_status in (429, 503)


class _Counter:
    """A counter family as a plain dict (label values -> total): one dict update per increment."""

    __slots__ = ("doc", "labels", "name", "values")

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self.name, self.doc, self.labels = name, doc, list(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        self.values[key] = self.values.get(key, 0.0) + amount

    def family(self) -> Metric:
        fam = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for key, value in list(self.values.items()):   # list(): a C-level copy, safe against a concurrent inc
            fam.add_metric(list(key), value)
        return fam


class _Histogram:
    """A histogram family: per label values, the count of each bucket (non-cumulative) and the sum."""

    __slots__ = ("bounds", "doc", "labels", "name", "values")

    def __init__(self, name: str, doc: str, labels: Sequence[str], bounds: Sequence[float]) -> None:
        self.name, self.doc, self.labels, self.bounds = name, doc, list(labels), tuple(bounds)
        self.values: dict[tuple[str, ...], list[float]] = {}

    def observe(self, key: tuple[str, ...], x: float) -> None:
        h = self.values.get(key)
        if h is None:
            h = self.values[key] = [0.0] * (len(self.bounds) + 2)   # buckets..., +Inf, sum
        h[bisect.bisect_left(self.bounds, x)] += 1                   # le semantics: x <= bound
        h[-1] += x

    def family(self) -> Metric:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for key, h in list(self.values.items()):
            counts, cumulative = list(h), 0.0
            buckets = []
            for bound, n in zip((*(repr(float(b)) for b in self.bounds), "+Inf"), counts[:-1], strict=True):
                cumulative += n
                buckets.append((bound, cumulative))
            fam.add_metric(list(key), buckets, sum_value=counts[-1])
        return fam


class RequestMetrics(Collector):
    """Counters and histograms fed from finished request records (see the module docstring).

    prometheus-client's own ``Counter``/``Histogram`` take a lock and validate on every call (about
    4 µs each, a dozen per request); this runs on every request, so the values live in plain dicts
    mutated on the event loop and are turned into metric families only when scraped.
    """

    def __init__(self, registry: CollectorRegistry, *, models: Iterable[str], nodes: Iterable[str],
                 cfg: MetricsConfig | None = None) -> None:
        cfg = cfg or MetricsConfig()
        self.model = LabelGuard(models)
        self.node = LabelGuard(nodes)
        self.tenant = LabelGuard(cfg.tenants, cap=cfg.max_tenants)
        self.priority = LabelGuard(cap=cfg.max_priorities)
        self.status = LabelGuard(cap=32)
        self.outcome = LabelGuard(cap=16)
        self.reason = LabelGuard(cap=16)
        self.engine = LabelGuard(cap=4)
        self.requests = _Counter("inferlb_requests", "Client requests finished, by final status",
                                 ["model", "node", "status", "priority", "tenant"])
        self.e2e = _Histogram("inferlb_request_duration_seconds",
                              "End-to-end latency of successful requests (received to last byte)",
                              ["model", "node", "priority"], E2E_BUCKETS)
        self.ttft = _Histogram("inferlb_time_to_first_token_seconds",
                               "Time to the first streamed byte of successful streamed requests",
                               ["model", "node", "priority"], TTFT_BUCKETS)
        self.tpot = _Histogram("inferlb_time_per_output_token_seconds",
                               "Decode time per output token after the first (successful streamed requests)",
                               ["model", "node"], TPOT_BUCKETS)
        self.prompt_tokens = _Counter("inferlb_prompt_tokens", "Prompt tokens reported by the nodes",
                                      ["model", "node", "tenant"])
        self.completion_tokens = _Counter("inferlb_completion_tokens", "Completion tokens reported by the nodes",
                                          ["model", "node", "tenant"])
        self.attempts = _Counter("inferlb_attempts", "Attempts sent to nodes, by outcome", ["model", "node", "outcome"])
        self.retries = _Counter("inferlb_retries", "Attempts after a request's first (retries and fallbacks)",
                                ["model", "node"])
        self.shed = _Counter("inferlb_shed_requests", "Requests refused by admission control (429/503)",
                             ["model", "priority", "tenant", "reason"])
        self.cost = _Counter("inferlb_request_cost", "The gateway's per-request cost estimate (currency units); "
                             "the cost ledger (/reports/cost) is the reference", ["model", "node", "tenant"])
        self.engine_time = _Histogram("inferlb_engine_seconds",
                                      "Workflow engine time per request (process steps, not I/O waits)",
                                      ["engine"], ENGINE_BUCKETS)
        self.kind = LabelGuard(("prefix", "session"))
        self.escapes = _Counter("inferlb_routing_affinity_escapes",
                                "Routing decisions whose affinity pick left the key's own node because it was "
                                "past the bounded-load rule ((1 + epsilon) x its share of the mean)",
                                ["model", "kind"])
        self._families: tuple[_Counter | _Histogram, ...] = (
            self.requests, self.e2e, self.ttft, self.tpot, self.prompt_tokens, self.completion_tokens, self.attempts,
            self.retries, self.shed, self.cost, self.engine_time, self.escapes)
        registry.register(self)

    def collect(self) -> Iterable[Metric]:
        for fam in self._families:
            yield fam.family()

    def observe(self, rec: RequestRecord) -> None:
        """Count one finished request. Call exactly once per request, on the event loop."""
        model = self.model(rec.model_requested)
        node = self.node(rec.node)
        tenant = self.tenant(rec.tenant)
        priority = self.priority(rec.priority)
        self.requests.inc((model, node, self.status(rec.status), priority, tenant))
        if rec.status == "ok" and rec.last_byte_at is not None:
            self.e2e.observe((model, node, priority), max(0.0, rec.last_byte_at - rec.received_at))
            first = rec.first_byte_at
            if rec.stream and first is not None:
                self.ttft.observe((model, node, priority), max(0.0, first - rec.received_at))
                n = rec.completion_tokens or 0
                if n > 1:
                    self.tpot.observe((model, node), max(0.0, rec.last_byte_at - first) / (n - 1))
        if rec.prompt_tokens:
            self.prompt_tokens.inc((model, node, tenant), rec.prompt_tokens)
        if rec.completion_tokens:
            self.completion_tokens.inc((model, node, tenant), rec.completion_tokens)
        for a in rec.attempts:
            a_model, a_node = self.model(a.model), self.node(a.node)
            self.attempts.inc((a_model, a_node, self.outcome(a.outcome)))
            if a.number > 1:
                self.retries.inc((a_model, a_node))
        if _shed(rec):
            self.shed.inc((model, priority, tenant, self.reason(rec.error_class)))
        if rec.cost_est:
            self.cost.inc((model, node, tenant), rec.cost_est)
        for d in rec.decisions:   # one per routing decision (retries and fallbacks included)
            pd = d.get("pick_detail")
            if pd is not None and "escape" in pd:
                self.escapes.inc((self.model(d.get("model")), self.kind(pd.get("affinity"))))

    def observe_engine(self, mode: str, seconds: float) -> None:
        self.engine_time.observe((self.engine(mode),), seconds)


@dataclass
class ScrapeSources:
    """Where the collector reads live state; each callable is cheap and may return None (unknown)."""

    fleet: Callable[[], Fleet | None]
    backlog: Callable[[], Mapping[str, Any] | None] = lambda: None
    # The admission queue's depth: a number, or a mapping of pool -> number. None: no queue yet.
    queue_depth: Callable[[], int | Mapping[str, int] | None] = lambda: None
    ready: Callable[[], bool] = lambda: True
    prices: Mapping[str, float] | None = None


_BACKLOG_GAUGES = (
    ("pending", "inferlb_audit_pending_records", "Audit records queued in memory, not yet written"),
    ("spooled", "inferlb_audit_spooled_records", "Audit records in the local journal (database away)"),
    ("spool_bytes", "inferlb_audit_spool_bytes", "Size of the local audit journal in bytes"),
    ("quarantined", "inferlb_audit_quarantined_records", "Audit records the database rejected (kept aside)"),
)
_BACKLOG_COUNTERS = (
    ("records_written", "inferlb_audit_records_written", "Audit records committed to the database"),
    ("records_dropped", "inferlb_audit_records_dropped", "Audit records that could not be kept"),
    ("failed_flushes", "inferlb_audit_failed_flushes", "Audit writer flushes that failed"),
    ("records_unrecorded", "inferlb_audit_records_unrecorded",
     "Requests served without an audit record (audit.on_full=open, past the high-water mark)"),
)


class GatewayCollector(Collector):
    """Gauges read at scrape time (see the module docstring)."""

    def __init__(self, sources: ScrapeSources) -> None:
        self.sources = sources

    def collect(self) -> Iterable[Metric]:
        s = self.sources
        yield from self._nodes(s.fleet())
        depth = s.queue_depth()
        q = GaugeMetricFamily("inferlb_queue_depth", "Requests waiting in the admission queue, per pool",
                              labels=["pool"])
        if isinstance(depth, Mapping):
            for pool, n in sorted(depth.items()):
                q.add_metric([str(pool)], float(n))
        else:
            q.add_metric(["all"], float(depth or 0))
        yield q
        backlog = s.backlog()
        if backlog is not None:
            for key, name, doc in _BACKLOG_GAUGES:
                yield GaugeMetricFamily(name, doc, value=float(backlog.get(key) or 0))
            for key, name, doc in _BACKLOG_COUNTERS:
                yield CounterMetricFamily(name, doc, value=float(backlog.get(key) or 0))
            yield GaugeMetricFamily("inferlb_audit_writer_healthy", "1 when the audit database takes writes",
                                    value=1.0 if backlog.get("healthy") else 0.0)
        yield GaugeMetricFamily("inferlb_ready", "1 when the gateway takes traffic", value=1.0 if s.ready() else 0.0)

    def _nodes(self, fleet: Fleet | None) -> Iterable[Metric]:
        inflight = GaugeMetricFamily("inferlb_node_inflight_requests", "Requests in flight on the node",
                                     labels=["node"])
        tokens = GaugeMetricFamily("inferlb_node_inflight_tokens",
                                   "Tokens (prompt estimate + output budget) in flight on the node", labels=["node"])
        capacity = GaugeMetricFamily("inferlb_node_capacity_tokens", "The node's configured token capacity",
                                     labels=["node"])
        state = GaugeMetricFamily("inferlb_node_state", "1 for the node's current state, 0 for the others",
                                  labels=["node", "state"])
        ejections = CounterMetricFamily("inferlb_node_ejections", "Times the node was ejected for failures",
                                        labels=["node"])
        price = GaugeMetricFamily("inferlb_node_price_per_hour", "The node's price per hour (cost ledger)",
                                  labels=["node"])
        prices = self.sources.prices or {}
        if fleet is not None:
            for view, current in node_states(fleet):
                n = view.name
                inflight.add_metric([n], float(view.inflight_requests))
                tokens.add_metric([n], float(view.inflight_tokens))
                capacity.add_metric([n], float(view.capacity_tokens))
                for st in NODE_STATES:
                    state.add_metric([n, st], 1.0 if st == current else 0.0)
                live = fleet.nodes.get(n)
                ejections.add_metric([n], float(live.ejections if live is not None else 0))
                price.add_metric([n], float(prices.get(n, 0.0)))
        yield from (inflight, tokens, capacity, state, ejections, price)
