"""One request, end to end: run its process instance, perform the external tasks (dispatch through
:mod:`upstream`, backoff waits), stream to the client.

The commit point is the first byte sent to the client (docs/reliability.md §5): before it, every
failure completes the ``dispatch`` task as an outcome the process may retry or fall back on;
after it, a failure ends the stream with one SSE error event and no ``[DONE]``. Response headers
are sent only once the node's first body chunk has arrived. A client disconnect cancels the
upstream request (the TCP close is how a model server learns to abort).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from inferlb.config.cluster import default_replica_id
from inferlb.config.settings import NodeConfig, TimeoutConfig
from inferlb.engine.disagg import run_prefill
from inferlb.engine.endpoints import node_path
from inferlb.engine.first_byte import FirstByteBudget
from inferlb.engine.hops import hop_headers
from inferlb.engine.outcomes import node_error
from inferlb.engine.request_ids import new_request_id
from inferlb.engine.scope import IncomingRequest, RequestScope, Runtime, Snapshot, begin_request
from inferlb.engine.sse import SSERelay, extract_usage
from inferlb.engine.streaming import WatchedStreamingResponse
from inferlb.engine.upstream import Upstream, UpstreamResponse
from inferlb.errors import (
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
    WorkflowRuntimeError,
    error_body,
    error_event,
)
from inferlb.jsoncodec import dumps
from inferlb.routing.lifecycle import observe_decision, observe_failure
from inferlb.routing.lora import adapter_failure
from inferlb.routing.reward import observe_reward
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.workflow.base import ExternalCall, Instance
from inferlb.workflow.definition import ProcessDefinition
from inferlb.workflow.spiff import TIMER_OPERATION

__all__ = ["Gateway", "Performer"]

log = logging.getLogger("inferlb.gateway")

Performer = Callable[[RequestScope, ExternalCall], Awaitable[dict[str, Any]]]

_JSON = "application/json"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _error_response(result: dict[str, Any], request_id: str) -> Response:
    headers = {"x-request-id": request_id}
    if result.get("retry_after_s"):
        headers["retry-after"] = str(max(1, round(float(result["retry_after_s"]))))
    return Response(dumps({"error": result["error"]}), status_code=int(result["http_status"]),
                    media_type=_JSON, headers=headers)


class Gateway:
    """Runs requests. One instance per app; all state it mutates lives on the event loop."""

    def __init__(self, rt: Runtime, process: ProcessDefinition, upstream: Upstream,
                 performers: Mapping[str, Performer] | None = None, *, config_version: str = "",
                 hop_id: str | None = None) -> None:
        # What new requests start on; a reload swaps it whole (live/manager.py). A request keeps the
        # snapshot it started with (its scope's ``rt`` and its process instance) until it ends.
        self.snapshot = Snapshot(rt, process, config_version)
        self.upstream = upstream
        # Extra external operations (beyond dispatch and waits), e.g. waiting in an admission
        # queue: ``await performer(scope, call)`` returns the task's result. Wired by app.py.
        self.performers: dict[str, Performer] = dict(performers or {})
        # Per-node first-byte statistics: a hung node costs a few of its usual TTFTs, not first_token_s.
        self.first_byte = FirstByteBudget()
        self._live: set[_Live] = set()     # streams relaying now (stop_streams ends them)
        # This gateway in the hop marker of every request it sends (engine/hops.py).
        self.hop_id = hop_id or default_replica_id()

    @property
    def rt(self) -> Runtime:
        """The runtime new requests start on."""
        return self.snapshot.rt

    @property
    def process(self) -> ProcessDefinition:
        """The request process new requests start on."""
        return self.snapshot.process

    def swap(self, snapshot: Snapshot) -> None:
        """Start new requests on ``snapshot``; those running finish on theirs."""
        self.snapshot = snapshot

    # ------------------------------------------------------------------ entry point

    async def handle(self, req: IncomingRequest, wait_disconnect: Callable[[], Awaitable[None]] | None = None
                     ) -> Response:
        """Run the request's process; returns the response (streaming ones keep running)."""
        snap = self.snapshot
        rt = snap.rt
        scope, data = begin_request(rt, req, engine=snap.process.mode)
        rec = scope.record
        rec.process_version, rec.config_version = snap.process.version or None, snap.config_version or None
        rid = rec.request_id
        # The audit journal's start entry: queued now (AuditUnavailable, 503, when it cannot be),
        # made durable by a group commit that overlaps the node's work; awaited before the first
        # byte of any answer (_journaled), so every x-request-id a client sees has a record.
        scope.journaled = rt.begin(rec)
        inst = snap.process.executor.start(data, scope)
        rec.workflow_path = inst.path
        body_out: bytes | None = None
        closed = _Closed()
        watch = _watch(wait_disconnect, closed) if wait_disconnect is not None else None
        try:
            call = inst.advance()
            while call is not None:
                if call.operation == "upstream/dispatch":
                    res = await self._dispatch(scope, req)
                    if isinstance(res, _Committed):
                        return WatchedStreamingResponse(self._stream(scope, inst, req, res),
                                                        media_type="text/event-stream",
                                                        headers={**_SSE_HEADERS, "x-request-id": rid})
                    outcome, body = res
                    if body is not None:
                        body_out = body
                    inst.complete(outcome)
                elif call.operation in ("clock/wait", TIMER_OPERATION):
                    seconds = max(0.0, min(float(call.params.get("seconds", 0.0)),
                                           scope.deadline_at - rt.clock.monotonic()))
                    await asyncio.sleep(seconds)
                    inst.complete({"seconds": seconds})
                elif call.operation in self.performers:
                    inst.complete(await self.performers[call.operation](scope, call))
                else:
                    raise WorkflowRuntimeError(call.task_id, f"no performer for external operation {call.operation!r}")
                call = inst.advance()
            await _journaled(scope)
        except WorkflowRuntimeError as exc:
            await _journaled(scope)
            return self._workflow_failed(scope, exc)
        except asyncio.CancelledError:
            self._finish_cancelled(scope)
            task = asyncio.current_task()
            if closed.seen and task is not None:
                # Our watcher cancelled us because the client went away: nobody reads this answer.
                task.uncancel()
                return Response(status_code=499)
            raise
        finally:
            if watch is not None:
                watch.cancel()
        result: dict[str, Any] = inst.data["result"]
        if result["status"] == "ok" and body_out is not None:
            return Response(body_out, status_code=200, media_type=_JSON, headers={"x-request-id": rid})
        return _error_response(result, rid)

    # ------------------------------------------------------------------ dispatch (external task)

    def _attempt_timeouts(self, scope: RequestScope, stream: bool, node: str) -> TimeoutConfig:
        """This attempt's timeouts: never past the request deadline; a non-streamed answer gets
        time to generate before its first byte; the first-byte wait is bounded by what ``node``
        usually takes (:class:`FirstByteBudget`)."""
        left = max(0.001, scope.deadline_at - scope.rt.clock.monotonic())
        t = scope.rt.fleet_cfg.timeouts
        output_tokens = scope.output_budget
        first = t.first_token_s if stream else t.first_token_s + output_tokens * t.per_output_token_s
        first = self.first_byte.wait_s(node, stream=stream, output_tokens=output_tokens, configured_s=first,
                                       prompt_tokens=int(scope.record.prompt_tokens_est or 0),
                                       floor_s=t.first_byte_floor_s)
        if left >= t.total_s and first == t.first_token_s:
            return t
        return TimeoutConfig.model_construct(
            connect_s=min(t.connect_s, left), first_token_s=min(first, t.total_s, left),
            idle_s=min(t.idle_s, left), total_s=min(t.total_s, left), per_output_token_s=t.per_output_token_s)

    def _upstream_body(self, scope: RequestScope, req: IncomingRequest, node: NodeConfig | None = None,
                       model: str | None = None, kv: dict[str, Any] | None = None) -> bytes:
        """The body sent to ``node``; ``model``: the upstream model name when the caller has it
        (else :meth:`RequestScope.upstream_model`); ``kv``: a disaggregated decode leg's
        ``kv_transfer_params`` from its prefill leg (``{}``: it answered none)."""
        body = dict(req.body)
        if kv:
            body["kv_transfer_params"] = kv
        if node is not None and node.labels.get("scheduling-policy") == "priority":
            # vLLM --scheduling-policy priority: lower is served first. Set by the gateway, never
            # by the client (a tenant must not raise its own priority on the node).
            body["priority"] = self.rt.admission.node_priority(scope.record.priority)
        if req.endpoint != "predict":
            body["model"] = model if model is not None else scope.upstream_model()
        if req.stream and not req.include_usage and req.endpoint != "responses":
            # Ask for usage so streamed requests are accounted; the usage chunk is not forwarded.
            opts = dict(body.get("stream_options") or {})
            opts["include_usage"] = True
            body["stream_options"] = opts
        return dumps(body)

    async def _dispatch(self, scope: RequestScope, req: IncomingRequest
                        ) -> _Committed | tuple[dict[str, Any], bytes | None]:
        rt = scope.rt
        kv: dict[str, Any] | None = None
        pair = scope.pair
        if pair is not None and pair.prefill_node is not None:
            # Disaggregated: the prefill leg first; its failure is this dispatch's outcome (engine/disagg.py).
            leg = await run_prefill(self, scope, req, pair.prefill_node)
            if isinstance(leg, tuple):
                return leg
            kv = leg
        attempt = scope.begin_attempt()
        node_name = attempt.node
        node = rt.fleet.nodes[node_name].cfg
        tokens = int(scope.record.prompt_tokens_est or 0) + scope.output_estimate   # the load routing counted
        headers = {"content-type": _JSON, "x-request-id": scope.record.request_id,
                   "x-inferlb-attempt": str(scope.attempts), **hop_headers(req.hops, self.hop_id)}
        node_key = node.credential()
        if node_key:
            headers["authorization"] = f"Bearer {node_key}"
        upstream_model = scope.upstream_model()   # once: the path and the body name the same model
        path = node_path(req.endpoint, upstream_model)
        mark = rt.fleet.acquire(node_name, tokens)
        released = False
        now = rt.clock.monotonic()
        timeouts = self._attempt_timeouts(scope, req.stream, node_name)
        cut = _deadline_phases(scope, timeouts, now)
        try:
            resp = await self.upstream.open(
                node.url + path, self._upstream_body(scope, req, node, upstream_model, kv), headers=headers,
                timeouts=timeouts, node=node_name, tls=node.tls)
            attempt.first_byte_at = round(rt.clock.time(), 6)
            if req.stream:
                try:
                    await _journaled(scope)   # before the commit point: headers carry x-request-id
                except BaseException:
                    await resp.aclose()
                    raise
                released = True   # the stream releases it when it ends
                return _Committed(resp, attempt, node_name, tokens, mark, cut)
            try:
                body = await resp.read_rest()
            except BaseException:
                await resp.aclose()   # cancelled (client gone) or failed: never leave it open
                raise
            self._account_body(scope, req, body, node_name, attempt)
            return self._ok_outcome(scope, attempt, node_name), body
        except UpstreamError as exc:
            return self._failed_outcome(scope, attempt, node_name, exc, client_deadline=_cut_by(exc, cut)), None
        finally:
            if not released:
                _charge(scope.record, rt.fleet.release(node_name, tokens, mark))

    def _account_body(self, scope: RequestScope, req: IncomingRequest, body: bytes, node: str,
                      attempt: AttemptRecord) -> None:
        rec = scope.record
        now = round(scope.rt.clock.time(), 6)
        rec.first_byte_at = attempt.first_byte_at
        rec.last_byte_at = now
        try:
            usage = extract_usage(body)
        except UpstreamProtocolError:
            usage = None   # accounting only: a node's odd usage block does not fail the request
        if usage is not None:
            rec.prompt_tokens, rec.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        self._learn(scope, req, node, attempt)

    def _learn(self, scope: RequestScope, req: IncomingRequest, node: str, attempt: AttemptRecord) -> None:
        rec = scope.record
        rt = scope.rt
        if rec.prompt_tokens and req.prompt_bytes and not rt.estimator.wants_text(scope.model):
            rt.estimator.observe(scope.model, req.prompt_bytes, rec.prompt_tokens, req.endpoint)
        ttfb = (attempt.first_byte_at - attempt.started_at) if attempt.first_byte_at is not None else None
        e2e = (rec.last_byte_at - attempt.started_at) if rec.last_byte_at is not None else None
        rt.fleet.report_success(node, stream=req.stream, completion_tokens=rec.completion_tokens or 0,
                                ttfb_s=ttfb, e2e_s=e2e)
        if rt.lengths is not None and rec.completion_tokens is not None and scope.output_estimate > 0:
            # per choice, keyed as request/evaluate estimated it (its prompt estimate, tenant, endpoint)
            rt.lengths.observe(scope.model, prompt_tokens=int(rec.prompt_tokens_est or 0),
                               tokens=rec.completion_tokens // max(1, req.n), tenant=req.tenant, endpoint=req.endpoint,
                               estimate=scope.length_estimate)
        if rt.learner is not None:   # the learned profile's predictor: same times, queued for training
            observe_decision(rt.learner, scope.decision, stream=req.stream,
                             completion_tokens=rec.completion_tokens or 0, ttfb_s=ttfb, e2e_s=e2e)
            observe_reward(rt.router, scope.decision, ok=True, stream=req.stream, ttft_s=ttfb if req.stream else None,
                           e2e_s=e2e, tokens=rec.completion_tokens or 0)
        if ttfb is not None:
            self.first_byte.observe(node, stream=req.stream, ttfb_s=ttfb, completion_tokens=rec.completion_tokens or 0,
                                    prompt_tokens=int(rec.prompt_tokens or rec.prompt_tokens_est or 0))

    def _ok_outcome(self, scope: RequestScope, attempt: AttemptRecord, node: str) -> dict[str, Any]:
        attempt.outcome = "ok"
        attempt.http_status = 200
        attempt.ended_at = round(self.rt.clock.time(), 6)
        scope.record.node = node
        return {"kind": "ok", "status": 200, "error_class": None, "node": node, "retry_after_s": None,
                "tried": list(scope.tried)}

    def _closed_outcome(self, scope: RequestScope, attempt: AttemptRecord) -> dict[str, Any]:
        attempt.outcome = "client_closed"
        attempt.ended_at = round(self.rt.clock.time(), 6)
        scope.record.error_class = "client_closed"
        return {"kind": "client_closed", "status": 499, "error_class": "client_closed", "node": attempt.node,
                "retry_after_s": None, "tried": list(scope.tried)}

    def _failed_outcome(self, scope: RequestScope, attempt: AttemptRecord, node: str,
                        exc: UpstreamError, *, client_deadline: bool = False) -> dict[str, Any]:
        """``client_deadline``: the attempt was cut by the client's own deadline, which is no
        fault of the node: nothing is reported to the fleet (ejection, breaker, interval counts)."""
        rt = scope.rt
        status = exc.status if isinstance(exc, UpstreamStatusError) else None
        retry_after = exc.retry_after_s if isinstance(exc, UpstreamStatusError) else None
        if status == 429:
            wait = retry_after if retry_after is not None else 1.0
            rt.fleet.cool_down(node, wait)
            scope.retry_after_s = wait if scope.retry_after_s is None else min(scope.retry_after_s, wait)
        elif (status is None or status >= 500) and not client_deadline:
            rt.fleet.report_failure(node)
            # the node failed the arm's pick: the reward bandit's failure cost (routing/reward.py)
            observe_reward(rt.router, scope.decision, ok=False, stream=False, ttft_s=None, e2e_s=None,
                           tokens=0)
        if rt.learner is not None and (status is None or status >= 500 or client_deadline):
            # no answer from the pick: the SLO-miss risk's failures, when on (routing/learned.py)
            observe_failure(rt.learner, scope.decision)
        kind = "retryable" if exc.retryable_under(rt.fleet_cfg.retry.retry_on_status) else "fatal"
        if kind == "fatal" and isinstance(exc, UpstreamStatusError) and _adapter_failed(scope, node, exc):
            kind = "retryable"    # that node lacks the adapter, not the request: another node may have it
        scope.deadline_cut = client_deadline
        attempt.outcome = kind
        attempt.http_status = status
        attempt.error_class = exc.error_class if not isinstance(exc, UpstreamTimeout) else f"timeout_{exc.phase}"
        attempt.ended_at = round(rt.clock.time(), 6)
        scope.record.error_class = attempt.error_class
        out: dict[str, Any] = {"kind": kind, "status": status, "error_class": exc.error_class, "node": node,
                               "retry_after_s": retry_after, "tried": list(scope.tried)}
        if kind == "fatal" and isinstance(exc, UpstreamStatusError) and status is not None and status < 500:
            out["node_error"] = node_error(exc.body)   # the engine's own words reach the client
        return out

    # ------------------------------------------------------------------ streaming after the commit point

    async def _stream(self, scope: RequestScope, inst: Instance, req: IncomingRequest, c: _Committed
                      ) -> AsyncIterator[bytes]:
        rt = scope.rt
        rec = scope.record
        resp, attempt = c.resp, c.attempt
        relay = SSERelay(hide_usage=not req.include_usage, responses=req.endpoint == "responses")
        live = _Live(resp)
        self._live.add(live)
        outcome: dict[str, Any] | None = None
        # When the bytes through [DONE] were handed to the server: the client has the whole answer.
        # A client that reads [DONE] and closes at once can be gone before the node's end of body
        # arrives; that close must not turn a complete answer into a 499.
        done_at: float | None = None
        try:
            chunk = resp.first_chunk
            while chunk:   # b"": the end of the body
                try:
                    out = relay.feed(chunk)
                except UpstreamProtocolError:
                    if relay.unsent:
                        yield relay.unsent
                    raise
                if out:
                    if rec.first_byte_at is None:
                        rec.first_byte_at = round(rt.clock.time(), 6)
                    yield out
                    if relay.done and done_at is None:
                        done_at = round(rt.clock.time(), 6)
                chunk = await resp.next_chunk()
            last = relay.finish()
            if last:
                yield last
            if live.stopped is not None:
                raise UpstreamProtocolError("the stream was stopped")   # closed by stop_streams
            if relay.incomplete or not relay.done:
                raise UpstreamProtocolError("the stream ended without [DONE]")
            rec.last_byte_at = round(rt.clock.time(), 6)
            self._count_tokens(rec, relay)
            self._learn(scope, req, c.node, attempt)
            outcome = self._ok_outcome(scope, attempt, c.node)
        except UpstreamError as exc:
            rec.last_byte_at = round(rt.clock.time(), 6)
            self._count_tokens(rec, relay)
            if live.stopped is not None:
                error_class = live.stopped
                message = "The gateway is shutting down; the response is incomplete"
            else:
                if not _cut_by(exc, c.deadline_phases):   # the client's deadline is not the node's fault
                    rt.fleet.report_failure(c.node)
                error_class = f"midstream_{exc.error_class}"
                message = "The model server failed mid-stream; the response is incomplete"
            attempt.outcome = "midstream_error"
            attempt.error_class = error_class
            attempt.ended_at = rec.last_byte_at
            rec.error_class = error_class
            rec.node = c.node
            outcome = {"kind": "midstream_error", "status": 200, "error_class": error_class, "node": c.node,
                       "retry_after_s": None, "tried": list(scope.tried)}
            yield error_event(message, "server_error", error_class if live.stopped is not None else "upstream_error")
        finally:
            self._live.discard(live)
            _charge(rec, rt.fleet.release(c.node, c.tokens, c.mark))
            await resp.aclose()
            if outcome is None and done_at is not None and live.stopped is None:
                # cancelled after [DONE] went out (waiting for the node's end of body): complete
                rec.last_byte_at = done_at
                self._count_tokens(rec, relay)
                self._learn(scope, req, c.node, attempt)
                outcome = self._ok_outcome(scope, attempt, c.node)
                attempt.ended_at = done_at
            if outcome is None:   # cancelled: the client went away
                rec.last_byte_at = round(rt.clock.time(), 6)
                self._count_tokens(rec, relay)
                outcome = self._closed_outcome(scope, attempt)
            self._complete_after_commit(scope, inst, outcome)

    @staticmethod
    def _count_tokens(rec: RequestRecord, relay: SSERelay) -> None:
        """Completion tokens: the node's usage when it sent one, else the content events relayed."""
        if relay.usage is not None:
            rec.prompt_tokens = relay.usage.prompt_tokens
            rec.completion_tokens = relay.usage.completion_tokens
        elif rec.completion_tokens is None and relay.content_events:
            rec.completion_tokens = relay.content_events

    def stop_streams(self, reason: str = "server_shutting_down") -> int:
        """End every stream still relaying: each client gets one SSE error event with code
        ``reason`` (no ``[DONE]``), and its audit record the tokens sent so far and error class
        ``reason``. Returns how many streams were stopped. For the end of a drain."""
        stopped = 0
        for live in list(self._live):
            if live.stopped is None:
                live.stopped = reason
                live.resp.close()   # wakes the relay's pending read with an error
                stopped += 1
        return stopped

    def _complete_after_commit(self, scope: RequestScope, inst: Instance, outcome: dict[str, Any]) -> None:
        """Finish the instance after the commit point; no further dispatch is possible."""
        try:
            inst.complete(outcome)
            call = inst.advance()
            if call is not None:
                raise WorkflowRuntimeError(call.task_id, "the process asked for more work after the response "
                                                         "was committed; ignored")
        except WorkflowRuntimeError as exc:
            log.error("request %s: %s", scope.record.request_id, exc)
            self._submit_failed(scope, exc)

    # ------------------------------------------------------------------ failures of the engine itself

    def _submit_failed(self, scope: RequestScope, exc: WorkflowRuntimeError) -> None:
        rec = scope.record
        if rec.status in ("unknown",):
            rec.status = "workflow_error"
            rec.http_status = rec.http_status or 500
            rec.error_class = "workflow_error"
            rec.tags = {**rec.tags, "workflow_error": str(exc)[:500]}
            self.rt.on_request_end(rec)

    def reject(self, endpoint: str, model: str, status: int, code: str | None, tenant: str | None = None,
               tags: dict[str, Any] | None = None) -> str:
        """Audit a request rejected before its process started (invalid input); returns its id.
        ``model`` is stored as given: the API layer bounds it (api/labels.py)."""
        rid = new_request_id()
        now = round(self.rt.clock.time(), 6)
        self.rt.on_request_end(RequestRecord(request_id=rid, received_at=now, endpoint=endpoint,
                                     model_requested=model[:256], tenant=tenant, status="rejected_invalid",
                                     http_status=status, error_class=code or "invalid_request",
                                     last_byte_at=now, engine=self.process.mode, tags=tags or {}))
        return rid

    def _workflow_failed(self, scope: RequestScope, exc: WorkflowRuntimeError) -> Response:
        log.error("request %s: workflow error: %s", scope.record.request_id, exc)
        self._submit_failed(scope, exc)
        result = {"http_status": 500, "retry_after_s": None,
                  **error_body("The gateway's request process failed; see the audit record", "server_error",
                               "workflow_error")}
        return _error_response(result, scope.record.request_id)

    def _finish_cancelled(self, scope: RequestScope) -> None:
        rec = scope.record
        if rec.attempts and rec.attempts[-1].ended_at is None:
            self._closed_outcome(scope, rec.attempts[-1])
        if rec.status == "unknown":
            rec.status = "client_closed"
            rec.http_status = 499
            rec.error_class = "client_closed"
            rec.last_byte_at = round(self.rt.clock.time(), 6)
            self.rt.on_request_end(rec)


