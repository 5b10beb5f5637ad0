"""The server process of one emulated GPU node: what outlives and surrounds its requests.

:class:`NodeServer` holds a node's state (spec, faults, counters, the batching engine and prefix
cache) and its lifecycle: listening on a port, stopping like a killed process, crashing and
reloading, waiting for counters, and the readings a scraper sees (engine gauges, utilisation).
The endpoints live in :class:`~inferlb.simulator.node.EmulatedNode`, which adds them through
:meth:`NodeServer._add_routes`; the contract of the two together is in :mod:`.node`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from inferlb.simulator.batching import BatchCore
from inferlb.simulator.driver import BatchDriver
from inferlb.simulator.lora import AdapterSlots
from inferlb.simulator.metrics import NodeMetrics
from inferlb.simulator.prefix_cache import BLOCK_TOKENS, PrefixCache
from inferlb.simulator.spec import FaultSpec, NodeSpec
from inferlb.simulator.stats import NodeStats
from inferlb.types import Clock, SystemClock

if TYPE_CHECKING:
    from inferlb.simulator.kv_publisher import KVPublisher

__all__ = ["NodeServer"]

_MAX_BODY_BYTES = 16 * 1024 * 1024


class NodeServer:
    """A node's state and lifecycle; ``start()`` / ``stop()`` may be repeated. Subclasses add the
    endpoints in :meth:`_add_routes`."""

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
        self._loading_until = self._clock.monotonic()   # also the start of the slow-start window
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiters: set[asyncio.Event] = set()
        self.metrics = NodeMetrics()
        self.crashes = 0
        self.core: BatchCore | None = None
        self._driver: BatchDriver | None = None
        self._busy_mark = (self._clock.monotonic(), 0.0)
        if spec.batching is not None:
            self.core = BatchCore(spec.batching)
            self.core.slow_factor_at = self.slow_factor
        # LoRA adapter slots (simulator/lora.py) and the requests waiting for one to be released.
        self.lora_slots: AdapterSlots | None = AdapterSlots(spec.lora) if spec.lora is not None else None
        self._lora_waiters: list[asyncio.Event] = []
        # vllm:lora_requests_info's label sets as they were last set (running, waiting) → time, newest last
        self.lora_series: OrderedDict[tuple[str, str], float] = OrderedDict()
        self.prefix_cache: PrefixCache | None = None
        # The prefix cache's KV events in vLLM's format over ZeroMQ (kv_publisher.py; needs pyzmq, msgspec).
        self.kv_publisher: KVPublisher | None = None
        if spec.prefix_cache:
            tokens = spec.prefix_cache_tokens or (spec.batching.kv_tokens if spec.batching is not None else 65_536)
            if spec.kv_events_port is not None:
                from inferlb.simulator.kv_publisher import KVPublisher

                port = spec.kv_events_port
                self.kv_publisher = KVPublisher(port=port, replay_port=port + 1 if port else 0,
                                                clock=self._clock.time)
            self.prefix_cache = PrefixCache(max(1, tokens // BLOCK_TOKENS),
                                            sink=self.kv_publisher.sink if self.kv_publisher is not None else None)

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

    def slow_factor(self, now: float) -> float:
        """The slow-start multiplier on step times / latencies at ``now`` (1 once warmed up)."""
        f = self.faults
        if f.slow_start_factor <= 1.0 or f.slow_start_s <= 0:
            return 1.0
        since = now - self._loading_until
        if since >= f.slow_start_s:
            return 1.0
        return 1.0 + (f.slow_start_factor - 1.0) * (1.0 - max(0.0, since) / f.slow_start_s)

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
        middlewares = [self._network_delay] if self.spec.network_delay_s > 0 else []
        app = web.Application(client_max_size=_MAX_BODY_BYTES, middlewares=middlewares)
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
        if self.kv_publisher is not None:
            await self.kv_publisher.start()
        self._loading_until = self._clock.monotonic() + self.spec.startup_s

    async def stop(self) -> None:
        """Stop like a killed process: close the listener and abort every open connection."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if self._driver is not None:
            self._driver.fail_all(0.0)   # the engine's state dies with the process
            await self._driver.close()
            self._driver = None
        self._abort_live()
        await runner.cleanup()
        if self.kv_publisher is not None:
            await self.kv_publisher.stop()

    def stop_soon(self) -> None:
        """Stop after the current handler has answered (``refuse`` from the control endpoint)."""
        task = asyncio.get_running_loop().create_task(self.stop())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def clock(self) -> Clock:
        return self._clock

    def _abort_live(self) -> None:
        for request in list(self._live_requests.values()):
            if request.transport is not None:
                request.transport.abort()

    def crash(self, cold_start_s: float | None = None) -> None:
        """Die and restart: reset every connection, then "loading" for ``cold_start_s`` (default:
        the engine's ``cold_start_s``, else 0) while ``/health`` answers 503."""
        if cold_start_s is None:
            cold_start_s = self.spec.batching.cold_start_s if self.spec.batching is not None else 0.0
        if self._driver is not None:
            self._driver.fail_all(cold_start_s)
        self._crashed(self._clock.monotonic(), cold_start_s)

    def _crashed(self, now: float, cold_start_s: float) -> None:
        self.crashes += 1
        self._loading_until = max(self._loading_until, now + cold_start_s)
        self._abort_live()
        self._notify()

    def _on_oom(self, now: float) -> None:
        assert self.spec.batching is not None
        self._crashed(now, self.spec.batching.cold_start_s)

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
        self.metrics = NodeMetrics()
        self._notify()

    def lora_info(self) -> tuple[int, list[tuple[str, str, float]]] | None:
        """``vllm:lora_requests_info`` now (:func:`~inferlb.simulator.metrics.render_metrics`): the
        current label set is set to the current time; older ones keep theirs (as vLLM leaves them;
        the 16 newest are kept). None without LoRA adapters."""
        slots = self.lora_slots
        if slots is None:
            return None
        running, waiting = slots.report(self._clock.monotonic())
        key = (",".join(running), ",".join(waiting))
        series = self.lora_series
        series[key] = self._clock.time()
        series.move_to_end(key)
        while len(series) > 16:
            series.popitem(last=False)
        return slots.spec.max_lora, [(r, w, at) for (r, w), at in series.items()]

    def engine_state(self) -> dict[str, Any]:
        """The engine's gauges and counters (zeros and no KV for a fixed-speed node)."""
        core = self.core
        cache = {"prefix_cache": self.prefix_cache.to_json()} if self.prefix_cache is not None else {}
        if core is None:
            return {"running": self.stats.live, "waiting": 0, "kv_usage": 0.0, "kv_tokens": None,
                    "preemptions": 0, "oom_crashes": 0, "crashes": self.crashes, "prompt_tokens": 0,
                    "generation_tokens": 0, **cache}
        return {"running": len(core.running), "waiting": len(core.waiting), "kv_usage": round(core.kv_usage, 4),
                "kv_tokens": core.total_blocks * core.spec.block_tokens, "preemptions": core.preemptions_total,
                "oom_crashes": core.oom_crashes_total, "crashes": self.crashes,
                "prompt_tokens": core.prompt_tokens_total, "generation_tokens": core.generation_tokens_total,
                **cache}

    def load_figures(self) -> tuple[int, int, int]:
        """``(running, waiting, tokens)`` for the peer routers' ``/get_load``: requests running and
        queued, and tokens in use (KV tokens of the running requests plus the waiting prompts; on a
        fixed-speed node, with no KV, the live requests' count stands for both)."""
        core = self.core
        if core is None:
            return self.stats.live, 0, self.stats.live
        tokens = core.used_blocks * core.spec.block_tokens + sum(s.prompt_tokens for s in core.waiting)
        return len(core.running), len(core.waiting), tokens

    def utilization(self) -> float:
        """Share of time the engine was stepping since the previous reading (NVML's utilisation)."""
        now = self._clock.monotonic()
        if self.core is None:
            return 1.0 if self.stats.live else 0.0
        t0, b0 = self._busy_mark
        busy = self.core.busy_s_total
        self._busy_mark = (now, busy)
        return 0.0 if now <= t0 else min(1.0, (busy - b0) / (now - t0))

    @web.middleware
    async def _network_delay(self, request: web.Request,
                             handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """An edge node: the round trip (``network_delay_s``) passes before anything is handled."""
        await asyncio.sleep(self.spec.network_delay_s)
        return await handler(request)

    def _add_routes(self, app: web.Application) -> None:
        """Add the node's endpoints to ``app`` (called by :meth:`start`)."""
        raise NotImplementedError
