"""The discrete-event simulation: a plan's requests through admission and the real routing core
onto emulated nodes, in virtual time (no sockets, no clock, no sleeping).

Contract:

* :meth:`Simulation.run` takes requests sorted by ``t`` (``PlannedRequest`` of
  :mod:`inferlb.bench.loadgen.workload` / ``trace``, or anything with the :class:`RequestLike`
  fields) and returns :class:`~.results.DesResults` (row ``i`` = request ``i``). Same inputs and
  seed, same results, on any machine.
* Per request, as the gateway does it: admission (:mod:`.admission`) → routing with a
  :class:`~inferlb.engine.routing.Router` built by ``build_router(profile)`` (the gateway's
  profiles by name, or a router passed in) over :class:`~inferlb.engine.routing.types.NodeList`
  views kept up to date incrementally → the node's engine (:mod:`.engine`: the emulator's
  continuous-batching model). The first ranked node is used; a request no node may serve ends
  ``no_node``. Retries are not modelled (nodes here do not fail a request that routing placed,
  except by crashing).
* Ties in time: node steps and node state changes at ``t`` happen before an arrival at ``t``.
* Every ``scrape_s`` the gateway's view of every node takes the node's queue length and KV use
  (the health probe's metrics scrape). With ``timeout_s`` a request still unanswered that long
  after its arrival is given up by the client and aborted on its node (``timeout``).
* Hooks for the work built on this: ``controller(sim)`` is called every ``control_every_s`` of
  virtual time (first at ``control_every_s``) and may call :meth:`Simulation.add_node` (the node
  takes traffic after its cold start), :meth:`Simulation.drain_node` (no new requests; removed
  when idle) or :meth:`Simulation.remove_node` (at once; what runs on it fails); it reads
  :attr:`Simulation.now`, :meth:`Simulation.nodes_info`, :meth:`Simulation.take_window` and the
  results so far. ``prefill_cached(row, request, node)`` returns how many prompt tokens the node
  already holds (a prefix cache, :class:`~.prefix.PrefixCaches`): they are not prefilled.
* Affinity inputs: when the router reads prompt blocks (``Router.prefix_blocks`` > 0) and
  ``prompt_of(request)`` gives a :class:`~.prefix.PromptInfo` (default: the ``prefill_cached``
  hook's own, when it is a :class:`~.prefix.PrefixCaches`), the request is routed with the text's
  block hashes and its session's key, hashed as the gateway hashes them (engine/scope.py
  ``begin_request``).
* Network delay: a node's ``NodeSpec.network_delay_s`` (the round trip to an edge node) is added
  to the TTFT and e2e the client sees, and to the times the gateway learns from (its TTFT and
  decode-speed EWMAs, the feedback). The node starts the request at dispatch (the emulator starts
  it one round trip later; the node's own schedule is the same unless its queue changes within
  that round trip); a client ``timeout_s`` is checked against the node's times alone. The
  gateway's view of the node carries ``rtt_ms`` from the scrapes, as its readiness probes'
  EWMA would (:mod:`.node`).
* ``feedback`` (:class:`~.feedback.Feedback`): told of every routed request when it ends, with
  its decision and the node's own times (not the gateway queue); its ``tick`` runs every
  ``feedback.tick_s`` virtual seconds, off the request path (a learned router trains there).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from inferlb.engine.routing import Router, RouteRequest, build_router
from inferlb.engine.routing.prefix import block_hashes, text_key
from inferlb.engine.routing.types import Decision, NodeList, NodeView

from ..presets import SIM_MODEL
from ..spec import NodeSpec
from .admission import ADMIT, QUEUE, Admission, OpenAdmission
from .engine import RUNNING, FastSeq
from .feedback import Feedback, Finished
from .node import DesNode
from .prefix import PrefixCaches, PromptInfo
from .results import FAILED, NO_NODE, OK, OUTCOMES, REJECTED, TIMEOUT, DesResults, NodeRecord

__all__ = ["Controller", "NodeInfo", "PrefillHook", "RequestLike", "Simulation", "Window"]

_WAKE, _READY, _UP = 0, 1, 2


class RequestLike(Protocol):
    """What the simulation reads of a request (``PlannedRequest`` has these fields)."""

    @property
    def t(self) -> float: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def model(self) -> str | None: ...
    @property
    def priority(self) -> str | None: ...
    @property
    def stream(self) -> bool: ...


PrefillHook = Callable[[int, RequestLike, DesNode], int]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node as a controller sees it."""

    name: str
    preset: str | None
    models: frozenset[str]
    state: str
    added_at: float
    ready_at: float
    inflight: int
    waiting: int
    busy_s: float


