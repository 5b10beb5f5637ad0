"""Drives a :class:`~.batching.BatchCore` in real time on the event loop, and the handlers' view of it.

Contract: one task per node runs the engine's steps at their deadlines (absolute, so event-loop
lateness never accumulates: a late loop runs the overdue steps at once and catches up). Handlers
never poll: :meth:`BatchDriver.wait` parks on a future that the step loop resolves when the
sequence has the tokens asked for, finishes, or is lost in a crash (then
:class:`NodeCrashed` is raised). A handler that leaves early must :meth:`BatchDriver.release` its
sequence so the engine frees its KV blocks (vLLM aborts a request whose client went away).

:class:`ScheduleSource` gives the fixed-speed (non-batching) nodes the same ``wait`` interface over
a :class:`~.latency.TokenSchedule`, so the HTTP code is one path for both kinds of node.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from inferlb.errors import InferlbError
from inferlb.simulator.batching import BatchCore, Seq, SeqState, StepReport
from inferlb.simulator.latency import TokenSchedule
from inferlb.types import Clock

__all__ = ["BatchDriver", "BatchSource", "NodeCrashed", "ScheduleSource", "TokenSource"]


class NodeCrashed(InferlbError):
    """The sequence was lost: the node crashed (OOM) or could not hold it."""


class TokenSource:
    """How many output tokens of one request exist; ``wait(k)`` returns once ``k`` do (or all)."""

    prompt_tokens: int
    output_tokens: int

    async def wait(self, count: int) -> int:
        raise NotImplementedError

    def times(self) -> tuple[float | None, float, float]:
        """(seconds to first token, seconds end to end, seconds queued) as the node saw them."""
        raise NotImplementedError


class ScheduleSource(TokenSource):
    """A fixed-speed request: token ``i`` is due at its :class:`TokenSchedule` deadline."""

    def __init__(self, schedule: TokenSchedule, prompt_tokens: int | None = None) -> None:
        self.schedule = schedule   # its prompt_tokens: those prefilled (the uncached ones)
        self.prompt_tokens = schedule.prompt_tokens if prompt_tokens is None else prompt_tokens
        self.output_tokens = schedule.output_tokens

    async def wait(self, count: int) -> int:
        count = min(count, self.output_tokens)
        if count > 0:
            await asyncio.sleep(self.schedule.delay_s(count - 1))
        return count

    def times(self) -> tuple[float | None, float, float]:
        s = self.schedule
        ttft = s.deadline(0) - s.start if s.output_tokens > 0 else None
        return ttft, s.done_at() - s.start, 0.0


class BatchSource(TokenSource):
    """A request inside a batching engine."""

    def __init__(self, driver: BatchDriver, seq: Seq) -> None:
        self.driver = driver
        self.seq = seq
        self.prompt_tokens = seq.prompt_tokens
        self.output_tokens = seq.output_tokens

    async def wait(self, count: int) -> int:
        return await self.driver.wait(self.seq, count)

    def times(self) -> tuple[float | None, float, float]:
        seq = self.seq
        start = seq.arrived_at
        end = seq.finished_at if seq.finished_at is not None else start
        ttft = None if seq.first_token_at is None else seq.first_token_at - start
        queued = (seq.admitted_at - start) if seq.admitted_at is not None else end - start
        return ttft, end - start, queued


class BatchDriver:
    """Runs ``core`` against ``clock``; ``on_crash(now)`` is called after an OOM crash."""

    def __init__(self, core: BatchCore, clock: Clock, on_crash: Callable[[float], None]) -> None:
        self.core = core
        self.clock = clock
        self.on_crash = on_crash
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def submit(self, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> BatchSource:
        seq = self.core.submit(prompt_tokens, output_tokens, self.clock.monotonic(), cached_tokens)
        self._ensure_running()
        self._wake.set()
        return BatchSource(self, seq)

    def release(self, source: BatchSource) -> None:
        """Free the sequence's blocks if it is still in the engine (client gone, node stopping)."""
        self.core.abort(source.seq, self.clock.monotonic())

    async def wait(self, seq: Seq, count: int) -> int:
        count = min(count, seq.output_tokens)
        if seq.generated < count and not seq.done:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            seq.want, seq.waiter = count, fut
            try:
                await fut
            finally:
                seq.waiter = None
        if seq.state in (SeqState.FAILED, SeqState.ABORTED):
            raise NodeCrashed("the request was lost by the engine")
        return seq.generated

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        core, clock = self.core, self.clock
        while True:  # until close(): a node's engine lives as long as the node
            at = core.next_event_at()
            if at is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            delay = at - clock.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self._dispatch(core.advance(clock.monotonic()))

    def _dispatch(self, report: StepReport) -> None:
        for seq in report.progressed:
            fut = seq.waiter
            if isinstance(fut, asyncio.Future) and not fut.done() and (seq.generated >= seq.want or seq.done):
                fut.set_result(None)
        for seq in report.failed:
            fut = seq.waiter
            if isinstance(fut, asyncio.Future) and not fut.done():
                fut.set_result(None)   # wait() sees the FAILED state and raises NodeCrashed
        if report.crashed_at is not None:
            self.on_crash(report.crashed_at)

    def fail_all(self, cold_start_s: float) -> None:
        """A crash on demand (``POST /sim/crash``): like an OOM, without counting one."""
        now = self.clock.monotonic()
        lost = self.core.crash(now, cold_start_s)
        report = StepReport(failed=lost)
        self._dispatch(report)
