"""LoRA adapters in the discrete-event simulation: the emulator's slot model
(:class:`~inferlb.simulator.lora.AdapterSlots`, one model for both) on each node whose spec has
``lora``, in virtual time.

Contract:

* A request's adapter is its ``adapter`` field (None or absent: a base-model request). Routing
  sees it as ``RouteRequest.adapter`` and the nodes' views carry what a scrape of
  ``vllm:lora_requests_info`` reads (``lora_running``, ``lora_waiting``, ``max_lora``), refreshed
  every ``scrape_s`` as the other metrics are.
* At dispatch to a node with ``lora``, as the emulator's node does it: the request holds its
  adapter's slot; a cold adapter is loaded (``load_s``) and the request reaches the node's engine
  when the load is done; when every slot is held, it waits for one to be released (first come,
  first served), then loads. Meanwhile the gateway counts it in flight on that node. It releases
  the slot when it leaves the node (completed, failed or timed out).
* :meth:`SimLora.lora_totals`: adapter requests, loads (the misses: requests that found their
  adapter neither loaded nor loading), evictions and requests that waited for a slot, over the run.

Not modelled: a client timeout of a request still waiting for its adapter (it ends when it
reaches the engine), an adapter that fails to load (tested on the emulator and the gateway).
"""

from __future__ import annotations

import heapq

from inferlb.simulator.des.api import RequestLike
from inferlb.simulator.des.fleet import SimFleet
from inferlb.simulator.des.node import DesNode

__all__ = ["LORA_DUE", "SimLora"]

LORA_DUE = 3   # node event on the heap: a held request's adapter is ready (after _WAKE, _READY, _UP)


class SimLora(SimFleet):
    """The LoRA part of :class:`~.sim.Simulation` (see the module docstring)."""

    _adapter_of_row: dict[int, str]
    _reqs_held: dict[int, RequestLike]             # rows waiting for their adapter, by row
    _lora_requests: int
    _lora_blocked: int

    def _lora_init(self) -> None:
        self._adapter_of_row = {}
        self._reqs_held = {}
        self._lora_requests = 0
        self._lora_blocked = 0

    def _lora_hold(self, i: int, node: DesNode, adapter: str) -> bool:
        """Take ``adapter``'s slot on ``node`` for row ``i``: False when it is ready now (submit at
        once), True when the row waits for its load or a slot (it is submitted by :meth:`_lora_due`)."""
        slots = node.lora
        assert slots is not None
        self._lora_requests += 1
        self._adapter_of_row[i] = adapter
        now = self.now
        ready = slots.acquire(adapter, now)
        if ready is None:
            slots.block(adapter)
            node.lora_queue.append((i, adapter))
            self._lora_blocked += 1
            return True
        if ready <= now:
            return False
        self._lora_at(node, ready, i)
        return True

    def _lora_at(self, node: DesNode, at: float, i: int) -> None:
        heapq.heappush(node.lora_due, (at, i))
        self._push(at, LORA_DUE, node)

    def _lora_due(self, node: DesNode, at: float) -> None:
        """The heap's ``LORA_DUE`` event: submit the rows whose adapter is ready by ``at``."""
        due = node.lora_due
        while due and due[0][0] <= at:
            _, i = heapq.heappop(due)
            self._lora_start(i, node)

    def _lora_release(self, i: int, node: DesNode) -> None:
        """Row ``i`` left ``node``: free its adapter's slot and let waiting rows take free slots."""
        adapter = self._adapter_of_row.pop(i, None)
        slots = node.lora
        if adapter is None or slots is None:
            return
        slots.release(adapter)
        queue = node.lora_queue
        now = self.now
        while queue:
            j, a = queue[0]
            ready = slots.acquire(a, now)
            if ready is None:
                break
            queue.popleft()
            slots.block(a, -1)
            self._lora_at(node, ready, j)    # through the heap: never inside the engine's own report

    def _lora_start(self, i: int, node: DesNode) -> None:
        """Submit a held row to the node's engine (its in-flight counts were taken at dispatch)."""
        raise NotImplementedError   # SimRequests (lifecycle.py)

    def lora_totals(self) -> dict[str, int]:
        """Adapter requests, loads (misses), evictions and requests that waited for a slot, so far
        (nodes removed during the run included only while they were in the fleet)."""
        loads = evictions = 0
        for n in self._nodes.values():
            if n.lora is not None:
                loads += n.lora.loads
                evictions += n.lora.evictions
        return {"requests": self._lora_requests, "loads": loads, "evictions": evictions,
                "waited_for_slot": self._lora_blocked}
