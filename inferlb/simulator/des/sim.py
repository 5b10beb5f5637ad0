"""The discrete-event simulation: a plan's requests through admission and the real routing core
onto emulated nodes, in virtual time (no sockets, no clock, no sleeping).

Contract:

* :meth:`Simulation.run` takes requests sorted by ``t`` (``PlannedRequest`` of
  :mod:`inferlb.bench.loadgen.workload` / ``trace``, or anything with the :class:`RequestLike`
  fields) and returns :class:`~.results.DesResults` (row ``i`` = request ``i``). Same inputs and
  seed, same results, on any machine.
* Per request, as the gateway does it: admission (:mod:`.admission`) → routing with a
  :class:`~inferlb.routing.profiles.Router` built by ``build_router(profile)`` (the gateway's
  profiles by name, or a router passed in) over :class:`~inferlb.routing.types.NodeList`
  views kept up to date incrementally → the node's engine (:mod:`.engine`: the emulator's
  continuous-batching model). The first ranked node is used; a request no node may serve ends
  ``no_node``. Retries are not modelled (nodes here do not fail a request that routing placed,
  except by crashing).
* Only what a gateway knows: routing, the gateway's node views and the controller's windows see
  a request's declared ``max_tokens`` (an optional field of the request: None or absent, it
  declares none), its prompt tokens, model, tenant, priority, stream flag and session, the
  nodes' reported metrics and the gateway's own history; never ``output_tokens``, the answer
  the model will write, which only the node's engine reads (cut at a declared ``max_tokens``,
  as a server cuts it). The output budget the router is given and each node's in-flight tokens
  count (prompt + budget, as ``Fleet.acquire`` counts it) is the declared ``max_tokens``, else
  ``default_max_tokens`` (the gateway's ``default_max_tokens`` of the model, 256 as
  ``inferlb bench run`` configures it); with ``lengths`` (a
  :class:`~inferlb.routing.length.LengthPredictor`) it is the predictor's estimate instead,
  trained from the completion tokens of the requests that finish, as the live gateway trains it.
  A workload's ``max_tokens: exact`` declares the true length: the old oracle, kept for
  comparison (docs/learned-routing.md).
* Ties in time: node steps and node state changes at ``t`` happen before an arrival at ``t``.
* Every ``scrape_s`` the gateway's view of every node takes the node's queue length and KV use
  (the health probe's metrics scrape). With ``timeout_s`` a request still unanswered that long
  after its arrival is given up by the client and aborted on its node (``timeout``);
  ``timeout_s`` is the simulation's for its whole life (set it when constructing it).
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
* LoRA adapters (:mod:`.lora`): a request's ``adapter`` field is routed as
  ``RouteRequest.adapter``; on a node whose spec has ``lora`` it holds an adapter slot, loads a
  cold adapter and waits for a free slot as the emulator's node does.
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
Layout: :mod:`.api` (the request fields, hooks, :class:`~.api.NodeInfo`, :class:`~.api.Window`), :mod:`.fleet`
(the controller API, admission's view, the node views), :mod:`.lifecycle` (one request's life),
this module (the state and the event loop); each name is imported from the module that defines it.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Callable, Iterable

from inferlb.routing.length import LengthEstimate, LengthPredictor
from inferlb.routing.profiles import Router, build_router
from inferlb.routing.types import Decision, NodeList
from inferlb.simulator.des.admission import Admission, OpenAdmission
from inferlb.simulator.des.api import Controller, PrefillHook, RequestLike, Window
from inferlb.simulator.des.engine import FastSeq
from inferlb.simulator.des.feedback import Feedback
from inferlb.simulator.des.fleet import _READY, _WAKE
from inferlb.simulator.des.kvfeed import KVFeed
from inferlb.simulator.des.lifecycle import SimRequests
from inferlb.simulator.des.lora import LORA_DUE
from inferlb.simulator.des.node import DesNode
from inferlb.simulator.des.prefix import PrefixCaches, PromptInfo
from inferlb.simulator.des.results import DesResults
from inferlb.simulator.presets import SIM_MODEL
from inferlb.simulator.spec import NodeSpec

__all__ = ["Simulation"]


class Simulation(SimRequests):
    """See the module docstring. Nodes named in ``specs`` are ready at ``start``."""

    def __init__(self, specs: Iterable[NodeSpec], *, profile: str = "token-aware", seed: int = 0,
                 router: Router | None = None, admission: Admission | None = None, model: str = SIM_MODEL,
                 scrape_s: float = 5.0, timeout_s: float | None = None, controller: Controller | None = None,
                 control_every_s: float = 60.0, prefill_cached: PrefillHook | None = None,
                 start: float = 0.0, feedback: Feedback | None = None,
                 prompt_of: Callable[[RequestLike], PromptInfo | None] | None = None,
                 default_max_tokens: int = 256, lengths: LengthPredictor | None = None) -> None:
        if scrape_s <= 0 or control_every_s <= 0:
            raise ValueError("scrape_s and control_every_s must be > 0")
        if default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        self.default_max_tokens = default_max_tokens
        self.lengths = lengths
        self._budgets: array[int] = array("l")
        self._estimates: dict[int, tuple[LengthEstimate, str, str | None]] = {}
        if router is None:
            router = build_router(profile, seed=seed)
            # The simulation reads a decision's pick (its scores only when a feedback does): the
            # per-scorer columns wait until read (the same scores, routing/profiles.py).
            router.scores_when_read = True
            fallback = getattr(router, "fallback", None)
            if isinstance(fallback, Router):
                fallback.scores_when_read = True
        self.router = router
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
        # The event-fed prefix index (simulator/des/kvfeed.py), None: routing hashes the prompt only.
        self.kv_feed: KVFeed | None = None
        self.feedback = feedback
        if feedback is not None and not feedback.tick_s > 0:
            raise ValueError("feedback.tick_s must be > 0")
        self._next_tick = start + feedback.tick_s if feedback is not None else math.inf
        self._decisions: dict[int, tuple[Decision, RequestLike]] = {}   # rows in flight, with feedback
        self.now = start
        self.results = DesResults()
        self._nodes: dict[str, DesNode] = {}
        self._views = NodeList([], {}, exact=True)   # a view's models are its node's, as in by_model
        self._dirty: set[DesNode] = set()
        self._slots: dict[str, int] = {}
        self._heap: list[tuple[float, int, int, DesNode]] = []
        self._seq = 0
        self._live: dict[int, tuple[FastSeq, DesNode]] = {}
        self._queued: set[int] = set()
        self._inflight = 0
        # The client timeouts, in row order (rows arrive in time order, each due ``timeout_s``
        # after its arrival, so they fall due in row order too): the next row to check and
        # when it falls due (inf: no row is pending), instead of a queue of (due, row) pairs.
        self._tmo_row = 0
        self._tmo_at = math.inf
        self._next_scrape = start + scrape_s
        self._next_control = start + control_every_s if controller is not None else math.inf
        self._window = Window(start)
        self._set_timers()
        self._reqs: dict[int, RequestLike] = {}     # rows waiting in the gateway queue
        self.events = 0
        self._lora_init()
        self._loading = True     # the initial fleet: one slot count at the end, not one per node
        for spec in specs:
            self.add_node(spec)
        self._loading = False
        self._recount_slots()
    # ------------------------------------------------------------------ the run

    def run(self, requests: Iterable[RequestLike], *, until: float | None = None) -> DesResults:
        """Every request, then the drain: until nothing is in flight (or virtual time ``until``)."""
        limit = math.inf if until is None else until
        last = -math.inf
        heap = self._heap
        for r in requests:
            t = r.t
            if t < last:
                raise ValueError(f"requests must be sorted by t ({t} after {last})")
            if t > limit:
                break
            last = t
            # _until(t) does nothing unless an event or a timer is due by t (the test it makes
            # first, here without the call); admission's timer other than OpenAdmission's is
            # read there.
            if (heap and heap[0][0] <= t) or self._tmo_at <= t or self._timers_at <= t \
                    or type(self.admission) is not OpenAdmission:
                self._until(t)
            self.now = t
            self._arrive(r)
        while (self._live or self._queued or self._reqs_held) and self.now < limit:   # the drain
            nxt = self._next_at()
            if nxt == math.inf or nxt > limit:
                break
            self._until(nxt)
        return self._close_run(last, until)

    def _close_run(self, last: float, until: float | None) -> DesResults:
        """The end of a run: the clock at the last event (or ``until``), the node table recorded."""
        self.now = max(self.now, last) if until is None else min(max(self.now, last), until)
        self.results.end_s = self.now
        for n in self._nodes.values():
            self._record(n)
        return self.results

    def _next_at(self) -> float:
        at = self._heap[0][0] if self._heap else math.inf
        if self._tmo_at < at:
            at = self._tmo_at
        adm = self.admission.next_timer()
        if adm is not None and adm < at:
            at = adm
        if (self._live or self._queued or self._reqs_held) and self._next_scrape < at:
            at = self._next_scrape
        if self._next_control < at:
            at = self._next_control
        if self._next_tick < at:
            at = self._next_tick
        return at

    def _until(self, t: float) -> None:
        """Process every event at or before ``t``.

        The order at equal times is the heap's (node events), then a client timeout, the
        scrape, the controller, the feedback tick and admission's timer: each kind is taken only
        when strictly earlier than the ones before it. The scrape, controller and tick times are
        compared through their minimum first (``_timers_at``, kept by :meth:`_set_timers`): none
        of them can come first while that minimum is not strictly earlier."""
        heap = self._heap
        pop = heapq.heappop
        push = heapq.heappush
        inf = math.inf
        adm_timer = None if type(self.admission) is OpenAdmission else self.admission.next_timer
        while True:  # bounded: each pass consumes an event or a timer
            at = heap[0][0] if heap else inf
            kind = 0
            if self._tmo_at < at:
                at, kind = self._tmo_at, 1
            if self._timers_at < at:
                if self._next_scrape < at:
                    at, kind = self._next_scrape, 2
                if self._next_control < at:
                    at, kind = self._next_control, 3
                if self._next_tick < at:
                    at, kind = self._next_tick, 5
            if adm_timer is not None:
                adm = adm_timer()
                if adm is not None and adm < at:
                    at, kind = adm, 4
            if at > t:
                return
            self.now = at
            self.events += 1
            if kind == 0:
                _, what, _, node = pop(heap)
                if what == _WAKE:
                    if node.wake == at:
                        # The node's engine is due: advance it, settle what ended, schedule
                        # its next event (the event most runs are made of, inlined here:
                        # _settle's completions when nothing failed, then _schedule).
                        node.wake = None
                        core = node.core
                        report = core.advance(at)
                        if report.failed or report.crashed_at is not None:
                            self._settle(node, report)
                        else:
                            for seq in report.finished:
                                self._complete(seq, node)
                        nxt = core.next_event_at()
                        if nxt is not None and nxt != node.wake:
                            node.wake = nxt
                            self._seq += 1
                            push(heap, (nxt, _WAKE, self._seq, node))
                        if node.state == "draining" and node.idle():
                            self._remove(node)
                elif what == LORA_DUE:
                    self._lora_due(node, at)
                elif what == _READY:
                    if node.state == "starting":
                        node.state = "ready"
                        self._changed(node)
                else:
                    self._changed(node)
            elif kind == 1:
                i = self._tmo_row
                self._tmo_row = j = i + 1
                t_col = self.results.t
                tmo_s = self.timeout_s
                assert tmo_s is not None   # a row is pending only with a timeout (_arrive)
                self._tmo_at = t_col[j] + tmo_s if j < len(t_col) else inf
                if self.results.outcome[i] == -1:   # _timeout's own first test: a row already ended
                    self._timeout(i)
            elif kind == 2:
                self._scrape()
                self._set_timers()
            elif kind == 3:
                self._next_control += self.control_every_s
                self._set_timers()
                assert self.controller is not None
                self.controller(self)
                adm_timer = None if type(self.admission) is OpenAdmission else self.admission.next_timer
            elif kind == 5:
                assert self.feedback is not None
                self._next_tick += self.feedback.tick_s
                self._set_timers()
                self.feedback.tick(at)
            else:
                granted, rejected = self.admission.tick(at, self)
                for i, why in rejected:
                    self._reject(i, why)
                for i in granted:
                    self._grant(i)

    def _set_timers(self) -> None:
        """``_timers_at``: the earliest of the scrape, controller and feedback-tick times."""
        self._timers_at = min(self._next_scrape, self._next_control, self._next_tick)

    def _scrape(self) -> None:
        now = self.now
        while self._next_scrape <= now:
            self._next_scrape += self.scrape_s
        for n in self._nodes.values():
            if n.state != "starting":
                n.scrape(now)
                self._dirty.add(n)

