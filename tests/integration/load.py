"""Steady, bounded client load for the live-change tests: a few workers send chat completions
(streamed and not, through the real OpenAI SDK) until told to stop, counting what succeeded and
what failed. ``progress(n)`` waits (bounded by requests, never by time) until ``n`` more requests
ended, so a test knows load is running through each change it makes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from openai import AsyncOpenAI, OpenAIError


@dataclass
class Load:
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tick: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def done(self) -> int:
        return self.ok + self.failed

    async def _ended(self, ok: bool, error: str | None = None) -> None:
        if ok:
            self.ok += 1
        else:
            self.failed += 1
            self.errors.append(error or "?")
        async with self._tick:
            self._tick.notify_all()

    async def progress(self, n: int, *, guard_s: float = 30.0) -> None:
        """Wait until ``n`` more requests ended (``guard_s`` is a hang guard only)."""
        target = self.done + n

        async def wait() -> None:
            async with self._tick:
                await self._tick.wait_for(lambda: self.done >= target)

        await asyncio.wait_for(wait(), guard_s)


async def _worker(client: AsyncOpenAI, load: Load, i: int, max_requests: int) -> None:
    for k in range(max_requests):
        if load.stop.is_set():
            return
        try:
            if (i + k) % 2:
                stream = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"stream {i}-{k}"}], max_tokens=4, stream=True)
                text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                assert text, "an empty stream"
            else:
                r = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"hello {i}-{k}"}], max_tokens=4)
                assert r.choices[0].message.content
        except (OpenAIError, AssertionError) as exc:
            await load._ended(False, f"{type(exc).__name__}: {exc}"[:300])
        else:
            await load._ended(True)


@contextlib.asynccontextmanager
async def steady_load(base: str, *, api_key: str = "unused", workers: int = 4,
                      max_requests: int = 2000) -> AsyncIterator[Load]:
    """Run ``workers`` clients (each at most ``max_requests``) until the block ends."""
    load = Load()
    client = AsyncOpenAI(base_url=base + "/v1", api_key=api_key, max_retries=0, timeout=30.0)
    tasks = [asyncio.create_task(_worker(client, load, i, max_requests)) for i in range(workers)]
    try:
        yield load
    finally:
        load.stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        await client.close()
