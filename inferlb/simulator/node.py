"""One emulated OpenAI-compatible GPU server on aiohttp.web (many fit on one event loop).

Contract:

- Inference endpoints (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
  ``/v1/responses`` (:mod:`.responses`), ``/v2/models/{model}/infer``) count in
  :class:`NodeStats`; probes and ``/sim/*`` do not, so a gateway's health checks never disturb
  attempt counts.
- ``stats.live`` is exact: a request is live from arrival until its handler ends, and a client
  disconnect cancels the handler (``handler_cancellation=True``) so the count drops within one
  event-loop turn of the TCP close, as vLLM aborts a generation when its client goes away.
- Streams send their headers at once (as vLLM's ``StreamingResponse`` does) and the tokens at the
  deadlines of :class:`~inferlb.simulator.latency.TokenSchedule`.
- :meth:`EmulatedNode.stop` behaves like a killed process: it stops listening and aborts every
  open connection, so in-flight requests see a cut and new ones a refused connection.
- A node whose spec has ``batching`` runs a vLLM-like engine (:mod:`.batching`, driven by
  :mod:`.driver`): requests queue for KV cache, share decode steps, may be preempted, and with
  ``on_kv_full="oom"`` crash the node (:meth:`EmulatedNode.crash`: every connection reset, then
  "loading" for the cold start). Other nodes give every request its own fixed-speed schedule.
- Scrapers see what real nodes expose: ``GET /metrics`` (vLLM's Prometheus names,
  :mod:`.metrics`), ``GET /health``, and ``GET /sim/gpu`` (an NVML-like reading).
- A node whose spec has ``lora`` serves its adapters under their names (:mod:`.lora`): a request
  for one holds an adapter slot from arrival to the end of its answer, waits for a slot when all
  are held, and waits ``load_s`` when its adapter is cold (before the engine sees it, so it is
  in ``waiting_lora_adapters`` meanwhile); an adapter that fails to load (``lora.fail``, the
  faults' ``lora_fail``) is answered 404 in vLLM's words.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from typing import Any

from aiohttp import web

from inferlb.simulator import openai_format as fmt
from inferlb.simulator import responses
from inferlb.simulator.control import NodeControl
from inferlb.simulator.disagg import kv_leg, prefill_answer_params
from inferlb.simulator.driver import BatchDriver, BatchSource, NodeCrashed, ScheduleSource, TokenSource
from inferlb.simulator.latency import LatencyModel, TokenSchedule
from inferlb.simulator.lora import not_found_message
from inferlb.simulator.prefix_cache import BLOCK_TOKENS, PrefixCache, finished_sequence
from inferlb.simulator.respond import HANG_CAP_S, write_stream, write_unary
from inferlb.simulator.server import NodeServer
from inferlb.simulator.stats import MAX_TRACKED_IDS

__all__ = ["SIM_OUTPUT_FIELD", "EmulatedNode"]

_JSON = "application/json"
# A request field only the emulator reads: the length the "model" would stop at on its own (EOS),
# below max_tokens. Lets a benchmark send realistic max_tokens caps while controlling true lengths.
SIM_OUTPUT_FIELD = "inferlb_sim_output_tokens"


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, *, code: str | int | None = None,
                 param: str | None = None, type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type_ = status, message, code, param, type_


class _Keep:
    """Caches a finished sequence's blocks in a prefix cache when called (``on_complete``)."""

    __slots__ = ("_cache", "_text")

    def __init__(self, cache: PrefixCache, text: str) -> None:
        self._cache, self._text = cache, text

    def __call__(self) -> None:
        self._cache.insert(self._text)


