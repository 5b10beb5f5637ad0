"""Prefill/decode disaggregation in virtual time: colocated serving against prefill/decode pairs,
on the same engine model, to compare them.

Contract: :class:`PdSimulation` runs requests sorted by ``t`` (``PlannedRequest`` of
:mod:`inferlb.bench.loadgen.workload`, or anything with ``t``, ``prompt_tokens``,
``output_tokens`` and optionally ``max_tokens``) over emulated nodes (:class:`~inferlb.simulator.spec.NodeSpec`;
each node's engine is the DES's :class:`~.engine.FastCore`, or a :class:`~.node.FixedCore` without
``batching``) and returns one :class:`PdRow` per request. Same inputs and seed, same rows.

- ``roles`` None: **colocated**. Each request is routed by the gateway's router (``profile``, by
  name, ``token-aware`` by default) to one node, which prefills and decodes it.
- ``roles`` given (node → ``prefill`` | ``decode`` | ``both``): **disaggregated**. Each request's
  pair is picked by :func:`inferlb.routing.disagg.pick_pair` (the gateway's pair pick) over views
  as the gateway keeps them; the prefill node runs the prompt with one output token; when it
  ends, the decode node's KV transfer takes ``spec.kv_transfer.transfer_s(prompt)`` of the decode
  node's spec (off its engine's steps, as in the emulator: simulator/disagg.py), then the decode
  node runs the request with all but the last prompt token already computed (``cached``). A
  request the pair pick serves whole (``colocated``) runs on its decode node as one request.
- The gateway's view: ``inflight_*`` counted on dispatch (the prefill leg: prompt + 1 tokens; the
  decode leg, when it is sent after the prefill: prompt + output budget) and released when the
  leg ends; ``waiting`` / ``kv_usage`` taken every ``scrape_s`` (the health probe's scrape).
- TTFT is the client's: from arrival to the decode leg's first token (the prefill node's one
  token is not sent to the client); TPOT = (e2e − TTFT) ÷ (tokens − 1).
- A request no node has room for waits in the gateway's queue (first come, first served) and is
  routed again whenever a leg ends; its wait is in its TTFT (the gateway's bounded queue,
  admission/, without its limits and shedding).
- Not modelled: admission limits, retries, node faults and crashes, network delay, prefix caches (the
  main :class:`~.sim.Simulation` has them; this one is for the colocated-vs-disaggregated comparison).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inferlb.routing.disagg import pick_pair
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeView, RouteRequest
from inferlb.simulator.des.engine import FastCore, FastSeq
from inferlb.simulator.des.node import FixedCore
from inferlb.simulator.presets import SIM_MODEL
from inferlb.simulator.spec import NodeSpec

__all__ = ["PdRow", "PdSimulation"]

_ARRIVE, _WAKE, _TRANSFER, _SCRAPE = 0, 1, 2, 3


@dataclass(slots=True)
class PdRow:
    """One request's result: ``status`` ``ok`` (``pending``: the run ended first); ``mode`` the
    pair pick's (``colocated`` in a colocated run)."""

    t: float
    prompt_tokens: int
    tokens: int
    status: str = "pending"
    mode: str = "colocated"
    prefill_node: str | None = None
    decode_node: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    transfer_s: float = 0.0

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.tokens - 1)


class _Node:
    __slots__ = ("core", "inflight_requests", "inflight_tokens", "kv_usage", "name", "spec", "waiting", "wakes")

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.core: FastCore | FixedCore = FastCore(spec.batching) if spec.batching is not None else FixedCore(spec)
        self.inflight_requests = 0
        self.inflight_tokens = 0
        self.waiting: int | None = None
        self.kv_usage: float | None = None
        self.wakes: set[float] = set()

    def view(self, models: frozenset[str]) -> NodeView:
        b = self.spec.batching
        return NodeView(name=self.name, models=models, capacity_tokens=b.kv_tokens if b is not None else 32_768,
                        max_concurrency=self.spec.max_concurrency, inflight_requests=self.inflight_requests,
                        inflight_tokens=self.inflight_tokens, waiting=self.waiting, kv_usage=self.kv_usage)


