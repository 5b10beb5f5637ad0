"""One ZeroMQ subscription a node, feeding :class:`~inferlb.kvevents.service.KVEventsService`.

Contract of :class:`Subscriptions` (the runner of every node's subscriber):

* :meth:`Subscriptions.reconcile` (at start and after every reload) starts a
  :class:`NodeSubscriber` for each node the service says to (re)subscribe and stops those it says
  to stop; :meth:`Subscriptions.close` stops them all.
* A :class:`NodeSubscriber` is a :class:`~inferlb.background.Background`: a SUB socket connected
  to the node's ``endpoint``, subscribed to its ``topic``, handing each message to the service.
  When the service reports a gap and the node has a ``replay_endpoint``, it asks vLLM's replay
  ROUTER for the missed batches (a DEALER sends ``["", start_seq]``, the start as 8 bytes
  big-endian; the answers are ``["", seq, payload]`` and end with seq -1) and waits at most
  ``replay_timeout_s``; what came back closes the gap (:meth:`KVEventsService.close_gap`: filled,
  or the node is cleared and stale). ZeroMQ reconnects a SUB socket by itself; a stream that goes
  quiet while requests are sent to its node is caught by the index's silence rule.
* A message that fails in an unexpected way is logged and resets the node's view (stale, as a
  lost connection) instead of ending the subscription.
* Nothing here sleeps for time to pass: the sockets are awaited (``zmq.asyncio``).
"""

from __future__ import annotations

import asyncio
import logging

import zmq
import zmq.asyncio

from inferlb.background import Background
from inferlb.config.kvevents import KVEventsNode
from inferlb.kvevents.service import Gap, KVEventsService

__all__ = ["END_SEQ", "NodeSubscriber", "Subscriptions", "replay"]

log = logging.getLogger("inferlb.kvevents")
END_SEQ = -1
_MAX_REPLAY = 100_000        # batches taken from one replay, at most


async def replay(ctx: zmq.asyncio.Context, endpoint: str, start: int, upto: int, timeout_s: float
                 ) -> list[tuple[int, bytes]]:
    """Batches ``start`` … ``upto - 1`` (fewer when the publisher's buffer lacks them) from a vLLM
    replay ROUTER at ``endpoint``; stops at the end marker, at ``upto`` or after ``timeout_s``."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    out: list[tuple[int, bytes]] = []
    try:
        sock.connect(endpoint)
        await sock.send_multipart([b"", start.to_bytes(8, "big")])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(out) < _MAX_REPLAY:
            left = deadline - loop.time()
            if left <= 0 or not await sock.poll(int(left * 1000) + 1):
                break
            frames = await sock.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                break
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == END_SEQ:
                break
            out.append((seq, frames[2]))
            if seq >= upto - 1:
                break
    finally:
        sock.close(linger=0)
    return out


class NodeSubscriber(Background):
    def __init__(self, node: str, cfg: KVEventsNode, service: KVEventsService, ctx: zmq.asyncio.Context, *,
                 replay_timeout_s: float = 1.0) -> None:
        super().__init__(f"kv-events:{node}", logger=log)
        self.node = node
        self.cfg = cfg
        self.service = service
        self.ctx = ctx
        self.replay_timeout_s = replay_timeout_s

    async def body(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.cfg.topic.encode("utf-8"))
        sub.connect(self.cfg.endpoint)
        try:
            while not self.stopping:
                frames = await sub.recv_multipart()
                try:
                    gap = self.service.on_message(self.node, frames)
                    if gap is not None:
                        await self._close(gap)
                except Exception:   # one bad message must not end the node's subscription
                    log.exception("kv events of %s: a message could not be applied; the node's view is reset",
                                  self.node)
                    self.service.disconnected(self.node)
        finally:
            sub.close(linger=0)

    async def _close(self, gap: Gap) -> None:
        got: list[tuple[int, bytes]] = []
        if self.cfg.replay_endpoint is not None:
            try:
                got = await replay(self.ctx, self.cfg.replay_endpoint, gap.first, gap.seq, self.replay_timeout_s)
            except zmq.ZMQError as exc:
                log.warning("kv events of %s: replay from %s failed: %s", self.node, self.cfg.replay_endpoint, exc)
        filled = self.service.close_gap(gap, got)
        if not filled:
            log.warning("kv events of %s: batches %d-%d lost%s; its index is cleared and stale for %.0f s",
                        self.node, gap.first, gap.seq - 1,
                        "" if self.cfg.replay_endpoint else " (no replay endpoint)", self.service.index.recover_s)


class Subscriptions:
    """Every node's :class:`NodeSubscriber`, kept in step with the service's configuration."""

    def __init__(self, service: KVEventsService, *, replay_timeout_s: float = 1.0) -> None:
        self.service = service
        self.replay_timeout_s = replay_timeout_s
        self.ctx = zmq.asyncio.Context()
        self.subs: dict[str, NodeSubscriber] = {}

    async def reconcile(self, start: list[str], stop: list[str]) -> None:
        for n in stop:
            sub = self.subs.pop(n, None)
            if sub is not None:
                await sub.stop()
        for n in start:
            cfg = self.service.nodes.get(n)
            old = self.subs.pop(n, None)
            if old is not None:
                await old.stop()
            if cfg is not None:
                sub = self.subs[n] = NodeSubscriber(n, cfg, self.service, self.ctx,
                                                    replay_timeout_s=self.replay_timeout_s)
                sub.start()

    async def close(self) -> None:
        for sub in list(self.subs.values()):
            await sub.stop()
        self.subs.clear()
        self.ctx.term()