@dataclass(slots=True)
class Window:
    """What happened between two :meth:`Simulation.take_window` calls (virtual seconds)."""

    start: float
    end: float = 0.0
    arrivals: int = 0
    prompt_tokens: int = 0          # of the arrivals
    output_tokens: int = 0          # of the arrivals
    completed: int = 0
    rejected: int = 0
    failed: int = 0                 # failed, timeout and no_node
    e2e_sum_s: float = 0.0          # of the completed
    ttft_sum_s: float = 0.0         # of the completed


Controller = Callable[["Simulation"], None]


class Simulation:
    """See the module docstring. Nodes named in ``specs`` are ready at ``start``."""

    def __init__(self, specs: Iterable[NodeSpec], *, profile: str = "token-aware", seed: int = 0,
                 router: Router | None = None, admission: Admission | None = None, model: str = SIM_MODEL,
                 scrape_s: float = 5.0, timeout_s: float | None = None, controller: Controller | None = None,
                 control_every_s: float = 60.0, prefill_cached: PrefillHook | None = None,
                 start: float = 0.0, feedback: Feedback | None = None,
                 prompt_of: Callable[[RequestLike], PromptInfo | None] | None = None) -> None:
        if scrape_s <= 0 or control_every_s <= 0:
            raise ValueError("scrape_s and control_every_s must be > 0")
        self.router = router if router is not None else build_router(profile, seed=seed)
        self.admission: Admission = admission if admission is not None else OpenAdmission()
        self.model = model
        self.scrape_s = scrape_s
        self.timeout_s = timeout_s
        self.controller = controller
        self.control_every_s = control_every_s
        self.prefill_cached = prefill_cached
        if prompt_of is None and isinstance(prefill_cached, PrefixCaches):
            prompt_of = prefill_cached.prompt
        self.prompt_of = prompt_of
        self.feedback = feedback
        if feedback is not None and not feedback.tick_s > 0:
            raise ValueError("feedback.tick_s must be > 0")
        self._next_tick = start + feedback.tick_s if feedback is not None else math.inf
        self._decisions: dict[int, tuple[Decision, RequestLike]] = {}   # rows in flight, with feedback
        self.now = start
        self.results = DesResults()
        self._nodes: dict[str, DesNode] = {}
        self._views = NodeList([], {})
        self._pos: dict[str, int] = {}
        self._mpos: dict[str, list[tuple[str, int]]] = {}
        self._dirty: set[DesNode] = set()
        self._slots: dict[str, int] = {}
        self._heap: list[tuple[float, int, int, DesNode]] = []
        self._seq = 0
        self._live: dict[int, tuple[FastSeq, DesNode]] = {}
        self._queued: set[int] = set()
        self._inflight = 0
        self._timeouts: deque[tuple[float, int]] = deque()
        self._next_scrape = start + scrape_s
        self._next_control = start + control_every_s if controller is not None else math.inf
        self._window = Window(start)
        self._reqs: dict[int, RequestLike] = {}     # rows waiting in the gateway queue
        self.events = 0
        self._loading = True     # the initial fleet: one slot count at the end, not one per node
        for spec in specs:
            self.add_node(spec)
        self._loading = False
        self._recount_slots()

    # ------------------------------------------------------------------ the fleet (controller API)

    def add_node(self, spec: NodeSpec, *, cold_start_s: float = 0.0) -> None:
        """Add a node now; it takes traffic after ``cold_start_s`` (GPU time counts from now)."""
        if spec.name in self._nodes:
            raise ValueError(f"a node named {spec.name!r} is already in the fleet")
        if cold_start_s < 0:
            raise ValueError("cold_start_s must be >= 0")
        node = DesNode(spec, len(self.results.nodes), self.now, self.now + cold_start_s)
        self.results.nodes.append(NodeRecord(spec.name, spec.preset, spec.gpu.name, self.now, node.ready_at))
        self._nodes[spec.name] = node
        views = self._views
        self._pos[spec.name] = len(views)
        views.append(node.view)
        mpos = self._mpos[spec.name] = []
        for m in sorted(node.models):
            lst = views.by_model.setdefault(m, [])
            mpos.append((m, len(lst)))
            lst.append(node.view)
        if node.state == "starting":
            self._push(node.ready_at, _READY, node)
        else:
            self._changed(node)

    def drain_node(self, name: str) -> None:
        """Stop routing to ``name``; it is removed once its requests have ended."""
        node = self._node(name)
        if node.state in ("draining", "removed"):
            return
        node.state = "draining"
        self._changed(node)
        if node.idle():
            self._remove(node)

    def remove_node(self, name: str) -> None:
        """Remove ``name`` now: its running and queued requests fail."""
        node = self._node(name)
        if node.state == "removed":
            return
        for seq in node.core.crash(self.now, 0.0):
            self._lost(seq, node, "the node was removed")
        self._remove(node)

    def nodes_info(self) -> list[NodeInfo]:
        """Every node not yet removed."""
        return [NodeInfo(n.name, n.spec.preset, n.models, n.state, n.added_at, n.ready_at, n.inflight_requests,
                         len(n.core.waiting), n.core.busy_s_total)
                for n in self._nodes.values() if n.state != "removed"]

    def take_window(self) -> Window:
        """The counts since the previous call (or the start), and start a new window."""
        w = self._window
        w.end = self.now
        self._window = Window(self.now)
        return w

    def _node(self, name: str) -> DesNode:
        node = self._nodes.get(name)
        if node is None:
            raise ValueError(f"no node named {name!r}")
        return node

    def _remove(self, node: DesNode) -> None:
        node.state = "removed"
        node.removed_at = self.now
        rec = self.results.nodes[node.index]
        rec.removed_at = self.now
        self._record(node)
        del self._nodes[node.name]
        self._dirty.discard(node)
        # Rebuild the lists without it (rare: a scaling decision, not a request).
        keep = [n for n in self._nodes.values()]
        self._views = NodeList([], {})
        self._pos, self._mpos = {}, {}
        for n in keep:
            views = self._views
            self._pos[n.name] = len(views)
            views.append(n.view)
            mpos = self._mpos[n.name] = []
            for m in sorted(n.models):
                lst = views.by_model.setdefault(m, [])
                mpos.append((m, len(lst)))
                lst.append(n.view)
        self._recount_slots()

    def _record(self, node: DesNode) -> None:
        rec = self.results.nodes[node.index]
        rec.requests = node.served
        rec.busy_s = node.core.busy_s_total
        rec.preemptions = node.core.preemptions_total

    def _changed(self, node: DesNode) -> None:
        """A state change (ready, draining, crash): rebuild its view and the pools' slots."""
        self._dirty.add(node)
        if not self._loading:
            self._recount_slots()

    def _recount_slots(self) -> None:
        slots: dict[str, int] = {}
        now = self.now
        for n in self._nodes.values():
            if n.routable(now):
                for m in n.models:
                    slots[m] = slots.get(m, 0) + n.spec.max_concurrency
        self._slots = slots

    # ------------------------------------------------------------------ Pools (admission's view)

    def slots(self, pool: str) -> int:
        return self._slots.get(pool, 0)

    def views(self, pool: str) -> list[NodeView]:
        self._refresh_views()
        return self._views.by_model.get(pool, [])

    def inflight(self) -> int:
        return self._inflight

    def routing_views(self) -> NodeList:
        """The views routing reads now (the simulation's own list: read it, do not keep it)."""
        self._refresh_views()
        return self._views

    # ------------------------------------------------------------------ the run

    def run(self, requests: Iterable[RequestLike], *, until: float | None = None) -> DesResults:
        """Every request, then the drain: until nothing is in flight (or virtual time ``until``)."""
        limit = math.inf if until is None else until
        last = -math.inf
        for r in requests:
            t = r.t
            if t < last:
                raise ValueError(f"requests must be sorted by t ({t} after {last})")
            if t > limit:
                break
            last = t
            self._until(t)
            self.now = t
            self._arrive(r)
        while (self._live or self._queued) and self.now < limit:   # the drain
            nxt = self._next_at()
            if nxt == math.inf or nxt > limit:
                break
            self._until(nxt)
        self.now = max(self.now, last) if until is None else min(max(self.now, last), limit)
        self.results.end_s = self.now
        for n in self._nodes.values():
            self._record(n)
        return self.results

    def _next_at(self) -> float:
        at = self._heap[0][0] if self._heap else math.inf
        if self._timeouts and self._timeouts[0][0] < at:
            at = self._timeouts[0][0]
        adm = self.admission.next_timer()
        if adm is not None and adm < at:
            at = adm
        if (self._live or self._queued) and self._next_scrape < at:
            at = self._next_scrape
        if self._next_control < at:
            at = self._next_control
        if self._next_tick < at:
            at = self._next_tick
        return at

    def _until(self, t: float) -> None:
        """Process every event at or before ``t``."""
        heap = self._heap
        timeouts = self._timeouts
        while True:  # bounded: each pass consumes an event or a timer
            at = heap[0][0] if heap else math.inf
            kind = 0
            if timeouts and timeouts[0][0] < at:
                at, kind = timeouts[0][0], 1
            if self._next_scrape < at:
                at, kind = self._next_scrape, 2
            if self._next_control < at:
                at, kind = self._next_control, 3
            if self._next_tick < at:
                at, kind = self._next_tick, 5
            adm = self.admission.next_timer()
            if adm is not None and adm < at:
                at, kind = adm, 4
            if at > t:
                return
            self.now = at
            self.events += 1
            if kind == 0:
                _, what, _, node = heapq.heappop(heap)
                if what == _WAKE:
                    if node.wake == at:
                        self._wake(node, at)
                elif what == _READY:
                    if node.state == "starting":
                        node.state = "ready"
                        self._changed(node)
                else:
                    self._changed(node)
            elif kind == 1:
                _, i = timeouts.popleft()
                self._timeout(i)
            elif kind == 2:
                self._scrape()
            elif kind == 3:
                self._next_control += self.control_every_s
                assert self.controller is not None
                self.controller(self)
            elif kind == 5:
                assert self.feedback is not None
                self._next_tick += self.feedback.tick_s
                self.feedback.tick(at)
            else:
                granted, rejected = self.admission.tick(at, self)
                for i, why in rejected:
                    self._reject(i, why)
                for i in granted:
                    self._grant(i)

    def _push(self, at: float, what: int, node: DesNode) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, what, self._seq, node))

    def _schedule(self, node: DesNode) -> None:
        at = node.core.next_event_at()
        if at is not None and at != node.wake:
            node.wake = at
            self._seq += 1
            heapq.heappush(self._heap, (at, _WAKE, self._seq, node))

    def _scrape(self) -> None:
        now = self.now
        while self._next_scrape <= now:
            self._next_scrape += self.scrape_s
        for n in self._nodes.values():
            if n.state != "starting":
                n.scrape(now)
                self._dirty.add(n)

    def _refresh_views(self) -> None:
        dirty = self._dirty
        if not dirty:
            return
        now = self.now
        views = self._views
        by_model = views.by_model
        for n in dirty:
            v = n.build_view(now)
            n.view = v
            views[self._pos[n.name]] = v
            for m, j in self._mpos[n.name]:
                by_model[m][j] = v
        dirty.clear()

    # ------------------------------------------------------------------ one request

    def _arrive(self, r: RequestLike) -> None:
        res = self.results
        i = res.add(r.t, r.prompt_tokens, r.output_tokens, r.stream, r.priority)
        w = self._window
        w.arrivals += 1
        w.prompt_tokens += r.prompt_tokens
        w.output_tokens += r.output_tokens
        if self.timeout_s is not None:
            self._timeouts.append((r.t + self.timeout_s, i))
        verdict = self.admission.admit(i, r.model or self.model, r.priority, self.now, self)
        if verdict.kind == ADMIT:
            self._inflight += 1
            self._dispatch(i, r)
        elif verdict.kind == QUEUE:
            self._queued.add(i)
            self._reqs[i] = r
        else:
            res.finish(i, REJECTED, reason=verdict.reason)
            w.rejected += 1

    def _dispatch(self, i: int, r: RequestLike) -> None:
        self._refresh_views()
        now = self.now
        res = self.results
        res.queue[i] = now - r.t
        prompt, output = r.prompt_tokens, r.output_tokens
        prefix: tuple[int, ...] = ()
        session: int | None = None
        blocks = self.router.prefix_blocks
        if blocks and self.prompt_of is not None:
            info = self.prompt_of(r)
            if info is not None:
                if info.text:
                    prefix = block_hashes(info.text, blocks)
                if info.session:
                    session = text_key(info.session)
        d = self.router.decide(RouteRequest(r.model or self.model, prompt, output, r.priority, stream=r.stream,
                                            prefix=prefix, session=session), self._views)
        name = d.pick
        if self.feedback is not None:
            self._decisions[i] = (d, r)
        if name is None:
            self._end(i, NO_NODE, reason="no node may serve it")
            return
        node = self._nodes[name]
        core = node.core
        if not core.fits_ever(prompt + output - 1):
            self._end(i, FAILED, node=node.index, reason="context over the node's KV cache")
            return
        self._advance(node, now)
        cached = self.prefill_cached(i, r, node) if self.prefill_cached is not None else 0
        seq = core.submit(prompt, output, now, cached=cached, tag=i)
        self._live[i] = (seq, node)
        node.inflight_requests += 1
        node.inflight_tokens += prompt + output
        node.served += 1
        self._dirty.add(node)
        self._schedule(node)

    def _wake(self, node: DesNode, at: float) -> None:
        node.wake = None
        self._advance(node, at)
        self._schedule(node)
        if node.state == "draining" and node.idle():
            self._remove(node)

    def _advance(self, node: DesNode, at: float) -> None:
        """Run ``node``'s engine to ``at`` and settle what ended."""
        report = node.core.advance(at)
        for seq in report.finished:
            self._complete(seq, node)
        for seq in report.failed:
            self._lost(seq, node, "the node crashed (KV cache full)" if report.crashed_at is not None
                       else "context over the node's KV cache")
        if report.crashed_at is not None:
            self._changed(node)
            self._push(node.core.down_until, _UP, node)

    def _complete(self, seq: FastSeq, node: DesNode) -> None:
        i = seq.tag
        if self._live.pop(i, None) is None:
            return
        res = self.results
        arrived = res.t[i]
        delay = node.spec.network_delay_s    # the round trip: the client sees every time that much later
        first = None if seq.first_token_at is None else seq.first_token_at + delay
        end = (seq.finished_at if seq.finished_at is not None else self.now) + delay
        ttft = (first - arrived) if first is not None else math.nan
        e2e = end - arrived
        res.finish(i, OK, node=node.index, ttft=ttft, e2e=e2e, tokens=seq.output)
        w = self._window
        w.completed += 1
        w.e2e_sum_s += e2e
        if first is not None:
            w.ttft_sum_s += ttft
        start = arrived + res.queue[i]
        node.learn(stream=bool(res.stream[i]), tokens=seq.output,
                   ttft_s=None if first is None else first - start, e2e_s=end - start)
        self._leave(i, node, seq, True)
        if self.feedback is not None:
            self._feed(i, node.name, OK, seq.output, None if first is None else first - start, end - start)

    def _lost(self, seq: FastSeq, node: DesNode, why: str) -> None:
        i = seq.tag
        if self._live.pop(i, None) is None:
            return
        self.results.finish(i, FAILED, node=node.index, reason=why)
        self._window.failed += 1
        self._leave(i, node, seq, False)
        if self.feedback is not None:
            self._feed(i, node.name, FAILED, 0, None, None)

    def _leave(self, i: int, node: DesNode, seq: FastSeq, ok: bool) -> None:
        node.inflight_requests -= 1
        node.inflight_tokens -= seq.prompt + seq.output
        self._dirty.add(node)
        self._inflight -= 1
        for j in self.admission.release(i, self.now, ok, self):
            self._grant(j)

    def _end(self, i: int, outcome: int, *, node: int = -1, reason: str) -> None:
        """An admitted request that never reached a node engine."""
        self.results.finish(i, outcome, node=node, reason=reason)
        self._window.failed += 1
        if self.feedback is not None:
            self._feed(i, self.results.nodes[node].name if node >= 0 else None, outcome, 0, None, None)
        self._inflight -= 1
        for j in self.admission.release(i, self.now, False, self):
            self._grant(j)

    def _feed(self, i: int, node: str | None, outcome: int, tokens: int, ttft: float | None,
              e2e: float | None) -> None:
        got = self._decisions.pop(i, None)
        if got is None or self.feedback is None:
            return
        d, r = got
        self.feedback.on_finish(Finished(i, r, r.model or self.model, d, node, OUTCOMES[outcome], bool(r.stream),
                                         tokens, ttft, e2e, self.results.queue[i], self.now))

    def _grant(self, i: int) -> None:
        r = self._reqs.pop(i, None)
        if r is None or i not in self._queued:
            return
        self._queued.discard(i)
        self._inflight += 1
        self._dispatch(i, r)

    def _reject(self, i: int, why: str) -> None:
        if i not in self._queued:
            return
        self._queued.discard(i)
        self._reqs.pop(i, None)
        self.results.finish(i, REJECTED, reason=why)
        self.results.queue[i] = self.now - self.results.t[i]
        self._window.rejected += 1

    def _timeout(self, i: int) -> None:
        res = self.results
        if res.outcome[i] != -1:
            return
        live = self._live.pop(i, None)
        if live is not None:
            seq, node = live
            self._live[i] = live
            self._advance(node, self.now)
            if self._live.pop(i, None) is None:
                return    # it ended at this very instant
            if seq.state <= RUNNING:
                node.core.abort(seq, self.now)
            res.finish(i, TIMEOUT, node=node.index, reason="the client gave up (timeout_s)")
            self._window.failed += 1
            self._leave(i, node, seq, False)
            if self.feedback is not None:
                self._feed(i, node.name, TIMEOUT, 0, None, None)
            self._schedule(node)
            if node.state == "draining" and node.idle():
                self._remove(node)
        elif i in self._queued:
            self._queued.discard(i)
            self._reqs.pop(i, None)
            res.finish(i, TIMEOUT, reason="the client gave up in the gateway queue (timeout_s)")
            res.queue[i] = self.now - res.t[i]
            self._window.failed += 1
            for j in self.admission.release(i, self.now, False, self):
                self._grant(j)
