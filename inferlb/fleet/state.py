"""Nodes and their live state as the gateway sees it.

The gateway (one event loop) mutates :class:`NodeState` counters on dispatch start/end and on
outcomes; routing reads immutable :class:`~inferlb.routing.types.NodeView` snapshots from
:meth:`Fleet.views`, kept up to date incrementally (a node's view is rebuilt when its state
changes, not per request); the node-health process (``processes/node_health.bpmn``, through
:mod:`inferlb.health.isolation`) moves nodes between states on its sweeps. Time comes from
the injected clock.

Each node has one explicit state (:data:`~inferlb.node_types.NODE_STATES`); every change
goes through :meth:`Fleet.transition`, which queues a :class:`~inferlb.node_types.NodeEvent`
(node, from, to, reason, evidence, time) for the audit trail (:meth:`Fleet.take_events`).

Request-path rules (inline, like Envoy's consecutive-5xx detection):

* ``consecutive_failures`` (5) gateway-side failures in a row eject a node for
  ``base × ejections in a row`` (30 s, 60 s, …, capped at 300 s), unless that would pass
  ``max_ejection_percent`` of the nodes serving one of its models (at least one may always go).
* A half-open node (its ejection ended at a sweep) takes ``half_open_requests`` concurrent trial
  requests: a success closes the circuit (healthy, in slow start), a failure re-ejects it at once.
* A 429 cools the node down for its Retry-After (extended, never shortened); routing skips it until
  then, to the microsecond; the sweep records the end.

What routing sees (:meth:`Fleet.views`):

* only nodes whose state takes traffic are ``healthy``; below ``panic_threshold_percent`` of a
  model's nodes available, nodes that are out for *health* (ejected by outlier detection, down by
  probes) are offered again for that model (Envoy's panic mode: spread the load rather than fail
  everything). Loading, draining, cooling and hardware-ejected nodes never are;
* slow start scales a node's ``capacity_tokens``, ``max_concurrency`` and ``weight`` by Envoy's
  factor, so the token-aware scorer and the capacity filter send it a growing share;
* ``labels`` are the fleet file's node labels (the ``node-selector`` filter reads them);
  ``rtt_ms`` is the EWMA of the node's readiness-probe time (the ``rtt`` scorer reads it);
* ``waiting`` / ``kv_usage`` come from the last fresh metrics sample; stale samples are unknown,
  and a node whose samples are all stale is shown saturated (``kv_usage`` 1, ``waiting`` at its
  concurrency limit). ``lora_running`` / ``lora_waiting`` / ``max_lora`` come from the same fresh
  sample (vLLM's ``vllm:lora_requests_info``; empty / None otherwise);
* ``lora_failed``: the adapters that failed to load on the node (:meth:`Fleet.adapter_failed`)
  until their cool-down ends, to the microsecond; the node stays routable for everything else.
"""

from __future__ import annotations

import collections
import heapq
import math
import random
from collections.abc import Callable
from typing import Any

from inferlb.config.health import HealthConfig
from inferlb.config.netpolicy import redact_url
from inferlb.config.settings import FleetConfig, ModelConfig
from inferlb.cost import Share, cost_of, node_prices
from inferlb.fleet.node import NodeState
from inferlb.fleet.rules import ejection_seconds, slow_start_factor
from inferlb.node_types import NodeEvent
from inferlb.routing.types import NodeList, NodeView
from inferlb.types import Clock

__all__ = ["ROUTABLE", "Fleet"]

ROUTABLE = frozenset({"healthy", "half_open", "cooldown"})   # cooldown: only once cooldown_until passed
_PANIC_ELIGIBLE = frozenset({"ejected", "down"})
_MAX_TTFB_SAMPLES = 1000
_MAX_EVENTS = 10_000


