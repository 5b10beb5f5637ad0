"""One request's life in the simulation: arrival and admission, routing and dispatch to a node's
engine, completion, failure, client timeout, and the feedback it reports.

Contract: every admitted request ends exactly once (``ok``, ``failed``, ``timeout`` or
``no_node``; ``rejected`` if admission refuses it) in the results and the current window, releases
its admission slot (which may grant queued requests) and, with a ``feedback``, is reported to it
with its routing decision and the node's own times. The client sees the node's network delay on
its TTFT and e2e. The middle of :class:`~.sim.Simulation` (over :class:`~.fleet.SimFleet`).
"""

from __future__ import annotations

import math

from inferlb.routing.length import LengthEstimate
from inferlb.routing.prefix import block_hashes, text_key
from inferlb.routing.types import RouteRequest
from inferlb.simulator.des.admission import ADMIT, QUEUE, OpenAdmission
from inferlb.simulator.des.api import RequestLike
from inferlb.simulator.des.engine import RUNNING, CoreReport, FastSeq
from inferlb.simulator.des.feedback import Finished
from inferlb.simulator.des.fleet import _UP
from inferlb.simulator.des.lora import SimLora
from inferlb.simulator.des.node import DesNode
from inferlb.simulator.des.prefix import PrefixCaches
from inferlb.simulator.des.results import FAILED, NO_NODE, OK, OUTCOMES, REJECTED, TIMEOUT

__all__ = ["SimRequests"]


