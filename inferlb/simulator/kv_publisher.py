"""The emulated node's KV event publisher: its prefix cache's events (:mod:`.prefix_cache`), sent
as a vLLM engine sends them (vllm/distributed/kv_events.py ``ZmqEventPublisher``), so the
gateway's subscriber (inferlb/kvevents) is tested against the same bytes and sockets.

The wire, as vLLM's: a PUB socket, each message ``[topic, seq, payload]`` with ``seq`` 8 bytes
big-endian from 0 and ``payload`` a msgpack ``KVEventBatch`` (``ts``, ``events``,
``data_parallel_rank``) encoded by msgspec from tagged structs with vLLM's field names and
order; a ROUTER replay socket that answers ``[identity, "", start_seq]`` with every buffered
``[identity, "", seq, payload]`` from ``start_seq`` on, then ``[identity, "", -1, ""]``. The
structs here are the emulator's own copy of the format, not imported from the gateway's decoder:
the emulator stands for a separate engine, and a shared definition would hide a drift.

Contract of :class:`KVPublisher`: :meth:`start` binds 127.0.0.1 (``port`` 0: a free port; the
replay socket on ``replay_port``, 0 a free one); :meth:`sink` is the prefix cache's sink: events
handed to it in one turn of the event loop go out as one batch (an engine step's). Faults for
tests and benchmarks: :meth:`drop_next` leaves the next n batches unsent (still buffered for
replay, as a PUB message lost to a slow subscriber is), ``replay_enabled = False`` makes the
replay socket answer only the end marker (a publisher without a buffer). Events of a stopped
publisher are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from inferlb.simulator.prefix_cache import RemovedEvent, StoredEvent

__all__ = ["KVPublisher", "VllmAllBlocksCleared", "VllmBlockRemoved", "VllmBlockStored", "VllmKVEventBatch"]

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class _Event(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    pass


class VllmBlockStored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class VllmBlockRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class VllmAllBlocksCleared(_Event, tag="AllBlocksCleared"):
    pass


class VllmKVEventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared]
    data_parallel_rank: int | None = None


class KVPublisher:
    def __init__(self, *, port: int = 0, replay_port: int = 0, topic: str = "", buffer_steps: int = 10_000,
                 clock: Callable[[], float] = time.time) -> None:
        self.port = port
        self.replay_port = replay_port
        self.topic = topic.encode("utf-8")
        self.clock = clock
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._pending: list[VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared] = []
        self._scheduled = False
        self._seq = 0
        self._drop = 0
        self.replay_enabled = True
        self.sent = 0
        self.dropped = 0
        self._encoder = msgspec.msgpack.Encoder()
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    @property
    def running(self) -> bool:
        return self._pub is not None

    async def start(self) -> None:
        if self._pub is not None:
            return
        ctx = self._ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.set_hwm(100_000)
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        try:
            if self.port:
                pub.bind(self.endpoint)
            else:
                self.port = pub.bind_to_random_port("tcp://127.0.0.1")
            if self.replay_port:
                router.bind(self.replay_endpoint)
            else:
                self.replay_port = router.bind_to_random_port("tcp://127.0.0.1")
        except zmq.ZMQError:
            pub.close(linger=0)
            router.close(linger=0)
            ctx.term()
            self._ctx = None
            raise
        self._pub, self._router = pub, router
        self._task = asyncio.get_running_loop().create_task(self._serve_replay(), name="kv-replay")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        self._pending.clear()

    def drop_next(self, n: int) -> None:
        """Leave the next ``n`` batches unsent (they stay in the replay buffer)."""
        self._drop += n

    def sink(self, event: StoredEvent | RemovedEvent) -> None:
        if self._pub is None:
            return
        if isinstance(event, StoredEvent):
            self._pending.append(VllmBlockStored(list(event.block_hashes), event.parent_block_hash,
                                                 list(event.token_ids), event.block_size, None, "GPU", None))
        else:
            self._pending.append(VllmBlockRemoved(list(event.block_hashes), "GPU"))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def clear_all(self) -> None:
        """Publish ``AllBlocksCleared`` (the engine's cache was reset)."""
        if self._pub is not None:
            self._pending.append(VllmAllBlocksCleared())
            self.flush()

    def flush(self) -> None:
        """Send what is pending as one batch."""
        self._scheduled = False
        pub = self._pub
        if pub is None or not self._pending:
            return
        batch = VllmKVEventBatch(ts=self.clock(), events=self._pending, data_parallel_rank=0)
        self._pending = []
        payload = self._encoder.encode(batch)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        if self._drop:
            self._drop -= 1
            self.dropped += 1
            return
        try:
            pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self.dropped += 1

    async def _serve_replay(self) -> None:
        router = self._router
        assert router is not None
        while True:
            frames: list[Any] = await router.recv_multipart()
            if len(frames) != 3:
                continue
            ident, _, start_b = frames
            start = int.from_bytes(start_b, "big")
            if self.replay_enabled:
                for seq, payload in list(self._buffer):
                    if seq >= start:
                        await router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
            await router.send_multipart([ident, b"", END_SEQ, b""])
