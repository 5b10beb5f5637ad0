"""One emulated node in virtual time: its engine, its life cycle, and the gateway's view of it.

Contract:

* The engine is a :class:`~.engine.FastCore` for a node whose :class:`~inferlb.simulator.spec.NodeSpec`
  has ``batching`` (the continuous-batching model of the real-time emulator), else a
  :class:`FixedCore` (every request on its own fixed-speed schedule, no queueing, as the emulator's
  non-batching nodes).
* Life cycle: ``starting`` (added; loading for its cold start, counted in GPU time, not routable)
  → ``ready`` → ``draining`` (no new requests; ``removed`` once its last one ends) → ``removed``.
  A node added at the start of a run with no cold start is ``ready`` at once.
* The gateway's view mirrors :class:`~inferlb.fleet.state.Fleet` as routing reads it:
  ``inflight_*`` are counted on dispatch and completion; ``tokens_per_s`` and ``ttft_s`` are the
  decode-speed and streamed-TTFT EWMAs of ``Fleet.report_success`` (0.8 old, 0.2 new;
  streamed: (tokens − 1) / (e2e − TTFT),
  non-streamed: tokens / (e2e − the streamed-TTFT EWMA)); ``waiting`` / ``kv_usage`` are the last
  scrape's (none before the first); ``capacity_tokens`` is the KV-cache size and
  ``max_concurrency`` the node's own cap, as ``inferlb bench run`` writes the gateway's fleet file
  (inferlb/bench/loadgen/stack.py). Health rules (ejection, slow start of the gateway, panic
  mode) are not modelled: a node is routable exactly while ``ready`` and not crashed.
  ``rtt_ms`` is the gateway's round-trip EWMA (health/isolation.py ``observe``: weight
  :data:`RTT_ALPHA` on the newest probe time), fed at every scrape with the node's
  ``network_delay_s`` (what a readiness probe's time is on an otherwise idle network; the
  emulator's probe answers after that delay); None before the first scrape, as before the first
  probe. A node whose spec has ``lora`` keeps its adapter slots (``lora``, the emulator's
  :class:`~inferlb.simulator.lora.AdapterSlots`; :mod:`.lora`) and its view carries the last
  scrape's ``vllm:lora_requests_info`` (running and waiting adapters) and its ``max_lora``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from inferlb.routing.types import NodeView
from inferlb.simulator.des.engine import ABORTED, FAILED, FINISHED, RUNNING, CoreReport, FastCore, FastSeq
from inferlb.simulator.lora import AdapterSlots
from inferlb.simulator.spec import NodeSpec

__all__ = ["RTT_ALPHA", "DesNode", "FixedCore", "NodeState"]

RTT_ALPHA = 0.2   # the gateway's (health/isolation.py); the layering keeps the simulator off engine.health

NodeState = str   # "starting" | "ready" | "draining" | "removed"

_NOT_READY = {"starting": "loading (cold start)", "draining": "draining", "removed": "removed"}


class FixedCore:
    """A fixed-speed node (``NodeSpec.batching is None``): each request finishes at
    ``arrival + LatencyModel.e2e_s`` whatever else runs; the same interface as :class:`FastCore`."""

    def __init__(self, spec: NodeSpec) -> None:
        self.latency = spec.latency()
        self._heap: list[tuple[float, int, FastSeq]] = []
        self._next_rid = 0
        self.waiting: list[FastSeq] = []
        self.running: list[FastSeq] = []   # never read for a fixed node; kept for the same interface
        self.busy_s_total = 0.0
        self.preemptions_total = 0
        self.down_until = -math.inf
        self.slow_factor_at = None

    def is_down(self, now: float) -> bool:
        return now < self.down_until

    def fits_ever(self, tokens: int) -> bool:
        return True

    def usage_at(self, now: float) -> float:
        return 0.0

    def next_event_at(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def submit(self, prompt_tokens: int, output_tokens: int, now: float, *, cached: int = 0, tag: int = 0) -> FastSeq:
        seq = FastSeq(self._next_rid, prompt_tokens, max(1, output_tokens), now, cached, tag)
        self._next_rid += 1
        seq.state = RUNNING
        seq.admitted_at = now
        seq.first_token_at = now + self.latency.ttft_s(prompt_tokens - seq.cached)
        end = seq.first_token_at + (seq.output - 1) * self.latency.tpot_s
        self.busy_s_total += end - now
        heapq.heappush(self._heap, (end, seq.rid, seq))
        return seq

    def abort(self, seq: FastSeq, now: float) -> None:
        if seq.state < FINISHED:
            seq.state = ABORTED
            seq.finished_at = now

    def crash(self, now: float, cold_start_s: float) -> list[FastSeq]:
        lost = [s for _, _, s in self._heap if s.state == RUNNING]
        for s in lost:
            s.state = FAILED
            s.finished_at = now
        self._heap.clear()
        self.down_until = now + cold_start_s
        return lost

    def advance(self, now: float) -> CoreReport:
        report = CoreReport()
        heap = self._heap
        while heap and heap[0][0] <= now:
            end, _, seq = heapq.heappop(heap)
            if seq.state == RUNNING:
                seq.state = FINISHED
                seq.finished_at = end
                report.finished.append(seq)
        return report


class DesNode:
    """See the module docstring. ``index`` is the node's row in the run's node table."""

    __slots__ = ("added_at", "core", "index", "inflight_requests", "inflight_tokens", "kv_usage", "lora",
                 "lora_due", "lora_queue", "lora_seen", "max_concurrency", "models", "mpos", "name", "pos",
                 "ready_at", "removed_at", "rtt_ms", "served", "spec", "state", "tokens_per_s", "ttft_ewma", "view",
                 "view_capacity", "waiting", "wake")

    def __init__(self, spec: NodeSpec, index: int, added_at: float, ready_at: float) -> None:
        self.spec = spec
        self.name = spec.name
        self.index = index
        self.models = frozenset(spec.models)
        # The view's two fixed numbers, read from the (frozen) spec once, not at every rebuild.
        self.view_capacity = self.capacity_tokens
        self.max_concurrency = spec.max_concurrency
        self.core: FastCore | FixedCore = FastCore(spec.batching) if spec.batching is not None else FixedCore(spec)
        self.added_at = added_at
        self.ready_at = ready_at
        self.removed_at: float | None = None
        self.state: NodeState = "ready" if ready_at <= added_at else "starting"
        self.inflight_requests = 0
        self.inflight_tokens = 0
        self.tokens_per_s: float | None = None
        self.ttft_ewma: float | None = None
        self.waiting: int | None = None
        self.kv_usage: float | None = None
        self.rtt_ms: float | None = None
        self.served = 0
        self.wake: float | None = None      # the time of this node's live entry in the event heap
        self.lora: AdapterSlots | None = AdapterSlots(spec.lora) if spec.lora is not None else None
        self.lora_queue: deque[tuple[int, str]] = deque()     # rows waiting for an adapter slot
        self.lora_due: list[tuple[float, int]] = []           # heap: rows waiting for their adapter's load
        self.lora_seen: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())   # last scrape
        self.view = self.build_view(added_at)
        # Where the simulation keeps the view (SimFleet._place): its index in the fleet's views,
        # and per model the model's list and its index there.
        self.pos = -1
        self.mpos: list[tuple[list[NodeView], int]] = []
        f = spec.faults
        if f.slow_start_s > 0 and f.slow_start_factor > 1.0:
            self.core.slow_factor_at = self._slow_factor

    def _slow_factor(self, now: float) -> float:
        """The emulator's slow-start curve (EmulatedNode.slow_factor) from the end of the cold start."""
        f = self.spec.faults
        since = now - self.ready_at
        if since >= f.slow_start_s:
            return 1.0
        return 1.0 + (f.slow_start_factor - 1.0) * (1.0 - max(0.0, since) / f.slow_start_s)

    @property
    def capacity_tokens(self) -> int:
        b = self.spec.batching
        return b.kv_tokens if b is not None else 32_768

    def routable(self, now: float) -> bool:
        return self.state == "ready" and not self.core.is_down(now)

    def build_view(self, now: float) -> NodeView:
        """The routing snapshot of this node at ``now``."""
        reason: str | None = None
        if self.state != "ready":
            reason = _NOT_READY.get(self.state, self.state)
        elif now < self.core.down_until:
            reason = "loading (restarting after a crash)"
        # NodeView.build: NodeView(...)'s view, cheaper to call with keywords (routing/types.py
        # _quick_init). The four required fields by position (they have no default, so their
        # places are fixed), the rest by name: at most 13 names, since a call with more compiles
        # to building a dict of them (CPython's compiler, past 30 stack slots), which costs as
        # much as the view itself.
        seen = self.lora_seen
        return NodeView.build(self.name, self.models, self.view_capacity, self.max_concurrency,
                              inflight_requests=self.inflight_requests, inflight_tokens=self.inflight_tokens,
                              waiting=self.waiting, kv_usage=self.kv_usage, healthy=reason is None,
                              unhealthy_reason=reason, tokens_per_s=self.tokens_per_s, ttft_s=self.ttft_ewma,
                              rtt_ms=self.rtt_ms, lora_running=seen[0], lora_waiting=seen[1],
                              max_lora=self.lora.spec.max_lora if self.lora is not None and self.waiting is not None
                              else None)

    def learn(self, *, stream: bool, tokens: int, ttft_s: float | None, e2e_s: float) -> None:
        """``Fleet.report_success``'s decode-speed and TTFT EWMAs (inferlb/fleet/state.py)."""
        speed: float | None = None
        if stream:
            if ttft_s is not None and ttft_s >= 0:
                self.ttft_ewma = ttft_s if self.ttft_ewma is None else 0.8 * self.ttft_ewma + 0.2 * ttft_s
                if tokens > 1 and e2e_s - ttft_s > 0:
                    speed = (tokens - 1) / (e2e_s - ttft_s)
        elif e2e_s > 0 and tokens > 0:
            decode_s = e2e_s - (self.ttft_ewma or 0.0)
            if tokens > 1 and decode_s > 0:
                speed = tokens / decode_s
        if speed is not None:
            self.tokens_per_s = speed if self.tokens_per_s is None else 0.8 * self.tokens_per_s + 0.2 * speed

    def scrape(self, now: float) -> None:
        """What a metrics scrape reads: the engine's queue length and KV use."""
        self.waiting = len(self.core.waiting)
        self.kv_usage = round(self.core.usage_at(now), 4)
        if self.lora is not None:
            running, waiting = self.lora.report(now)
            self.lora_seen = (frozenset(running), frozenset(waiting))
        probe_ms = self.spec.network_delay_s * 1000.0
        rtt = self.rtt_ms
        self.rtt_ms = probe_ms if rtt is None else (1 - RTT_ALPHA) * rtt + RTT_ALPHA * probe_ms

    def idle(self) -> bool:
        return self.inflight_requests == 0 and self.core.next_event_at() is None
