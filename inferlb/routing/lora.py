"""LoRA-adapter affinity: the ``lora-available`` filter and the ``lora-affinity`` scorer (pure).

A request for a model served as a LoRA adapter (config/lora.py) carries ``RouteRequest.adapter``:
the name vLLM serves the adapter under, which is the ``model`` the node is asked for. Each node's
view carries what vLLM's ``vllm:lora_requests_info`` gauge says (health/prometheus.py): the
adapters of its running requests (``lora_running``), of its queued ones (``lora_waiting``) and
its GPU adapter slots (``max_lora``); and the adapters that failed to load on it and are cooling
down (``lora_failed``, fleet/state.py).

* ``lora-available`` (filter): drops a node whose ``lora_failed`` holds the request's adapter, with
  the reason in the decision. An adapter failure marks that node for that adapter only: the node
  keeps serving its other models and adapters. No-op for a request without an adapter.
* ``lora-affinity`` (scorer), the order the Gateway API Inference Extension's LoRA affinity scorer
  uses: the adapter running on the node (``running``, 1.0) > queued there (``waiting``, 0.8; it
  is being loaded or waits for a slot) > the node has a free adapter slot
  (``len(running ∪ waiting) < max_lora``: ``free_slot``, 0.5) > every slot is taken by other
  adapters (``full``, 0.0: loading it waits for one of them to drain, then evicts one). A node
  that does not report the gauge scores ``unknown`` (0.5, as a free slot: neither favoured nor
  punished). A request without an adapter scores 1.0 everywhere (the scorer changes no ranking).
* Hot adapters spread: a node that has the adapter but is *saturated* (its queue at
  ``saturated_waiting`` requests or more, or its KV cache at ``saturated_kv`` or more, or its
  gateway-side requests at its concurrency limit, or, with ``spread_on_slot_wait`` (off by
  default: on the train seeds of benchmarks/lora_des.py it lowered TTFT p99 in some settings and
  raised it in others, docs/benchmarks.md), running adapters hold every slot while other adapters
  wait there for one) scores ``free_slot``, not ``running``: the load
  scorers then decide between it and a node with a free slot, so a popular adapter is loaded on a
  second node instead of queueing behind the first.

:func:`adapter_failure` says whether a node's error answer means the adapter could not be served
there: vLLM answers 404 ``The model `X` does not exist.`` (``NotFoundError``) for an adapter it does
not have or its LoRA resolver could not load, and 400 (``BadRequestError``) when loading it failed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from inferlb.routing.types import Elimination, NodeView, RouteRequest

__all__ = ["LoraAffinity", "LoraAffinityParams", "LoraAvailable", "adapter_failure", "lora_state"]


class _NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraAvailable:
    """Drops the nodes where the request's adapter failed to load (``NodeView.lora_failed``)."""

    type_name = "lora-available"
    Params = _NoParams

    def __init__(self, params: _NoParams | None = None) -> None:
        pass

    def apply(self, req: RouteRequest, nodes: list[NodeView]) -> tuple[list[NodeView], list[Elimination]]:
        adapter = req.adapter
        if adapter is None:
            return nodes, []
        kept: list[NodeView] = []
        out: list[Elimination] = []
        for n in nodes:
            if adapter in n.lora_failed:
                out.append(Elimination(n.name, self.type_name,
                                       f"LoRA adapter {adapter!r} failed to load here (cooling down)"))
            else:
                kept.append(n)
        return (nodes if not out else kept), out


class LoraAffinityParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    running: float = Field(1.0, ge=0, le=1)
    waiting: float = Field(0.8, ge=0, le=1)
    free_slot: float = Field(0.5, ge=0, le=1)
    full: float = Field(0.0, ge=0, le=1)
    unknown: float = Field(0.5, ge=0, le=1)
    saturated_waiting: int = Field(4, ge=1)      # queued requests at which a node counts as saturated
    saturated_kv: float = Field(0.9, gt=0, le=1)  # KV-cache use at which it does
    spread_on_slot_wait: bool = False             # ... and when other adapters wait there for a slot


def lora_state(adapter: str, node: NodeView) -> str:
    """Where ``adapter`` stands on ``node``: ``running``, ``waiting``, ``free_slot``, ``full`` or
    ``unknown`` (the node reports no adapter gauge), as the scorer reads it (saturation aside)."""
    if adapter in node.lora_running:
        return "running"
    if adapter in node.lora_waiting:
        return "waiting"
    if node.max_lora is None:
        return "unknown"
    return "free_slot" if len(node.lora_running | node.lora_waiting) < node.max_lora else "full"


class LoraAffinity:
    """Prefer nodes that have the request's adapter, then those that can load it; see the module
    docstring. Reads ``lora_running``, ``lora_waiting``, ``max_lora``, ``waiting``, ``kv_usage``,
    ``inflight_requests`` and ``max_concurrency``."""

    type_name = "lora-affinity"
    Params = LoraAffinityParams

    def __init__(self, params: LoraAffinityParams | None = None) -> None:
        self.p = params or LoraAffinityParams()

    def _saturated(self, node: NodeView) -> bool:
        p = self.p
        return ((node.waiting is not None and node.waiting >= p.saturated_waiting)
                or (node.kv_usage is not None and node.kv_usage >= p.saturated_kv)
                or node.inflight_requests >= node.max_concurrency
                or (p.spread_on_slot_wait and node.max_lora is not None and len(node.lora_running) >= node.max_lora
                    and not node.lora_waiting <= node.lora_running))

    def score(self, req: RouteRequest, node: NodeView) -> float:
        adapter = req.adapter
        if adapter is None:
            return 1.0
        state = lora_state(adapter, node)
        p = self.p
        if state in ("running", "waiting") and self._saturated(node):
            return p.free_slot
        return float(getattr(p, state))

    def score_all(self, req: RouteRequest, nodes: list[NodeView]) -> list[float]:
        if req.adapter is None:
            return [1.0] * len(nodes)
        score = self.score
        return [score(req, n) for n in nodes]


def adapter_failure(status: int | None, message: str | None, adapter: str) -> bool:
    """Whether a node's answer (HTTP ``status``, the error ``message`` it sent) says ``adapter``
    cannot be served there: a 404 whose message names the adapter or says a model does not exist,
    or a 400 that speaks of loading a LoRA adapter (vLLM's words, see the module docstring). Any
    other answer is about the request or the node, not the adapter."""
    if not message:
        return False
    text = message.lower()
    if status == 404:
        return "does not exist" in text or adapter.lower() in text
    if status == 400:
        return ("lora" in text or "adapter" in text) and ("load" in text or adapter.lower() in text)
    return False