class EmulatedNode(NodeServer):
    """An OpenAI-compatible server emulating ``spec``; ``start()`` / ``stop()`` may be repeated
    (the lifecycle and state are :class:`~inferlb.simulator.server.NodeServer`'s)."""

    # -- routing ---------------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v2/models/{model}/infer", self._v2_infer)
        NodeControl(self).add_routes(app)

    def _json(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> web.Response:
        self.stats.statuses[status] += 1
        return web.Response(status=status, body=body, content_type=_JSON, headers=headers)

    def _error(self, status: int, message: str, *, type_: str = "invalid_request_error",
               code: str | int | None = None, param: str | None = None,
               headers: dict[str, str] | None = None) -> web.Response:
        return self._json(status, fmt.error_body(message, type_=type_, code=code, param=param), headers)

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
                if kind == "responses":
                    return await self._respond(request, body)
                return await self._infer_v2(request, body)
            except _BadRequest as exc:
                return self._error(exc.status, exc.message, type_=exc.type_, code=exc.code, param=exc.param)
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
        if faults.added_latency_s > 0:
            await asyncio.sleep(faults.added_latency_s)
        if faults.hang_before_headers:
            self.stats.faults_injected += 1
            await asyncio.sleep(HANG_CAP_S)
            return self._error(504, "hang fault ended")
        status = None
        if faults.status is not None and self._rng.random() < faults.error_rate:
            status = faults.status
        elif faults.error_rates:
            x = self._rng.random()
            for code, rate in faults.error_rates.items():
                x -= rate
                if x < 0:
                    status = code
                    break
        if status is not None:
            self.stats.faults_injected += 1
            headers = None
            retry_s = faults.retry_after_s
            if retry_s is None and status in (429, 503) and faults.error_rates:
                retry_s = 1.0
            if retry_s is not None:
                headers = {"Retry-After": str(math.ceil(retry_s))}
            type_ = ("server_error" if status >= 500 else
                     "rate_limit_error" if status == 429 else "invalid_request_error")
            return self._error(status, f"injected fault: HTTP {status}", type_=type_, headers=headers)
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
        if model not in self.spec.models and model not in self.spec.adapters():
            raise _BadRequest(404, f"The model '{model}' does not exist", code="model_not_found",
                              param="model")
        return model

    async def _hold_adapter(self, model: str) -> str | None:
        """Hold ``model``'s adapter slot when it is an adapter (waiting for a free slot, then for its
        load); returns the adapter to release when the answer ends, None for a base model."""
        slots = self.lora_slots
        if slots is None or model not in slots.spec.adapters:
            return None
        if model in slots.spec.fail or model in self.faults.lora_fail:
            self.stats.faults_injected += 1
            raise _BadRequest(404, not_found_message(model), code=404, type_="NotFoundError")   # vLLM's words
        ready = slots.acquire(model, self._clock.monotonic())
        if ready is None:
            slots.block(model)
            try:
                while ready is None:
                    event = asyncio.Event()
                    self._lora_waiters.append(event)
                    await event.wait()
                    ready = slots.acquire(model, self._clock.monotonic())
            finally:
                slots.block(model, -1)
        try:
            wait = ready - self._clock.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)     # the adapter loads before its prefill can start
        except BaseException:
            self._release_adapter(model)
            raise
        return model

    def _release_adapter(self, adapter: str | None) -> None:
        if adapter is None or self.lora_slots is None:
            return
        self.lora_slots.release(adapter)
        waiters, self._lora_waiters = self._lora_waiters, []
        for event in waiters:
            event.set()

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
        try:
            options = fmt.gen_options(body, chat=chat)
        except fmt.OptionError as exc:
            raise _BadRequest(400, str(exc), param=exc.param) from exc
        n, limited = self._output_tokens(body)
        natural = body.get(SIM_OUTPUT_FIELD)
        if isinstance(natural, int) and not isinstance(natural, bool) and 1 <= natural < n:
            n, limited = natural, False    # the "model" stops on its own before the limit
        prompt_tokens = fmt.prompt_tokens_of(body, "chat" if chat else "completion")
        try:
            leg = kv_leg(body)
        except ValueError as exc:
            raise _BadRequest(400, str(exc), param="kv_transfer_params") from exc
        if leg == "prefill" and body.get("stream") is True:
            raise _BadRequest(400, "a remote-decode prefill must not be streamed", param="stream")
        cached = 0
        prompt_text = ""
        if self.prefix_cache is not None:
            prompt_text = fmt.prompt_text_of(body, "chat" if chat else "completion")
            hit = self.prefix_cache.lookup(prompt_text)
            cached = min(hit * BLOCK_TOKENS, max(0, prompt_tokens - 1))   # the last token is always computed
        finished = None
        if self.prefix_cache is not None and prompt_text:
            # Once written to the end, its prompt and the answer it generated stay cached (vLLM keeps
            # a finished sequence's full blocks, decoded ones included), so a next turn that resends
            # this answer hits them.
            finished = _Keep(self.prefix_cache, finished_sequence(prompt_text, fmt.answer_text(n), chat=chat))
        adapter = await self._hold_adapter(model)
        try:
            return await self._write(request, body, chat=chat, model=model, n=n, limited=limited,
                                     prompt_tokens=prompt_tokens, cached=cached, options=options, finished=finished,
                                     leg=leg)
        finally:
            self._release_adapter(adapter)

    async def _write(self, request: web.Request, body: dict[str, Any], *, chat: bool, model: str, n: int,
                     limited: bool, prompt_tokens: int, cached: int, options: fmt.GenOptions, finished: _Keep | None,
                     leg: str | None = None) -> web.StreamResponse:
        faults = self.faults
        if leg == "decode":
            # Pull the prompt's KV from the prefill node (off the engine's steps), then prefill only
            # the last prompt token, as vLLM's consumer does (simulator/disagg.py).
            self.stats.decode_legs += 1
            await asyncio.sleep(self.spec.kv_transfer.transfer_s(prompt_tokens))
            cached = max(cached, prompt_tokens - 1)
        source = self._source(prompt_tokens, n, cached)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(self._clock.time())
        finish = "length" if limited else "stop"
        try:
            if body.get("stream") is True:
                opts = body.get("stream_options")
                include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
                tmpl = fmt.ChunkTemplate(chat=chat, rid=rid, model=model, created=created,
                                         fingerprint=self.spec.name, include_usage=include_usage,
                                         options=options)
                resp = await write_stream(request, tmpl, source, faults, self.stats, finish=finish,
                                          include_usage=include_usage, stream_interval=self.spec.stream_interval,
                                          on_complete=finished)
            else:
                payload = fmt.completion_body(chat=chat, rid=rid, model=model, created=created,
                                              fingerprint=self.spec.name, prompt_tokens=prompt_tokens,
                                              completion_tokens=n, finish_reason=finish, options=options)
                if leg == "prefill":
                    self.stats.prefill_legs += 1
                    payload = fmt.dumps({**json.loads(payload), "kv_transfer_params": prefill_answer_params(
                        engine_id=self.spec.name, host=self.host, port=self.port, request_id=rid,
                        prompt_tokens=prompt_tokens)})
                resp = await write_unary(request, payload, source, faults, self.stats, on_complete=finished)
        except NodeCrashed:
            # Lost in a crash: the connection is being reset; nothing more can be written.
            self._abort_one(request)
            return web.Response(status=500)
        finally:
            if isinstance(source, BatchSource) and self._driver is not None:
                self._driver.release(source)
        ttft, e2e, queued = source.times()
        self.metrics.observe(ttft_s=ttft, e2e_s=e2e, output_tokens=n, queue_s=queued, finish_reason=finish)
        return resp

    def _source(self, prompt_tokens: int, n: int, cached: int = 0) -> TokenSource:
        """Where this request's tokens come from: the batching engine or its own fixed schedule;
        ``cached`` prompt tokens (a prefix-cache hit) are not prefilled."""
        core = self.core
        if core is None:
            model = self._latency
            factor = self.slow_factor(self._clock.monotonic())
            if factor > 1.0:
                model = LatencyModel(base_ttft_s=model.base_ttft_s * factor,
                                     prefill_s_per_token=model.prefill_s_per_token * factor,
                                     tpot_s=model.tpot_s * factor)
            return ScheduleSource(TokenSchedule(model, self._clock, prompt_tokens=prompt_tokens - cached,
                                                output_tokens=n), prompt_tokens)
        if not core.fits_ever(prompt_tokens + n - 1):
            raise _BadRequest(400, f"This model's KV cache holds {core.spec.kv_tokens} tokens; the request "
                                   f"needs {prompt_tokens} prompt + {n} output tokens",
                              code="context_length_exceeded", param="messages")
        if self._driver is None:
            self._driver = BatchDriver(core, self._clock, self._on_oom)
        return self._driver.submit(prompt_tokens, n, cached)

    def _abort_one(self, request: web.Request) -> None:
        if request.transport is not None:
            request.transport.abort()

    async def _embed(self, body: dict[str, Any]) -> web.Response:
        model = self._model_of(body)
        tokens = fmt.prompt_tokens_of(body, "embedding")
        try:
            payload = fmt.embeddings_body(body, model=model, dim=self.spec.embedding_dim)
        except ValueError as exc:
            raise _BadRequest(400, str(exc), param=exc.param if isinstance(exc, fmt.OptionError) else "input") from exc
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

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "responses")

    async def _respond(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        model = self._model_of(body)
        if "input" not in body:
            raise _BadRequest(400, "input is required", param="input")
        n, _ = self._output_tokens({"max_tokens": body.get("max_output_tokens")})
        resp = await responses.respond(request, body, model=model, n=n, latency=self._latency,
                                       created=int(self._clock.time()))
        self.stats.completed += 1
        return resp
