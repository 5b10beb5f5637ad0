"""A tiny TCP proxy a test can cut and restore: Redis "away" without touching the machine's Redis.

``cut()`` closes the listener and every relayed connection (clients then see connection refused
/ reset, as when Redis restarts); ``restore()`` listens again on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["TcpProxy"]


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.connections += 1
        self._writers.update((writer, up_w))

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        try:
            await asyncio.gather(pump(reader, up_w), pump(up_r, writer))
        finally:
            self._writers.discard(writer)
            self._writers.discard(up_w)

    async def cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for w in list(self._writers):
            w.close()
        self._writers.clear()
        if server is not None:
            await server.wait_closed()

    async def restore(self) -> None:
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self.cut()
