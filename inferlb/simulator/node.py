"""One emulated OpenAI-compatible GPU server on aiohttp.web (many fit on one event loop).

Contract:

- Inference endpoints (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
  ``/v2/models/{model}/infer``) count in :class:`NodeStats`; probes and ``/sim/*`` do not, so a
  gateway's health checks never disturb attempt counts.
- ``stats.live`` is exact: a request is live from arrival until its handler ends, and a client
  disconnect cancels the handler (``handler_cancellation=True``) so the count drops within one
  event-loop turn of the TCP close, as vLLM aborts a generation when its client goes away.
- Streams send their headers at once (as vLLM's ``StreamingResponse`` does) and the tokens at the
  deadlines of :class:`~inferlb.simulator.latency.TokenSchedule`.
- :meth:`EmulatedNode.stop` behaves like a killed process: it stops listening and aborts every
  open connection, so in-flight requests see a cut and new ones a refused connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import socket
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from inferlb.engine.types import Clock, SystemClock

from . import openai_format as fmt
from .latency import TokenSchedule
from .spec import FaultSpec, NodeSpec
from .stats import MAX_TRACKED_IDS, NodeStats

__all__ = ["EmulatedNode", "NodeStats"]

# A hang or stall lasts until the client or the node goes away; this cap only keeps the wait bounded.
_HANG_CAP_S = 3600.0
_MAX_BODY_BYTES = 16 * 1024 * 1024
_JSON = "application/json"


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


class EmulatedNode:
    """An OpenAI-compatible server emulating ``spec``; ``start()`` / ``stop()`` may be repeated."""

    def __init__(self, spec: NodeSpec, *, clock: Clock | None = None,
                 rng: random.Random | None = None) -> None:
        self.spec = spec
        self.faults: FaultSpec = spec.faults
        self.stats = NodeStats()
        self.host = "127.0.0.1"
        self.port = 0
        self._clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random(spec.name)
        self._latency = spec.latency()
        self._runner: web.AppRunner | None = None
        # Keyed by id(): aiohttp requests are mappings, hence unhashable.
        self._live_requests: dict[int, web.Request] = {}
        self._loading_until = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiters: set[asyncio.Event] = set()

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL (no ``/v1``), e.g. ``http://127.0.0.1:40123``."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def loading(self) -> bool:
        """True while the node reports "loading" (fault or ``startup_s`` after a start)."""
        return self.faults.loading or self._clock.monotonic() < self._loading_until

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (0: a free port, kept for later restarts); no-op if running."""
        if self._runner is not None:
            return
        if self.faults.refuse:
            self.faults = dataclasses.replace(self.faults, refuse=False)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # SO_REUSEADDR lets a restarted node take its old port back despite TIME_WAIT sockets.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port or self.port))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        app = web.Application(client_max_size=_MAX_BODY_BYTES)
        self._add_routes(app)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.SockSite(runner, sock)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            sock.close()
            raise
        self.host, self.port = host, sock.getsockname()[1]
        self._runner = runner
        self._loading_until = self._clock.monotonic() + self.spec.startup_s

    async def stop(self) -> None:
        """Stop like a killed process: close the listener and abort every open connection."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        for request in list(self._live_requests.values()):
            if request.transport is not None:
                request.transport.abort()
        await runner.cleanup()

    async def set_faults(self, faults: FaultSpec) -> None:
        """Replace the fault set; ``refuse=True`` stops the node (see :class:`FaultSpec`)."""
        self.faults = faults
        if faults.refuse:
            await self.stop()

    async def wait_until(self, predicate: Callable[[NodeStats], bool], timeout: float = 2.0) -> None:
        """Return once ``predicate(stats)`` holds; ``TimeoutError`` after ``timeout`` seconds.

        Woken on every arrival and departure, so tests wait for "live back to 0" without polling.
        """
        async with asyncio.timeout(timeout):
            while not predicate(self.stats):  # bounded by the timeout
                event = asyncio.Event()
                self._waiters.add(event)
                try:
                    await event.wait()
                finally:
                    self._waiters.discard(event)

    def _notify(self) -> None:
        for event in self._waiters:
            event.set()

    def reset(self) -> None:
        """Zero the counters and restore the spec's faults (live requests stay counted)."""
        live = self.stats.live
        self.stats = NodeStats(live=live, max_live=live)
        self.faults = self.spec.faults
        self._notify()

    # -- routing ---------------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v2/models/{model}/infer", self._v2_infer)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/sim/stats", self._get_stats)
        app.router.add_get("/sim/faults", self._get_faults)
        app.router.add_post("/sim/faults", self._post_faults)
        app.router.add_post("/sim/reset", self._post_reset)

    def _json(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> web.Response:
        self.stats.statuses[status] += 1
        return web.Response(status=status, body=body, content_type=_JSON, headers=headers)

    def _error(self, status: int, message: str, *, type_: str = "invalid_request_error",
               code: str | None = None, param: str | None = None,
               headers: dict[str, str] | None = None) -> web.Response:
        return self._json(status, fmt.error_body(message, type_=type_, code=code, param=param), headers)

    # -- control and probes (not counted as inference) --------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        if self.loading:
            return web.json_response({"status": "loading", "name": self.spec.name}, status=503)
        return web.json_response({"status": "ok", "name": self.spec.name, "live": self.stats.live})

    async def _models(self, request: web.Request) -> web.Response:
        return web.Response(body=fmt.models_body(self.spec.models, "inferlb-sim"), content_type=_JSON)

    async def _get_stats(self, request: web.Request) -> web.Response:
        return web.json_response({"name": self.spec.name, **self.stats.to_json()})

    async def _get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.to_mapping())

    async def _post_faults(self, request: web.Request) -> web.Response:
        try:
            raw = json.loads(await request.read() or b"{}")
            if not isinstance(raw, dict):
                raise ValueError("the body must be a JSON object")
            faults = FaultSpec.from_mapping(raw)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            return web.json_response({"error": {"message": str(exc), "type": "invalid_request_error"}},
                                     status=400)
        if faults.refuse:
            # Answer first, then stop: stopping here would cut this very response.
            self.faults = faults
            task = asyncio.get_running_loop().create_task(self.stop())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self.faults = faults
        return web.json_response(faults.to_mapping())

    async def _post_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})

    # -- inference ---------------------------------------------------------------------------------

    def _arrive(self, request: web.Request) -> None:
        stats = self.stats
        stats.requests_total += 1
        stats.by_path[request.path] += 1
        stats.last_headers = dict(request.headers)
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        stats.last_peer = f"{peer[0]}:{peer[1]}" if peer else ""
        rid = request.headers.get("x-request-id")
        if rid is not None:
            stats.attempts[rid] = stats.attempts.get(rid, 0) + 1
            stats.attempts.move_to_end(rid)
            if len(stats.attempts) > MAX_TRACKED_IDS:
                stats.attempts.popitem(last=False)
        stats.live += 1
        stats.max_live = max(stats.max_live, stats.live)
        self._live_requests[id(request)] = request
        self._notify()

    def _leave(self, request: web.Request) -> None:
        self.stats.live -= 1
        self._live_requests.pop(id(request), None)
        self._notify()

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        """Count, apply node-level faults and capacity, then run the endpoint; keeps ``live`` exact."""
        self._arrive(request)
        try:
            early = await self._preflight()
            if early is not None:
                return early
            try:
                body = await self._read_json(request)
                if kind in ("chat", "completion"):
                    return await self._generate(request, body, chat=kind == "chat")
                if kind == "embedding":
                    return await self._embed(body)
                return await self._infer_v2(request, body)
            except _BadRequest as exc:
                return self._error(exc.status, exc.message, code=exc.code, param=exc.param)
        except (asyncio.CancelledError, ConnectionResetError):
            # The client went away (or the node was stopped): the generation ends here.
            self.stats.disconnects += 1
            raise
        finally:
            self._leave(request)

    async def _preflight(self) -> web.Response | None:
        faults = self.faults
        if self.loading:
            retry = max(1, math.ceil(self._loading_until - self._clock.monotonic()))
            return self._error(503, "the model is loading", type_="service_unavailable",
                               headers={"Retry-After": str(retry)})
        if faults.hang_before_headers:
            self.stats.faults_injected += 1
            await asyncio.sleep(_HANG_CAP_S)
            return self._error(504, "hang fault ended")
        if faults.status is not None and self._rng.random() < faults.error_rate:
            self.stats.faults_injected += 1
            headers = None
            if faults.retry_after_s is not None:
                headers = {"Retry-After": str(math.ceil(faults.retry_after_s))}
            return self._error(faults.status, f"injected fault: HTTP {faults.status}",
                               type_="server_error" if faults.status >= 500 else "invalid_request_error",
                               headers=headers)
        if self.stats.live > self.spec.max_concurrency:
            self.stats.rejected += 1
            return self._error(429, "too many requests in flight", type_="rate_limit_error",
                               code="rate_limit_exceeded", headers={"Retry-After": "1"})
        return None

    async def _read_json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            raise _BadRequest(400, f"invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise _BadRequest(400, "the body must be a JSON object")
        return body

    def _model_of(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _BadRequest(400, "model is required", param="model")
        if model not in self.spec.models:
            raise _BadRequest(404, f"The model '{model}' does not exist", code="model_not_found",
                              param="model")
        return model

    def _output_tokens(self, body: dict[str, Any]) -> tuple[int, bool]:
        """(tokens to generate, whether the client set the limit)."""
        for key in ("max_completion_tokens", "max_tokens"):
            value = body.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _BadRequest(400, f"{key} must be an integer >= 1", param=key)
            if value > self.spec.max_output_tokens:
                raise _BadRequest(400, f"{key} is over this node's limit of {self.spec.max_output_tokens}",
                                  param=key)
            return value, True
        return self.spec.default_output_tokens, False

    async def _generate(self, request: web.Request, body: dict[str, Any], *,
                        chat: bool) -> web.StreamResponse:
        model = self._model_of(body)
        if chat and not isinstance(body.get("messages"), list):
            raise _BadRequest(400, "messages must be a list", param="messages")
        if not chat and "prompt" not in body:
            raise _BadRequest(400, "prompt is required", param="prompt")
        n, limited = self._output_tokens(body)
        prompt_tokens = fmt.prompt_tokens_of(body, "chat" if chat else "completion")
        schedule = TokenSchedule(self._latency, self._clock, prompt_tokens=prompt_tokens, output_tokens=n)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(self._clock.time())
        finish = "length" if limited else "stop"
        if body.get("stream") is True:
            opts = body.get("stream_options")
            include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
            tmpl = fmt.ChunkTemplate(chat=chat, rid=rid, model=model, created=created,
                                     fingerprint=self.spec.name, include_usage=include_usage)
            return await self._stream(request, tmpl, schedule, finish, include_usage)
        payload = fmt.completion_body(chat=chat, rid=rid, model=model, created=created,
                                      fingerprint=self.spec.name, prompt_tokens=prompt_tokens,
                                      completion_tokens=n, finish_reason=finish)
        return await self._unary(request, payload, schedule)

    async def _unary(self, request: web.Request, payload: bytes,
                     schedule: TokenSchedule) -> web.StreamResponse:
        faults = self.faults
        cut = faults.drop_after_tokens
        if cut is not None and cut < schedule.output_tokens:
            self.stats.faults_injected += 1
            await asyncio.sleep(schedule.delay_s(cut))
            resp = web.StreamResponse(status=200, headers={"Content-Type": _JSON})
            resp.content_length = len(payload)
            self.stats.statuses[200] += 1
            await resp.prepare(request)
            await resp.write(payload[: len(payload) // 2])
            self._cut(request)
            return resp
        stall = faults.stall_after_tokens
        if stall is not None and stall < schedule.output_tokens:
            self.stats.faults_injected += 1
            await asyncio.sleep(schedule.delay_s(stall))
            resp = web.StreamResponse(status=200, headers={"Content-Type": _JSON})
            resp.content_length = len(payload)
            self.stats.statuses[200] += 1
            await resp.prepare(request)
            await asyncio.sleep(_HANG_CAP_S)
            return resp
        await asyncio.sleep(schedule.delay_until_done_s())
        if faults.malformed_sse_at is not None:
            self.stats.faults_injected += 1
            payload = payload[: len(payload) // 2]
        self.stats.completed += 1
        return self._json(200, payload)

    def _cut(self, request: web.Request) -> None:
        """Close the connection mid-body: buffered bytes are flushed, the body is never finished."""
        if request.transport is not None:
            request.transport.close()

    async def _stream(self, request: web.Request, tmpl: fmt.ChunkTemplate, schedule: TokenSchedule,
                      finish: str, include_usage: bool) -> web.StreamResponse:
        faults = self.faults
        resp = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        self.stats.statuses[200] += 1
        await resp.prepare(request)  # headers go out now; the first token comes at the TTFT
        n = schedule.output_tokens
        try:
            for i in range(n):
                await asyncio.sleep(schedule.delay_s(i))
                if i == faults.drop_after_tokens:
                    self.stats.faults_injected += 1
                    self._cut(request)
                    return resp
                if i == faults.stall_after_tokens:
                    self.stats.faults_injected += 1
                    await asyncio.sleep(_HANG_CAP_S)
                    return resp
                if i == faults.error_event_at:
                    self.stats.faults_injected += 1
                    await resp.write(fmt.sse({"error": {"message": "injected in-band error",
                                                        "type": "server_error", "param": None,
                                                        "code": "internal_error"}}))
                    await resp.write_eof()  # a clean end of the body, but no [DONE]
                    return resp
                chunk = tmpl.malformed(i) if i == faults.malformed_sse_at else tmpl.token(i)
                if i == faults.malformed_sse_at:
                    self.stats.faults_injected += 1
                if i == 0 and tmpl.is_chat:
                    chunk = tmpl.role() + chunk
                await resp.write(chunk)
            if faults.drop_after_tokens == n:
                self.stats.faults_injected += 1
                self._cut(request)
                return resp
            tail = tmpl.finish(finish)
            if include_usage:
                tail += tmpl.usage(schedule.prompt_tokens, n)
            await resp.write(tail + tmpl.done())
            await resp.write_eof()
        except ConnectionResetError:
            # The client went away between two tokens; aiohttp will not write to the dead socket.
            self.stats.disconnects += 1
            return resp
        self.stats.completed += 1
        return resp

    async def _embed(self, body: dict[str, Any]) -> web.Response:
        model = self._model_of(body)
        tokens = fmt.prompt_tokens_of(body, "embedding")
        try:
            payload = fmt.embeddings_body(body, model=model, dim=self.spec.embedding_dim)
        except ValueError as exc:
            raise _BadRequest(400, str(exc), param="input") from exc
        await asyncio.sleep(self._latency.ttft_s(tokens))
        self.stats.completed += 1
        return self._json(200, payload)

    async def _infer_v2(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        model = request.match_info["model"]
        if model not in self.spec.models:
            return self._json(404, fmt.dumps({"error": f"model '{model}' is not available"}))
        inputs = body.get("inputs")
        if not isinstance(inputs, list) or not inputs or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("shape"), list)
            and isinstance(t.get("datatype"), str) for t in inputs
        ):
            msg = "inputs must be a list of {name, shape, datatype, data}"
            return self._json(400, fmt.dumps({"error": msg}))
        await asyncio.sleep(self._latency.ttft_s(0))
        # KServe v2 echo: each input comes back as an output of the same name, shape and type.
        outputs = [{"name": t["name"], "shape": t["shape"], "datatype": t["datatype"],
                    "data": t.get("data", [])} for t in inputs]
        out: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": outputs}
        if isinstance(body.get("id"), str):
            out["id"] = body["id"]
        self.stats.completed += 1
        return self._json(200, fmt.dumps(out))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completion")

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "embedding")

    async def _v2_infer(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "v2")

