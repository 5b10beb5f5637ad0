"""The end of a stream (engine/gateway.py ``_stream``): a client that reads ``data: [DONE]`` and
closes the connection at once got the whole answer, so its request is audited ``ok``, never 499.

The race: the gateway relays [DONE], then waits for the node's end of body; a client that closes
as soon as it reads [DONE] can be gone first, and its disconnect cancelled the relay, audited 499.
Real HTTP end to end: the emulator is the node, uvicorn serves the gateway, httpx (on its own event
loop, as a client is its own process) reads each stream to ``[DONE]`` and closes it unread. Once
straight to the emulator, whose end of body follows [DONE] within microseconds; once through
:class:`EndHoldingProxy`, which holds each answer's end of body until the gateway hangs up: the
node's end then always comes after the client's close, the race's losing order, every time.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from inferlb.simulator.emulator import SimFleet
from inferlb.store.schema import REQUESTS
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

STREAMS = int(os.environ.get("INFERLB_STREAM_END_N", "1000"))
PARALLEL = 8
_DONE = b"data: [DONE]\n\n"


class EndHoldingProxy:
    """A TCP proxy in front of one node: each response is forwarded up to the end of the HTTP chunk
    that carries ``data: [DONE]``; the rest (the chunked body's end) is held back until the gateway
    closes the connection. ``held`` counts the answers whose end it held."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.held = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()

    async def _connection(self, gw_r: asyncio.StreamReader, gw_w: asyncio.StreamWriter) -> None:
        node_r, node_w = await asyncio.open_connection("127.0.0.1", self.port)

        async def to_gateway() -> None:
            seen = b""   # the last bytes forwarded: a [DONE] split across two reads is still found
            while data := await node_r.read(65536):
                window = seen + data
                at = window.find(_DONE)
                if at < 0:
                    gw_w.write(data)
                    seen = window[-len(_DONE):]
                    await gw_w.drain()
                    continue
                end = window.index(b"\r\n", at) + 2 - len(seen)   # the end of that chunk's framing
                gw_w.write(data[:end])
                await gw_w.drain()
                self.held += 1
                await node_r.read()   # the end of body, held until the connection goes
                return

        relay = asyncio.ensure_future(to_gateway())
        try:
            while data := await gw_r.read(65536):   # until the gateway hangs up
                node_w.write(data)
                await node_w.drain()
        except ConnectionError:
            pass
        finally:
            relay.cancel()
            node_w.close()
            gw_w.close()


async def _read_to_done_and_close(http: httpx.AsyncClient, i: int) -> bool:
    body = {"model": "m", "messages": [{"role": "user", "content": f"s{i}"}], "max_tokens": 4, "stream": True}
    async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200, (await resp.aread())[:300]
        async for line in resp.aiter_lines():
            if line == "data: [DONE]":
                return True   # leaving the block closes the response unread: the connection goes
    return False


async def _clients(base: str) -> list[bool]:
    limits = httpx.Limits(max_connections=PARALLEL, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, timeout=10, limits=limits) as http:
        gate = asyncio.Semaphore(PARALLEL)

        async def one(i: int) -> bool:
            async with gate:
                return await _read_to_done_and_close(http, i)

        return list(await asyncio.gather(*(one(i) for i in range(STREAMS))))


@pytest.mark.parametrize("held_end", [False, True], ids=["emulator", "end-after-close"])
async def test_a_client_that_closes_right_after_done_is_never_audited_499(tmp_path: Path, held_end: bool) -> None:
    async with SimFleet(fast_specs(1, tpot_s=0.0002)) as sim:
        [node] = sim.nodes.values()
        proxy = EndHoldingProxy(int(node.url.rsplit(":", 1)[1]))
        async with proxy as proxied:
            fleet = fleet_for({"n0": proxied if held_end else node.url})
            # 1,000 streams and their clients share this process and its 2 cores: a pause of the
            # host must not read as a hung node (the first-byte wait's floor, 1 s by default).
            fleet = fleet.model_copy(update={"timeouts": fleet.timeouts.model_copy(
                update={"first_token_s": 30.0, "first_byte_floor_s": 30.0, "total_s": 60.0})})
            # ... nor as a saturated pool: what is tested is the end of a stream, not shedding (a 503
            # once under load from other processes), so the gateway queue and its shedding are off.
            fleet = fleet.model_copy(update={"admission": fleet.admission.model_copy(update={"enabled": False})})
            async with running_gateway(settings_for(tmp_path, fleet)) as (base, app):
                done = await asyncio.to_thread(asyncio.run, _clients(base))
                assert done == [True] * STREAMS
                engine = app.state.store.engine
                statuses: Counter[str] = Counter()
                stmt = select(REQUESTS.c.status, func.count()).group_by(REQUESTS.c.status)
                for _ in range(1000):   # the last records land once the gateway has seen every close
                    await app.state.store.writer.wait_caught_up(5)
                    with engine.connect() as conn:
                        statuses = Counter({s: n for s, n in conn.execute(stmt)})
                    if sum(statuses.values()) >= STREAMS:
                        break
                    await asyncio.sleep(0.01)
    print(f"\n{STREAMS} streams read to [DONE] and closed ({'end after close' if held_end else 'emulator'}): "
          f"{dict(statuses)}")
    assert proxy.held == (STREAMS if held_end else 0)   # through the proxy, every stream lost the race
    assert statuses == Counter({"ok": STREAMS})