def _deadline_phases(scope: RequestScope, timeouts: TimeoutConfig, now: float) -> frozenset[str]:
    """The timeout phases of an attempt started at ``now`` (monotonic) that the client's deadline
    set: the request has a deadline shorter than the configured total (``x-inferlb-deadline-ms`` or
    its priority class's) and the phase's limit reaches it. An ``idle`` timeout is never one: it
    runs from each read, and the upstream reports a wait that reaches the deadline as ``total``."""
    total = scope.rt.fleet_cfg.timeouts.total_s
    if scope.deadline_at >= scope.received_mono + total:
        return frozenset()   # the gateway's own total timeout: a node too slow for it is at fault
    # 1 ms: the limits were computed from a clock reading taken a moment after ``now``.
    reach = scope.deadline_at - now - 0.001
    return frozenset(p for p, limit in (("connect", timeouts.connect_s), ("first_token", timeouts.first_token_s),
                                        ("total", timeouts.total_s)) if limit >= reach)


def _cut_by(exc: UpstreamError, phases: frozenset[str]) -> bool:
    """Whether ``exc`` is a timeout of one of ``phases`` (see :func:`_deadline_phases`)."""
    return isinstance(exc, UpstreamTimeout) and exc.phase in phases


def _charge(rec: RequestRecord, cost: float) -> None:
    """Add one attempt's cost (cost.py's rule, as the cost ledger charges it) to the record:
    every attempt is charged for what it occupied, whatever its outcome."""
    if cost > 0:
        rec.cost_est = round((rec.cost_est or 0.0) + cost, 9)