class PdSimulation:
    """See the module docstring."""

    def __init__(self, specs: Iterable[NodeSpec], *, roles: Mapping[str, str] | None = None, seed: int = 0,
                 profile: str = "token-aware", model: str = SIM_MODEL, scrape_s: float = 1.0,
                 default_max_tokens: int = 256, min_prompt_tokens: int = 0) -> None:
        if scrape_s <= 0:
            raise ValueError("scrape_s must be > 0")
        self.nodes = {s.name: _Node(s) for s in specs}
        self.roles = dict(roles) if roles is not None else None
        self.model = model
        self.scrape_s = scrape_s
        self.default_max_tokens = default_max_tokens
        self.min_prompt_tokens = min_prompt_tokens
        self.rng = random.Random(seed)
        self.router = build_router(profile, seed=seed) if roles is None else None
        self._models = {n: frozenset(s.spec.models) for n, s in self.nodes.items()}
        self._heap: list[tuple[float, int, int, Any]] = []
        self._n = 0
        self.now = 0.0
        self.rows: list[PdRow] = []
        self._budget: list[int] = []
        self._legs: dict[int, tuple[str, int]] = {}   # seq tag → (node, tokens counted)
        self._queue: deque[int] = deque()              # rows no node had room for, oldest first

    # ------------------------------------------------------------------ the run

    def run(self, requests: Iterable[Any]) -> list[PdRow]:
        """Every request, then the drain (until nothing is in flight)."""
        last = -math.inf
        for r in requests:
            if r.t < last:
                raise ValueError(f"requests must be sorted by t ({r.t} after {last})")
            last = r.t
            i = len(self.rows)
            declared = getattr(r, "max_tokens", None)
            tokens = r.output_tokens if declared is None else max(1, min(r.output_tokens, declared))
            self.rows.append(PdRow(r.t, r.prompt_tokens, tokens))
            self._budget.append(declared if declared is not None else self.default_max_tokens)
            self._push(r.t, _ARRIVE, i)
        self._push(self.scrape_s, _SCRAPE, None)
        while self._heap:
            t, kind, _, what = heapq.heappop(self._heap)
            if kind == _SCRAPE and not self._legs and all(row.status != "pending" for row in self.rows):
                break
            self.now = t
            if kind == _ARRIVE:
                self._arrive(what)
            elif kind == _WAKE:
                node = self.nodes[what]
                node.wakes.discard(t)
                self._advance(node)
            elif kind == _TRANSFER:
                self._decode(*what)
            else:
                for n in self.nodes.values():
                    n.waiting = len(n.core.waiting)
                    n.kv_usage = round(n.core.usage_at(t), 4)
                self._push(t + self.scrape_s, _SCRAPE, None)
        return self.rows

    def _push(self, t: float, kind: int, what: Any) -> None:
        self._n += 1
        heapq.heappush(self._heap, (t, kind, self._n, what))

    def _views(self) -> list[NodeView]:
        return [n.view(self._models[n.name]) for n in self.nodes.values()]

    def _schedule(self, node: _Node) -> None:
        at = node.core.next_event_at()
        if at is not None and at not in node.wakes:
            node.wakes.add(at)
            self._push(at, _WAKE, node.name)

    def _advance(self, node: _Node) -> None:
        report = node.core.advance(self.now)
        for seq in report.finished:
            self._ended(node, seq)
        self._schedule(node)

    def _submit(self, node: _Node, row: int, leg: int, prompt: int, output: int, counted: int,
                cached: int = 0) -> None:
        self._advance(node)
        tag = row * 2 + leg
        node.core.submit(prompt, output, self.now, cached=cached, tag=tag)
        node.inflight_requests += 1
        node.inflight_tokens += counted
        self._legs[tag] = (node.name, counted)
        self._schedule(node)

    # ------------------------------------------------------------------ one request

    def _arrive(self, i: int) -> None:
        if self._queue or not self._route(i):
            self._queue.append(i)

    def _drain(self) -> None:
        while self._queue and self._route(self._queue[0]):
            self._queue.popleft()

    def _route(self, i: int) -> bool:
        """Dispatch row ``i`` (True) or leave it for the queue (False: no node has room)."""
        row = self.rows[i]
        budget = self._budget[i]
        req = RouteRequest(self.model, row.prompt_tokens, budget)
        views = self._views()
        if self.roles is None:
            assert self.router is not None
            pick = self.router.decide(req, views).pick
            if pick is None:
                return False
            row.decode_node = pick
            self._submit(self.nodes[pick], i, 1, row.prompt_tokens, row.tokens, row.prompt_tokens + budget)
            return True
        pair = pick_pair(req, views, self.roles, rng=self.rng, min_prompt_tokens=self.min_prompt_tokens)
        if pair.decode_node is None:
            return False
        row.mode = pair.mode
        row.decode_node = pair.decode_node
        p = pair.prefill_node
        if p is None:
            self._submit(self.nodes[pair.decode_node], i, 1, row.prompt_tokens, row.tokens,
                         row.prompt_tokens + budget)
            return True
        row.prefill_node = p
        self._submit(self.nodes[p], i, 0, row.prompt_tokens, 1, row.prompt_tokens + 1)
        return True

    def _ended(self, node: _Node, seq: FastSeq) -> None:
        name, counted = self._legs.pop(seq.tag)
        node.inflight_requests -= 1
        node.inflight_tokens -= counted
        i, leg = divmod(seq.tag, 2)
        row = self.rows[i]
        self._drain()
        if leg == 0:   # the prefill leg: the KV moves to the decode node, then it decodes
            assert row.decode_node is not None
            dec = self.nodes[row.decode_node]
            row.transfer_s = dec.spec.kv_transfer.transfer_s(row.prompt_tokens)
            self._push(self.now + row.transfer_s, _TRANSFER, (i, row.decode_node))
            return
        row.status = "ok"
        if seq.first_token_at is not None:
            row.ttft_s = seq.first_token_at - row.t
        row.e2e_s = (seq.finished_at if seq.finished_at is not None else self.now) - row.t

    def _decode(self, i: int, name: str) -> None:
        row = self.rows[i]
        self._submit(self.nodes[name], i, 1, row.prompt_tokens, row.tokens, row.prompt_tokens + self._budget[i],
                     cached=max(0, row.prompt_tokens - 1))