class Fleet:
    """The configured fleet plus the gateway's live view of each node."""

    def __init__(self, cfg: FleetConfig, clock: Clock, health: HealthConfig | None = None,
                 rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.health: HealthConfig = health or getattr(cfg, "health", None) or HealthConfig()
        self.rng = rng or random.Random(0)
        now, wall = clock.monotonic(), clock.time()
        prices = node_prices(cfg.nodes, cfg.observability.finops)
        self.nodes: dict[str, NodeState] = {n.name: NodeState(n, since=now, since_wall=wall,
                                                              price_per_hour=prices[n.name], share=Share(wall))
                                            for n in cfg.nodes}
        self.models: dict[str, ModelConfig] = {}
        self._model_sets: dict[str, frozenset[str]] = {}
        self.serving: dict[str, list[str]] = {}
        self._labels: dict[str, tuple[tuple[str, str], ...]] = {}
        self._events: collections.deque[NodeEvent] = collections.deque(maxlen=_MAX_EVENTS)
        self.events_dropped = 0
        self.last_outlier_sweep = now
        # The routing snapshot, kept up to date incrementally (views()).
        self._names: list[str] = []
        self._pos: dict[str, int] = {}
        self._views: list[NodeView] = []
        self._model_pos: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
        self._by_model: dict[str, list[NodeView]] = {}
        self._dirty: set[str] = set()
        self._counts: set[str] = set()                  # only COUNT_FIELDS changed: patched (_patch)
        self._rebuild_all = True
        self._out: NodeList | None = None               # the snapshot handed out last; None once it is stale
        self._own: set[str] = set()                     # models whose _by_model list no hand-out holds
        # Since the last hand-out, per model copied on write: the hand-out's list and the positions
        # written since (the next hand-out's NodeList.delta); empty after a full rebuild.
        self._delta: dict[str, tuple[list[NodeView], list[int]]] = {}
        self._panic: set[str] = set()
        self._expiry: list[tuple[float, str]] = []      # heap: when a view changes with time alone
        self._expires: dict[str, float] = {}
        self._ramping: set[str] = set()                 # in slow start: rebuilt on every views()
        # Told of every state change (node, previous state) after it is made: the cluster shares
        # ejections and cool-downs through it (cluster/health.py); None on one replica.
        self.on_transition: Callable[[NodeState, str | None], None] | None = None
        for st in self.nodes.values():
            object.__setattr__(st, "_owner", self)
        self.reindex()

    def reindex(self) -> None:
        """Recompute the indexes over :attr:`nodes` and :attr:`cfg` after nodes were added, retired
        or changed (live/fleet_admin.py); a retired node serves no model (panic mode, retries)."""
        self.models = {m.name: m for m in self.cfg.models}
        self._model_sets = {name: frozenset(st.cfg.models) for name, st in self.nodes.items()}
        self._labels = {name: tuple(sorted(st.cfg.labels.items())) for name, st in self.nodes.items()}
        self.serving = {m: [n for n, st in self.nodes.items() if m in self._model_sets[n] and not st.retired]
                        for m in self.models}
        self._names = list(self.nodes)
        self._pos = {name: i for i, name in enumerate(self._names)}
        self._ramping.intersection_update(self.nodes)
        self._dirty.intersection_update(self.nodes)
        self._counts.intersection_update(self.nodes)
        self._rebuild_all = True

    # ------------------------------------------------------------------ routing snapshots

    def available(self, st: NodeState, now: float) -> bool:
        if now < st.cooldown_until:
            return False
        return st.state in ROUTABLE

    def panic_models(self, now: float) -> set[str]:
        """Models below the panic threshold: too few of their nodes are available."""
        pct = self.health.outlier.panic_threshold_percent
        out = set()
        for model, names in self.serving.items():
            if not names:
                continue
            # A node cooling down after a 429 is alive and busy: it counts as available.
            up = sum(1 for n in names if self.nodes[n].state in ROUTABLE)
            if up * 100.0 < pct * len(names):
                out.add(model)
        return out

    def views(self) -> NodeList:
        """The routing snapshot: one :class:`NodeView` per node (configured order), and by model.

        Kept incrementally: a node's view is rebuilt only when a field it reads was set (every
        :class:`NodeState` attribute set marks it, but those of
        :data:`~inferlb.fleet.node.VIEW_BLIND`; :meth:`touch` for in-place changes), when a timer
        of its own runs out (a 429 cooldown, its metrics going stale, an adapter's cool-down), or
        on every call while it ramps up in slow start; a change of in-flight counts or speed
        estimates alone patches those fields of the view (:meth:`_patch`); a state change anywhere
        rebuilds all (panic mode reads every node's state). A rebuilt view equal to the one before
        is not replaced, so unchanged nodes keep their view objects (routing/memo.py finds them by
        identity).

        Shared, never changed: the list, its ``by_model`` dict and lists are never written once
        returned (copy on write), and while nothing changed the same snapshot is returned again.
        A caller must not change them either (copy first).
        """
        now = self.clock.monotonic()
        if self._rebuild_all:
            self._rebuild_everything(now)
        else:
            dirty = self._dirty
            heap = self._expiry
            while heap and heap[0][0] <= now:
                at, name = heapq.heappop(heap)
                if self._expires.get(name) == at:
                    del self._expires[name]
                    dirty.add(name)
            if self._ramping:
                dirty.update(self._ramping)
            counts = self._counts
            if counts:
                for name in counts:
                    if name not in dirty:
                        self._patch(name)
                counts.clear()
            if dirty:
                for name in list(dirty):
                    self._rebuild(name, now)
                dirty.clear()   # a rebuild may set a field (slow start over): that node is current
        out = self._out
        if out is None:
            # Exact (every view of a model's list serves it) unless panic mode narrowed some views' models;
            # fixed: neither the list nor a model's list is written once handed out (_put copies first).
            # delta: for each model list copied since the last hand-out, that hand-out's list and
            # the positions written (the filter memo compares only those: routing/memo.py).
            delta = {m: (old, tuple(pos)) for m, (old, pos) in self._delta.items()} if self._delta else None
            out = self._out = NodeList(self._views, dict(self._by_model), exact=not self._panic, fixed=True,
                                       delta=delta)
            self._own = set()   # every model list is now the hand-out's too: copied before a write
            self._delta = {}
        return out

    def _rebuild_everything(self, now: float) -> None:
        self._rebuild_all = False
        self._expiry, self._expires = [], {}
        self._panic = self.panic_models(now) if self.health.outlier.panic_threshold_percent > 0 else set()
        self._views = [self._view(name, st, now) for name, st in self.nodes.items()]
        self._by_model = {m: [] for m in self.serving}
        self._model_pos = collections.defaultdict(list)
        for i, name in enumerate(self._names):
            for m in self._model_sets[name]:
                lst = self._by_model.setdefault(m, [])
                self._model_pos[name].append((m, len(lst)))
                lst.append(self._views[i])
        self._dirty.clear()
        self._counts.clear()
        self._out, self._own, self._delta = None, set(self._by_model), {}

    def _rebuild(self, name: str, now: float) -> None:
        v = self._view(name, self.nodes[name], now)
        if v != self._views[self._pos[name]]:
            self._put(name, v)

    def _patch(self, name: str) -> None:
        """``name``'s view with the node's :data:`~inferlb.fleet.node.COUNT_FIELDS` (in-flight
        counts, speed estimates), all else as it was: valid because every other input of the view
        marks the node dirty (rebuilt instead) when it changes."""
        st = self.nodes[name]
        o = self._views[self._pos[name]]
        if o.inflight_requests == st.inflight_requests and o.inflight_tokens == st.inflight_tokens \
                and o.tokens_per_s == st.tokens_per_s and o.ttft_s == st.ttft_ewma:
            return
        self._put(name, NodeView(
            name=o.name, models=o.models, capacity_tokens=o.capacity_tokens, max_concurrency=o.max_concurrency,
            weight=o.weight, inflight_requests=st.inflight_requests, inflight_tokens=st.inflight_tokens,
            waiting=o.waiting, kv_usage=o.kv_usage, healthy=o.healthy, unhealthy_reason=o.unhealthy_reason,
            labels=o.labels, tokens_per_s=st.tokens_per_s, ttft_s=st.ttft_ewma, rtt_ms=o.rtt_ms,
            lora_running=o.lora_running, lora_waiting=o.lora_waiting, max_lora=o.max_lora,
            lora_failed=o.lora_failed))

    def _put(self, name: str, v: NodeView) -> None:
        """Set ``name``'s view in the working lists, copying a model's list first when a hand-out
        holds it (the top list never is: a NodeList is a copy of it)."""
        self._views[self._pos[name]] = v
        by_model, own, delta = self._by_model, self._own, self._delta
        for m, i in self._model_pos[name]:
            lst = by_model[m]
            if m not in own:
                delta[m] = (lst, [])   # the hand-out's list, which this copy will differ from
                lst = by_model[m] = list(lst)
                own.add(m)
            lst[i] = v
            d = delta.get(m)
            if d is not None:
                d[1].append(i)
        self._out = None

    def _view(self, name: str, st: NodeState, now: float) -> NodeView:
        """Build ``name``'s view at ``now`` and note when time alone would change it."""
        panic = self._panic
        models = self._model_sets[name]
        reason = st.unhealthy_reason(now)
        healthy = reason is None
        if not healthy and panic and st.state in _PANIC_ELIGIBLE and not st.hardware_fault \
                and now >= st.cooldown_until and models & panic:
            models, healthy, reason = models & panic, True, None
        cap, conc, weight = st.cfg.capacity_tokens, st.cfg.max_concurrency, st.cfg.weight
        ramping = False
        if st.state == "half_open":
            conc = max(1, self.health.circuit.half_open_requests)
        elif st.slow_start_at is not None:
            f = slow_start_factor(now - st.slow_start_at, self.health.slow_start)
            if f >= 1.0:
                st.slow_start_at = None
            else:
                ramping = True
                cap, conc, weight = max(1, round(cap * f)), max(1, math.ceil(conc * f)), weight * f
        if ramping:
            self._ramping.add(name)
        else:
            self._ramping.discard(name)
        stale = self.health.stale_after_s
        waiting: int | None = None
        kv: float | None = None
        lora: dict[str, Any] | None = None
        until = math.inf
        if now < st.cooldown_until:
            until = st.cooldown_until
        failed: frozenset[str] = frozenset()
        if st.lora_failed:
            live = {a: t for a, t in st.lora_failed.items() if t > now}
            if len(live) < len(st.lora_failed):
                object.__setattr__(st, "lora_failed", live)   # the spent ones: no rebuild needed for them
            if live:
                failed = frozenset(live)
                until = min(until, min(live.values()))
        if st.load is not None and st.load.age(now) <= stale:
            waiting, kv = st.load.values.get("waiting"), st.load.values.get("kv_usage")
            lora = st.load.values.get("lora")
            until = min(until, math.nextafter(st.load.taken_at + stale, math.inf))
        elif st.samples:
            newest = max(s.taken_at for s in st.samples.values())
            if now - newest > stale:
                waiting, kv = conc, 1.0   # only stale data: assume the worst for routing
            else:
                until = min(until, math.nextafter(newest + stale, math.inf))
        if until != math.inf:
            if self._expires.get(name) != until:   # a busy node is rebuilt often, its timers rarely move
                self._expires[name] = until
                heapq.heappush(self._expiry, (until, name))
        else:
            self._expires.pop(name, None)
        return NodeView(
            name=name, models=models, capacity_tokens=cap, max_concurrency=conc, weight=weight,
            inflight_requests=st.inflight_requests, inflight_tokens=st.inflight_tokens,
            waiting=waiting, kv_usage=kv, healthy=healthy, unhealthy_reason=reason,
            tokens_per_s=st.tokens_per_s, ttft_s=st.ttft_ewma, labels=self._labels[name], rtt_ms=st.rtt_ms,
            lora_running=frozenset(lora["running"]) if lora else frozenset(),
            lora_waiting=frozenset(lora["waiting"]) if lora else frozenset(),
            max_lora=lora["max_lora"] if lora else None, lora_failed=failed,
        )

    def adapter_failed(self, node: str, adapter: str, seconds: float) -> None:
        """LoRA ``adapter`` failed to load on ``node``: routing skips the node for that adapter (and
        for it only) for ``seconds`` (extends, never shortens); the audit trail gets a node event."""
        st = self.nodes[node]
        now = self.clock.monotonic()
        until = max(st.lora_failed.get(adapter, 0.0), now + seconds)
        st.lora_failed = {**st.lora_failed, adapter: until}
        self.add_event(NodeEvent(node, st.state, st.state, f"LoRA adapter {adapter!r} failed to load",
                                 round(self.clock.time(), 6), {"adapter": adapter, "cooldown_s": seconds}))

    def touch(self, node: str) -> None:
        """``node``'s live state changed in a way attribute sets do not show (a dict updated in
        place): rebuild its routing view on the next :meth:`views`."""
        self._dirty.add(node)

    # ------------------------------------------------------------------ the request path

    def acquire(self, node: str, tokens: int) -> float:
        """An attempt goes in flight on ``node``; returns its cost mark (pass it to :meth:`release`)."""
        st = self.nodes[node]
        st.inflight_requests += 1
        st.inflight_tokens += tokens
        st.requests_total += 1
        return st.share.start(self.clock.time())

    def release(self, node: str, tokens: int, mark: float | None = None) -> float:
        """The attempt is out of flight; returns its cost in currency units: its equal share of the
        node's time since ``mark`` (cost.py) at the node's price; 0 without a mark."""
        st = self.nodes[node]
        st.inflight_requests = max(0, st.inflight_requests - 1)
        st.inflight_tokens = max(0, st.inflight_tokens - tokens)
        gpu_s = st.share.end(self.clock.time(), 0.0 if mark is None else mark)
        return 0.0 if mark is None else cost_of(gpu_s, st.price_per_hour)

    def report_success(self, node: str, *, stream: bool = True, completion_tokens: int = 0,
                       ttfb_s: float | None = None, e2e_s: float | None = None) -> None:
        """A request answered by ``node``. Times are seconds from the attempt's start (taken after
        admission and routing, when the request is handed to the node's connection, so the
        gateway's own queue is not in them): ``ttfb_s`` to the first byte, ``e2e_s`` to the last.

        * Streamed: ``ttfb_s`` is the time to first token: the latency rule's ``ttft`` measure;
          decode speed = (``completion_tokens`` − 1) / (``e2e_s`` − ``ttfb_s``).
        * Not streamed: the first byte comes with the whole answer, so ``ttfb_s`` says nothing
          about prefill and is not used. ``e2e_s / completion_tokens`` is the ``tpot`` measure;
          decode speed = ``completion_tokens`` / (``e2e_s`` − the node's streamed TTFT EWMA, the
          prefill estimate). With no streamed sample yet the estimate is 0: the prefill counts as
          decode, so the speed is under-estimated, never over-estimated.

        The decode speed is an EWMA (0.8 old, 0.2 new) read by the ``decode-speed`` scorer.
        """
        st = self.nodes[node]
        st.consecutive_failures = 0
        st.iv_requests += 1
        st.iv_successes += 1
        speed: float | None = None
        if stream:
            if ttfb_s is not None and math.isfinite(ttfb_s) and ttfb_s >= 0:
                if len(st.iv_ttft) < _MAX_TTFB_SAMPLES:
                    st.iv_ttft.append(ttfb_s)
                st.ttft_ewma = ttfb_s if st.ttft_ewma is None else 0.8 * st.ttft_ewma + 0.2 * ttfb_s
                if e2e_s is not None and completion_tokens > 1 and e2e_s - ttfb_s > 0:
                    speed = (completion_tokens - 1) / (e2e_s - ttfb_s)
        elif e2e_s is not None and math.isfinite(e2e_s) and e2e_s > 0 and completion_tokens > 0:
            if len(st.iv_tpot) < _MAX_TTFB_SAMPLES:
                st.iv_tpot.append(e2e_s / completion_tokens)
            decode_s = e2e_s - (st.ttft_ewma or 0.0)
            if completion_tokens > 1 and decode_s > 0:
                speed = completion_tokens / decode_s
        if speed is not None:
            st.tokens_per_s = speed if st.tokens_per_s is None else 0.8 * st.tokens_per_s + 0.2 * speed
        if st.state == "half_open":
            st.half_open_successes += 1
            if st.half_open_successes >= self.health.circuit.half_open_successes:
                self.to_healthy(st, "trial request succeeded: circuit closed",
                                {"trial_successes": st.half_open_successes})

    def report_failure(self, node: str) -> bool:
        """Count a gateway-side failure; returns True when this failure ejected the node."""
        st = self.nodes[node]
        st.failures_total += 1
        st.consecutive_failures += 1
        st.iv_requests += 1
        now = self.clock.monotonic()
        if st.state == "half_open":
            return self.eject(node, "trial request failed: circuit re-opened",
                              {"rule": "half_open", "consecutive_failures": st.consecutive_failures})
        limit = self.health.outlier.consecutive_failures
        if st.consecutive_failures < limit or st.state not in ("healthy", "cooldown") or now < st.ejected_until:
            return False
        return self.eject(node, f"{st.consecutive_failures} consecutive gateway-side failures",
                          {"rule": "consecutive_failures", "consecutive_failures": st.consecutive_failures,
                           "threshold": limit})

    def cool_down(self, node: str, seconds: float) -> None:
        """Skip ``node`` for ``seconds`` (429 Retry-After); extends, never shortens."""
        st = self.nodes[node]
        now = self.clock.monotonic()
        until = max(st.cooldown_until, now + seconds)
        extended = until > st.cooldown_until
        st.cooldown_until = until
        if st.state == "healthy" and extended:
            self.transition(st, "cooldown", f"429 with Retry-After {seconds:g}s",
                            {"retry_after_s": seconds, "until": round(self.clock.time() + (until - now), 6)})

    def inflight_total(self) -> int:
        return sum(s.inflight_requests for s in self.nodes.values())

    # ------------------------------------------------------------------ transitions (also used by the sweeps)

    def transition(self, st: NodeState, to: str, reason: str, evidence: dict[str, Any] | None = None,
                   *, at: float | None = None) -> None:
        """Move ``st`` to state ``to`` and queue the audit event. ``at``: monotonic time it happened
        (default now); the sweep passes the past instant a timer ran out."""
        now = self.clock.monotonic()
        when = now if at is None else min(at, now)
        wall = round(self.clock.time() - (now - when), 6)
        ev = NodeEvent(st.cfg.name, st.state, to, reason, wall, dict(evidence or {}))
        if st.state == to:
            st.reason, st.evidence = reason, ev.evidence
            return
        st.state, st.since, st.since_wall, st.reason, st.evidence = to, when, wall, reason, ev.evidence
        if to != "half_open":
            st.half_open_successes = 0
        self.add_event(ev)
        if self.on_transition is not None:
            self.on_transition(st, ev.from_state)

    def add_event(self, ev: NodeEvent) -> None:
        """Queue ``ev`` for the audit trail (bounded: the oldest is dropped and counted)."""
        if len(self._events) == self._events.maxlen:
            self.events_dropped += 1
        self._events.append(ev)

    def eject(self, node: str, reason: str, evidence: dict[str, Any], *, hardware: bool = False,
              seconds: float | None = None) -> bool:
        """Eject ``node`` (growing time, or ``seconds`` for hardware); False when the share cap forbids it."""
        st = self.nodes[node]
        now = self.clock.monotonic()
        if not hardware and not self.may_eject(node, now):
            return False
        if hardware:
            length = seconds if seconds is not None else self.health.hardware.ejection_s
            st.ejected_until = max(st.ejected_until if st.state == "ejected" else 0.0, now + length)
            st.hardware_fault = True
        else:
            st.backoff += 1
            length = ejection_seconds(st.backoff, self.health.outlier)
            st.ejected_until = now + length
        st.ejections += 1
        st.consecutive_failures = 0
        st.slow_start_at = None
        self.transition(st, "ejected", reason, {**evidence, "ejection_s": length, "ejections_in_a_row": st.backoff,
                                                "ejections_total": st.ejections})
        return True

    def may_eject(self, node: str, now: float) -> bool:
        models = self._model_sets[node]
        peers = [s for n, s in self.nodes.items() if self._model_sets[n] & models]
        ejected = sum(1 for s in peers if s.state == "ejected" and s.cfg.name != node)
        # Envoy: always at least one host may be ejected, whatever the percentage.
        return ejected == 0 or (ejected + 1) * 100.0 <= self.health.outlier.max_ejection_percent * len(peers)

    def to_healthy(self, st: NodeState, reason: str, evidence: dict[str, Any] | None = None, *,
                   slow_start: bool = True, at: float | None = None) -> None:
        st.hardware_fault = False
        st.consecutive_failures = 0
        if slow_start and self.health.slow_start.window_s > 0:
            st.slow_start_at = self.clock.monotonic() if at is None else at
            evidence = {**(evidence or {}), "slow_start_s": self.health.slow_start.window_s}
        self.transition(st, "healthy", reason, evidence, at=at)

    def events_queued(self) -> int:
        return len(self._events)

    def queued_events(self, start: int = 0) -> list[NodeEvent]:
        """The queued events from position ``start`` (see :meth:`events_queued`), without taking them."""
        return list(self._events)[start:]

    def take_events(self) -> list[NodeEvent]:
        """The queued state changes, oldest first; the queue is emptied."""
        out = list(self._events)
        self._events.clear()
        return out

    # ------------------------------------------------------------------ what operators see

    def describe(self) -> list[dict[str, Any]]:
        """Each node: state, since, why, timers, load and the last sample per source (JSON)."""
        now, wall = self.clock.monotonic(), self.clock.time()
        views = {v.name: v for v in self.views()}
        out = []
        for name, st in self.nodes.items():
            v = views[name]
            factor = None
            if st.slow_start_at is not None:
                factor = round(slow_start_factor(now - st.slow_start_at, self.health.slow_start), 4)
            out.append({
                "name": name, "url": redact_url(st.cfg.url), "models": sorted(self._model_sets[name]),
                "state": st.state, "since": st.since_wall, "for_s": round(now - st.since, 3), "why": st.reason,
                "evidence": st.evidence, "healthy": v.healthy, "reason": v.unhealthy_reason,
                "ejected_until": round(wall + st.ejected_until - now, 6) if st.state == "ejected" else None,
                "cooldown_until": round(wall + st.cooldown_until - now, 6) if st.cooldown_until > now else None,
                "slow_start_factor": factor, "ejections": st.ejections, "ejections_in_a_row": st.backoff,
                "consecutive_failures": st.consecutive_failures, "probe_failures": st.probe_failures,
                "inflight_requests": st.inflight_requests, "inflight_tokens": st.inflight_tokens,
                "capacity_tokens": st.cfg.capacity_tokens, "effective_capacity_tokens": v.capacity_tokens,
                "waiting": v.waiting, "kv_usage": v.kv_usage, "requests_total": st.requests_total,
                "lora": {"running": sorted(v.lora_running), "waiting": sorted(v.lora_waiting),
                         "max_lora": v.max_lora, "failed": sorted(v.lora_failed)},
                "failures_total": st.failures_total, "tokens_per_s": st.tokens_per_s,
                "ttft_s": round(st.ttft_ewma, 6) if st.ttft_ewma is not None else None,
                "ttft_baseline_s": st.ttft_baseline, "rtt_ms": st.rtt_ms, "labels": dict(st.cfg.labels),
                "tpot_baseline_s": st.tpot_baseline, "hardware": st.hw_findings,
                "samples": {src: {**s.to_json(), "age_s": round(s.age(now), 3)} for src, s in st.samples.items()},
            })
        return out
