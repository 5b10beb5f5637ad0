"""The simulation's fleet: the controller API (add, drain, remove a node; read the nodes and the
window), admission's :class:`~.admission.Pools` view, the gateway's node views routing reads, and
the node event heap.

Contract: :meth:`SimFleet.add_node` puts a node in now (traffic after ``cold_start_s``; a name
already in the fleet is a ValueError), :meth:`SimFleet.drain_node` stops routing to it (removed
once idle), :meth:`SimFleet.remove_node` removes it at once (what runs on it fails). A node state
change rebuilds its view lazily (before the next routing decision) and recounts the pools' slots.
The base of :class:`~.sim.Simulation`, which holds the state (declared here) and the event loop;
:mod:`.lifecycle` settles the requests.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

from inferlb.routing.length import LengthEstimate, LengthPredictor
from inferlb.routing.profiles import Router
from inferlb.routing.types import Decision, NodeList, NodeView
from inferlb.simulator.des.admission import Admission
from inferlb.simulator.des.api import Controller, NodeInfo, PrefillHook, RequestLike, Window
from inferlb.simulator.des.engine import FastSeq
from inferlb.simulator.des.feedback import Feedback
from inferlb.simulator.des.kvfeed import KVFeed
from inferlb.simulator.des.node import DesNode
from inferlb.simulator.des.prefix import PromptInfo
from inferlb.simulator.des.results import DesResults, NodeRecord
from inferlb.simulator.spec import NodeSpec

__all__ = ["SimFleet"]

_WAKE, _READY, _UP = 0, 1, 2    # node events on the heap: the engine's next step, cold start over, crash over


class SimFleet:
    """The fleet part of :class:`~.sim.Simulation` (its state is declared here, set by its ``__init__``)."""

    router: Router
    admission: Admission
    model: str
    scrape_s: float
    timeout_s: float | None
    controller: Controller | None
    control_every_s: float
    prefill_cached: PrefillHook | None
    prompt_of: Callable[[RequestLike], PromptInfo | None] | None
    kv_feed: KVFeed | None
    feedback: Feedback | None
    lengths: LengthPredictor | None
    default_max_tokens: int
    now: float
    results: DesResults
    events: int
    _next_tick: float
    _decisions: dict[int, tuple[Decision, RequestLike]]
    _nodes: dict[str, DesNode]
    _views: NodeList
    _dirty: set[DesNode]
    _slots: dict[str, int]
    _heap: list[tuple[float, int, int, DesNode]]
    _seq: int
    _live: dict[int, tuple[FastSeq, DesNode]]
    _queued: set[int]
    _inflight: int
    _tmo_row: int                              # the next row whose client timeout is checked
    _tmo_at: float                             # when it falls due (inf: none pending)
    _next_scrape: float
    _next_control: float
    _window: Window
    _reqs: dict[int, RequestLike]
    _budgets: array[int]                       # per row: the output budget the gateway counts
    _estimates: dict[int, tuple[LengthEstimate, str, str | None]]   # rows in flight: estimate, model, tenant
    _loading: bool

    if TYPE_CHECKING:   # defined by SimRequests (lifecycle.py), which settles a lost request
        def _lost(self, seq: FastSeq, node: DesNode, why: str) -> None: ...

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
        self._place(node)
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
        self._views = NodeList([], {}, exact=True)   # a view's models are its node's, as in by_model
        for n in keep:
            self._place(n)
        self._recount_slots()

    def _place(self, node: DesNode) -> None:
        """Append ``node``'s view to the views and to its models' lists, and keep on the node
        where it went (``pos``, ``mpos``: the list of each model and the index in it), so that a
        rebuilt view replaces it there without a look-up by name."""
        views = self._views
        node.pos = len(views)
        views.append(node.view)
        mpos: list[tuple[list[NodeView], int]] = []
        for m in sorted(node.models):
            lst = views.by_model.setdefault(m, [])
            mpos.append((lst, len(lst)))
            lst.append(node.view)
        node.mpos = mpos

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

    # ------------------------------------------------------------------ the node event heap and views

    def _push(self, at: float, what: int, node: DesNode) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, what, self._seq, node))

    def _schedule(self, node: DesNode) -> None:
        at = node.core.next_event_at()
        if at is not None and at != node.wake:
            node.wake = at
            self._seq += 1
            heapq.heappush(self._heap, (at, _WAKE, self._seq, node))

    def _refresh_views(self) -> None:
        dirty = self._dirty
        if not dirty:
            return
        now = self.now
        views = self._views
        for n in dirty:
            v = n.build_view(now)
            n.view = v
            views[n.pos] = v
            for lst, j in n.mpos:
                lst[j] = v
        dirty.clear()
