"""A local stand-in for the Kubernetes API server's EndpointSlice endpoints, serving the bodies in
fixtures/k8s/ to the real ``kubernetes`` client over HTTP.

* ``GET …/endpointslices`` (no ``watch``): the slices it holds now, with the list's resourceVersion;
  ``fail_list`` answers the next lists with a status and a fixture body instead.
* ``GET …/endpointslices?watch=true``: waits for the test to :meth:`push` a script — the lines of
  a ``*.jsonl`` fixture, streamed then the stream ends (as when ``timeoutSeconds`` runs out), or
  ``(status, fixture)`` to answer with an error — and applies the events to what it holds.
* ``rewrite``: pod address → port of a simulated server; such an endpoint is served as
  ``127.0.0.1`` and its slice's ``http`` port as that port (each simulated server has its own port).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["FIX", "FakeApiServer", "Running", "serve"]

FIX = Path(__file__).parent / "fixtures" / "k8s"

Script = list[str] | tuple[int, str] | None


class FakeApiServer:
    def __init__(self, rewrite: dict[str, int] | None = None) -> None:
        doc = json.loads((FIX / "endpointslice_list.json").read_text())
        self.rewrite = dict(rewrite or {})
        self.slices: dict[str, dict[str, Any]] = {s["metadata"]["name"]: s for s in doc["items"]}
        self.resource_version = doc["metadata"]["resourceVersion"]
        self.requests: list[dict[str, str]] = []
        self.auth: list[str | None] = []
        self.fail_list: list[tuple[int, str]] = []
        self._scripts: asyncio.Queue[Script] = asyncio.Queue()
        self.watching = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self.handle)
        return app

    def push(self, script: str | tuple[int, str]) -> None:
        """The next watch request's answer: a ``*.jsonl`` fixture's events, or (status, fixture)."""
        if isinstance(script, tuple):
            self._scripts.put_nowait(script)
        else:
            self._scripts.put_nowait((FIX / script).read_text().splitlines())

    def release(self) -> None:
        """Let every waiting watch end empty (before the server stops)."""
        for _ in range(self.watching + 1):
            self._scripts.put_nowait(None)

    def _served(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        port = None
        for ep in obj.get("endpoints") or []:
            addr = (ep.get("addresses") or [""])[0]
            if addr in self.rewrite:
                port = port or self.rewrite[addr]
                ep["addresses"] = ["127.0.0.1"]
        if port is not None:
            for p in obj.get("ports") or []:
                if p.get("name") == "http":
                    p["port"] = port
        return obj

    async def handle(self, request: web.Request) -> web.StreamResponse:
        q = dict(request.query)
        self.requests.append(q)
        self.auth.append(request.headers.get("authorization"))
        if q.get("watch") == "true":
            self.watching += 1
            try:
                script = await self._scripts.get()
            finally:
                self.watching -= 1
            if isinstance(script, tuple):
                status, fixture = script
                return web.Response(status=status, text=(FIX / fixture).read_text(), content_type="application/json")
            resp = web.StreamResponse()
            resp.content_type = "application/json"
            await resp.prepare(request)
            for line in script or []:
                event = json.loads(line)
                obj = event["object"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    self.slices[obj["metadata"]["name"]] = obj
                elif event["type"] == "DELETED":
                    self.slices.pop(obj["metadata"]["name"], None)
                if event["type"] != "ERROR":
                    self.resource_version = obj["metadata"]["resourceVersion"]
                    event["object"] = self._served(obj)
                await resp.write((json.dumps(event) + "\n").encode())
            await resp.write_eof()
            return resp
        if self.fail_list:
            status, fixture = self.fail_list.pop(0)
            return web.Response(status=status, text=(FIX / fixture).read_text() if fixture else "etcd unavailable",
                                content_type="application/json")
        return web.json_response({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                                  "metadata": {"resourceVersion": self.resource_version},
                                  "items": [self._served(s) for s in self.slices.values()]})


class Running:
    """``fake`` served on a free 127.0.0.1 port until :meth:`stop` (then connections are refused)."""

    def __init__(self, fake: FakeApiServer) -> None:
        self.fake = fake
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        self.runner = web.AppRunner(self.fake.app())
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            self.fake.release()
            await self.runner.cleanup()
            self.runner = None


async def serve(fake: FakeApiServer) -> AsyncIterator[tuple[str, Running]]:
    running = Running(fake)
    url = await running.start()
    try:
        yield url, running
    finally:
        await running.stop()
