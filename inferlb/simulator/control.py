"""The emulated node's control and probe endpoints (never counted as inference traffic).

``GET /health`` (503 while loading), ``GET /v1/models``, ``GET /metrics`` (vLLM's Prometheus
names), ``GET /sim/gpu`` (NVML-like reading), ``GET /sim/stats`` (what reached the node and the
engine's gauges), ``GET|POST /sim/faults`` (strict :class:`FaultSpec` JSON; 400 on an unknown key),
``POST /sim/reset`` and ``POST /sim/crash`` (``{"cold_start_s": S}`` optional).
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

    async def health(self, request: web.Request) -> web.Response:
        node = self.node
        if node.loading:
            return web.json_response({"status": "loading", "name": node.spec.name}, status=503)
        return web.json_response({"status": "ok", "name": node.spec.name, "live": node.stats.live})

    async def models(self, request: web.Request) -> web.Response:
        node = self.node
        return web.Response(body=fmt.models_body(node.spec.models, "inferlb-sim"), content_type=_JSON)

    async def get_stats(self, request: web.Request) -> web.Response:
        node = self.node
        return web.json_response({"name": node.spec.name, **node.stats.to_json(), "engine": node.engine_state(),
                                  "loading": node.loading})

    async def get_metrics(self, request: web.Request) -> web.Response:
        node = self.node
        e = node.engine_state()
        text = render_metrics(node.spec.models[0], running=e["running"], waiting=e["waiting"],
                              kv_usage=e["kv_usage"], preemptions=e["preemptions"],
                              prompt_tokens=e["prompt_tokens"], generation_tokens=e["generation_tokens"],
                              oom_crashes=e["oom_crashes"], metrics=node.metrics)
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
