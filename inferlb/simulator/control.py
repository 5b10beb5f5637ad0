"""The emulated node's control and probe endpoints (never counted as inference traffic).

``GET /health`` (503 while loading), ``GET /v1/models``, ``GET /metrics`` (vLLM's Prometheus
names), ``GET /sim/gpu`` (NVML-like reading), ``GET /sim/stats`` (what reached the node and the
engine's gauges), ``GET|POST /sim/faults`` (strict :class:`FaultSpec` JSON; 400 on an unknown key),
``POST /sim/reset`` and ``POST /sim/crash`` (``{"cold_start_s": S}`` optional).

The probes the peer routers read, so each runs its own policies on the emulator as on a real
engine (``inferlb bench compare`` puts them in front of these nodes):

* ``GET /get_load``: the load their ``power_of_two`` policies compare, in the shape the node's
  ``NodeSpec.get_load`` names: ``"sglang"`` (default) answers as an SGLang server does, a list
  with one object per data-parallel rank (``dp_rank``, ``num_reqs``, ``num_waiting_reqs``,
  ``num_tokens``), which sglang-router sums over ``num_tokens``; ``"vllm-router"`` answers
  ``{"load": N}``, the one field vllm-router reads (a list there reads as "no load", and the
  object reads so in sglang-router: no one body serves both). The load is the engine's tokens in
  use: KV tokens of the running requests plus the prompts still waiting (a queue is load too).
* ``GET /get_model_info`` and ``GET /get_server_info``: what sglang-router asks a new worker
  (model path, served model name, generation flag; its limits), in SGLang's field names.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from aiohttp import web

from inferlb.simulator import openai_format as fmt
from inferlb.simulator.metrics import gpu_reading, render_metrics
from inferlb.simulator.spec import FaultSpec

if TYPE_CHECKING:
    from inferlb.simulator.node import EmulatedNode

__all__ = ["NodeControl"]

_JSON = "application/json"
_PROM = "text/plain; version=0.0.4; charset=utf-8"   # Prometheus text exposition format


class NodeControl:
    """The control routes of one node."""

    def __init__(self, node: EmulatedNode) -> None:
        self.node = node

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        r.add_get("/metrics", self.get_metrics)
        r.add_get("/sim/stats", self.get_stats)
        r.add_get("/sim/faults", self.get_faults)
        r.add_post("/sim/faults", self.post_faults)
        r.add_post("/sim/reset", self.post_reset)
        r.add_post("/sim/crash", self.post_crash)
        r.add_get("/sim/gpu", self.get_gpu)
        r.add_get("/get_load", self.get_load)
        r.add_get("/get_model_info", self.get_model_info)
        r.add_get("/get_server_info", self.get_server_info)

    async def health(self, request: web.Request) -> web.Response:
        node = self.node
        if node.loading:
            return web.json_response({"status": "loading", "name": node.spec.name}, status=503)
        return web.json_response({"status": "ok", "name": node.spec.name, "live": node.stats.live})

    async def models(self, request: web.Request) -> web.Response:
        node = self.node
        return web.Response(body=fmt.models_body([*node.spec.models, *node.spec.adapters()], "inferlb-sim"),
                            content_type=_JSON)

    async def get_stats(self, request: web.Request) -> web.Response:
        node = self.node
        return web.json_response({"name": node.spec.name, **node.stats.to_json(), "engine": node.engine_state(),
                                  "loading": node.loading})

    async def get_load(self, request: web.Request) -> web.Response:
        node = self.node
        running, waiting, tokens = node.load_figures()
        if node.spec.get_load == "vllm-router":
            return web.json_response({"load": tokens})
        return web.json_response([{"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": waiting,
                                   "num_tokens": tokens}])

    async def get_model_info(self, request: web.Request) -> web.Response:
        node = self.node
        model = node.spec.models[0]
        return web.json_response({"model_path": model, "tokenizer_path": model, "served_model_name": model,
                                  "is_generation": True, "weight_version": "default"})

    async def get_server_info(self, request: web.Request) -> web.Response:
        node = self.node
        model = node.spec.models[0]
        e = node.engine_state()
        return web.json_response({"model_path": model, "served_model_name": model, "tp_size": 1, "dp_size": 1,
                                  "max_total_num_tokens": e["kv_tokens"],
                                  "max_running_requests": node.spec.max_concurrency,
                                  "version": "inferlb-sim"})

    async def get_metrics(self, request: web.Request) -> web.Response:
        node = self.node
        e = node.engine_state()
        text = render_metrics(node.spec.models[0], running=e["running"], waiting=e["waiting"],
                              kv_usage=e["kv_usage"], preemptions=e["preemptions"],
                              prompt_tokens=e["prompt_tokens"], generation_tokens=e["generation_tokens"],
                              oom_crashes=e["oom_crashes"], metrics=node.metrics, lora=node.lora_info())
        return web.Response(body=text.encode(), headers={"Content-Type": _PROM})

    async def get_gpu(self, request: web.Request) -> web.Response:
        node = self.node
        return web.json_response(gpu_reading(node.spec.name, node.spec.gpu, node.faults,
                                             utilization=node.utilization(), now=node.clock.time(),
                                             crashed=node.loading, boot=node.crashes))

    async def post_crash(self, request: web.Request) -> web.Response:
        node = self.node
        try:
            raw = json.loads(await request.read() or b"{}")
            cold = raw.get("cold_start_s") if isinstance(raw, dict) else None
            if cold is not None and (isinstance(cold, bool) or not isinstance(cold, int | float) or cold < 0):
                raise ValueError("cold_start_s must be a number >= 0")
        except ValueError as exc:
            return web.json_response({"error": {"message": str(exc), "type": "invalid_request_error"}},
                                     status=400)
        # Answer first, then crash: crashing here would reset this very response.
        loop = asyncio.get_running_loop()
        loop.call_soon(node.crash, None if cold is None else float(cold))
        return web.json_response({"ok": True, "cold_start_s": cold})

    async def get_faults(self, request: web.Request) -> web.Response:
        node = self.node
        return web.json_response(node.faults.to_mapping())

    async def post_faults(self, request: web.Request) -> web.Response:
        node = self.node
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
            node.faults = faults
            node.stop_soon()
        else:
            node.faults = faults
        return web.json_response(faults.to_mapping())

    async def post_reset(self, request: web.Request) -> web.Response:
        node = self.node
        node.reset()
        return web.json_response({"ok": True})