async def _journaled(scope: RequestScope) -> None:
    """Wait (once) until the request's start entry is in the audit write-ahead log. A log that
    cannot be written is the writer's to report (readiness, 503 for new requests); this request,
    already under way, is answered."""
    pending, scope.journaled = scope.journaled, None
    if pending is not None:
        await pending


class _Closed:
    """Set by the disconnect watcher before it cancels the request's task."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False


def _watch(wait_disconnect: Callable[[], Awaitable[None]], closed: _Closed) -> asyncio.Task[None]:
    """One task per request that cancels the handler when the client disconnects before the
    response starts (docs/reliability.md §5.1: the first-chunk wait must be cancellable). Cheaper than
    racing every await against the connection: one task instead of two per wait."""
    handler = asyncio.current_task()

    async def watch() -> None:
        await wait_disconnect()
        closed.seen = True
        if handler is not None:
            handler.cancel()

    return asyncio.ensure_future(watch())


@dataclass
class _Committed:
    """A 2xx stream whose first chunk has arrived: the next byte goes to the client."""

    resp: UpstreamResponse
    attempt: AttemptRecord
    node: str
    tokens: int
    mark: float                 # the attempt's cost mark (Fleet.acquire)
    deadline_phases: frozenset[str] = frozenset()   # timeouts the client's deadline set (_deadline_phases)


class _Live:
    """A stream relaying now; ``stopped`` is the reason :meth:`Gateway.stop_streams` gave."""

    __slots__ = ("resp", "stopped")

    def __init__(self, resp: UpstreamResponse) -> None:
        self.resp = resp
        self.stopped: str | None = None


def _adapter_failed(scope: RequestScope, node: str, exc: UpstreamStatusError) -> bool:
    """Whether ``node``'s error answer says the request's LoRA adapter failed to load there
    (routing/lora.py ``adapter_failure``); if so the node is marked for that adapter only, for the
    model's ``lora.failure_cooldown_s`` (fleet/state.py ``adapter_failed``)."""
    model = scope.rt.fleet.models.get(scope.model)
    if model is None or model.lora is None:
        return False
    adapter = scope.upstream_model()
    said = node_error(exc.body)
    if not adapter_failure(exc.status, said["message"] if said is not None else None, adapter):
        return False
    scope.rt.fleet.adapter_failed(node, adapter, model.lora.failure_cooldown_s)
    return True