class SimRequests(SimLora):
    """The request part of :class:`~.sim.Simulation`."""

    # ------------------------------------------------------------------ one request

    def _budget_of(self, r: RequestLike) -> tuple[int, LengthEstimate | None]:
        """The output budget the gateway counts for ``r``, from what it declares and the gateway's
        history only (see the ``Simulation`` docstring): never ``r.output_tokens``."""
        declared: int | None = getattr(r, "max_tokens", None)
        lengths = self.lengths
        if lengths is None:
            return (declared if declared is not None else self.default_max_tokens), None
        est = lengths.estimate(r.model or self.model, prompt_tokens=r.prompt_tokens, declared=declared,
                               default=self.default_max_tokens, tenant=getattr(r, "tenant", None))
        return est.budget, est

    def _arrive(self, r: RequestLike) -> None:
        res = self.results
        declared: int | None = getattr(r, "max_tokens", None)
        # What the node will write: the model's answer, cut at a declared max_tokens (the node's own state).
        out = r.output_tokens
        answer = out if declared is None or declared >= out else max(1, declared)
        prompt = r.prompt_tokens
        t = r.t
        i = res.add(t, prompt, answer, r.stream, r.priority)
        if self.lengths is None:   # _budget_of without an estimate: the declared budget, else the default
            budget = declared if declared is not None else self.default_max_tokens
        else:
            budget, est = self._budget_of(r)
            if est is not None:
                self._estimates[i] = (est, r.model or self.model, getattr(r, "tenant", None))
        self._budgets.append(budget)
        w = self._window
        w.arrivals += 1
        w.prompt_tokens += prompt
        w.output_tokens += budget
        timeout_s = self.timeout_s
        if timeout_s is not None and self._tmo_row == i:   # no earlier row pending: this one is next
            self._tmo_at = t + timeout_s
        adm = self.admission
        if type(adm) is OpenAdmission and adm.max_inflight is None:
            self._inflight += 1     # OpenAdmission.admit without a cap: admitted
            self._dispatch(i, r)
            return
        verdict = adm.admit(i, r.model or self.model, r.priority, self.now, self)
        if verdict.kind == ADMIT:
            self._inflight += 1
            self._dispatch(i, r)
        elif verdict.kind == QUEUE:
            self._queued.add(i)
            self._reqs[i] = r
        else:
            self._estimates.pop(i, None)
            res.finish(i, REJECTED, reason=verdict.reason)
            w.rejected += 1

    def _dispatch(self, i: int, r: RequestLike) -> None:
        if self._dirty:
            self._refresh_views()
        now = self.now
        res = self.results
        res.queue[i] = now - r.t
        prompt, output = r.prompt_tokens, res.output_tokens[i]   # the answer: only the node's engine reads it
        budget = self._budgets[i]                                # what the gateway knows of it
        adapter: str | None = getattr(r, "adapter", None)
        if self.router.prefix_blocks and self.prompt_of is not None:
            req = self._prompt_request(r, prompt, budget, adapter, now)
        else:
            # RouteRequest.build: RouteRequest(...)'s request, cheaper to call with keywords
            # (routing/types.py); no prompt blocks, session or KV hits: their defaults.
            req = RouteRequest.build(r.model or self.model, prompt, budget, r.priority, stream=r.stream,
                                     adapter=adapter)
        d = self.router.decide(req, self._views)
        name = d.pick
        feed = self.kv_feed
        if feed is not None and name is not None:
            feed.sent(name, req.kv_blocks, now)
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
        if adapter is not None and node.lora is not None and self._lora_hold(i, node, adapter):
            # Waits for its adapter (load or slot, .lora): in flight on the node for the gateway already.
            self._reqs_held[i] = r
            node.inflight_requests += 1
            node.inflight_tokens += prompt + budget
            node.served += 1
            self._dirty.add(node)
            return
        self._advance(node, now)
        cached = self.prefill_cached(i, r, node) if self.prefill_cached is not None else 0
        seq = core.submit(prompt, output, now, cached=cached, tag=i)
        self._live[i] = (seq, node)
        node.inflight_requests += 1
        node.inflight_tokens += prompt + budget     # the gateway's count (Fleet.acquire): the budget it knows
        node.served += 1
        self._dirty.add(node)
        self._schedule(node)

    def _prompt_request(self, r: RequestLike, prompt: int, budget: int, adapter: str | None,
                        now: float) -> RouteRequest:
        """The request routing reads when the router reads prompt blocks: the text's block hashes,
        its session's key and, with a KV feed, the indexed hits (see the ``Simulation`` docstring)."""
        assert self.prompt_of is not None
        prefix: tuple[int, ...] = ()
        session: int | None = None
        kv_hits: tuple[tuple[str, int], ...] | None = None
        kv_blocks = 0
        kv_fallback: str | None = None
        feed = self.kv_feed
        info = self.prompt_of(r)
        if info is not None:
            if info.text:
                prefix = block_hashes(info.text, self.router.prefix_blocks)
                if feed is not None:
                    kv_hits, kv_blocks, kv_fallback = feed.route_inputs(
                        info.text, (v.name for v in self._views), now)
            if info.session:
                session = text_key(info.session)
        return RouteRequest.build(r.model or self.model, prompt, budget, r.priority, stream=r.stream, prefix=prefix,
                                  session=session, adapter=adapter, kv_hits=kv_hits, kv_blocks=kv_blocks,
                                  kv_fallback=kv_fallback)

    def _lora_start(self, i: int, node: DesNode) -> None:
        r = self._reqs_held.pop(i)
        now = self.now
        self._advance(node, now)
        cached = self.prefill_cached(i, r, node) if self.prefill_cached is not None else 0
        seq = node.core.submit(r.prompt_tokens, self.results.output_tokens[i], now, cached=cached, tag=i)
        self._live[i] = (seq, node)
        self._schedule(node)

    def _advance(self, node: DesNode, at: float) -> None:
        """Run ``node``'s engine to ``at`` and settle what ended."""
        core = node.core
        nxt = core.next_event_at()
        if nxt is None or nxt > at:
            return   # nothing of the engine's is due by ``at``: its advance would do nothing
        self._settle(node, core.advance(at))

    def _settle(self, node: DesNode, report: CoreReport) -> None:
        """What ``node``'s engine reported from an advance: finished and lost requests, a crash."""
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
        if node.lora is not None:
            self._lora_release(i, node)
        node.inflight_requests -= 1
        node.inflight_tokens -= seq.prompt + self._budgets[i]
        self._dirty.add(node)
        self._inflight -= 1
        got = self._estimates.pop(i, None)
        if ok and got is not None and self.lengths is not None:   # the gateway's own history: tokens it counted
            est, model, tenant = got
            self.lengths.observe(model, prompt_tokens=seq.prompt, tokens=seq.output, tenant=tenant, estimate=est)
        if isinstance(self.prefill_cached, PrefixCaches):
            self.prefill_cached.finished(i, seq.output if ok else None)
        adm = self.admission
        if type(adm) is not OpenAdmission:   # OpenAdmission.release grants nothing
            for j in adm.release(i, self.now, ok, self):
                self._grant(j)

    def _end(self, i: int, outcome: int, *, node: int = -1, reason: str) -> None:
        """An admitted request that never reached a node engine."""
        self._estimates.pop(i, None)
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
        self._estimates.pop(i, None)
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
            self._estimates.pop(i, None)
            res.finish(i, TIMEOUT, reason="the client gave up in the gateway queue (timeout_s)")
            res.queue[i] = self.now - res.t[i]
            self._window.failed += 1
            for j in self.admission.release(i, self.now, False, self):
                self._grant(j)
