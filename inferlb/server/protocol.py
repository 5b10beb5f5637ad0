"""uvicorn's httptools protocol with the limits a public listener needs.

uvicorn bounds only the idle time between requests (``timeout_keep_alive``). A client that sends
its request head one byte a second, or promises a body it never sends, holds a connection and an
ASGI task for ever; and httptools accepts any number of headers of any size. This subclass adds,
per connection:

- a **header-read timeout**: the request head (request line and headers) must be complete within
  ``header_timeout_s`` of the connection opening (first request) or of its first byte (later
  requests on a keep-alive connection). Expired: 408 when part of a head arrived, else the idle
  connection is closed without an answer.
- a **body-read timeout**: the whole body must arrive within ``body_timeout_s`` of the head. The
  clock does not run while uvicorn has paused reading because the application has not consumed the
  body yet. Expired before the answer started: 408; after: the connection is closed.
- **header limits**: the request head may hold at most ``max_headers`` headers and
  ``max_header_bytes`` bytes (request line plus header lines, like h11's
  ``max_incomplete_event_size``); beyond either, 431.

Every refusal is the OpenAI error envelope with ``Connection: close``.

It also sends an answer's head with what follows it: uvicorn writes the status line and headers
of an answer in one ``transport.write`` and its body in another, two send system calls (and two
TCP segments for the client to read) per answer where one does. Each request cycle writes through
a :class:`_HeadWithBody`: the cycle's first write is held until its next write, which sends both
in one ``writelines``, or until the end of the event-loop iteration it was made in, whichever
comes first; nothing is held longer, and every later write of the cycle goes to the transport
itself (docs/benchmarks.md, "CPU per request, fifth pass").
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from inferlb.errors import error_json

__all__ = ["EdgeLimits", "GatewayConfig", "GuardedHttpToolsProtocol"]


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """Per-connection limits of :class:`GuardedHttpToolsProtocol` (from ``INFERLB_HTTP_*``)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_header_bytes: int = 16 * 1024
    max_headers: int = 100


class GatewayConfig(uvicorn.Config):
    """``uvicorn.Config`` carrying the :class:`EdgeLimits` the protocol reads."""

    def __init__(self, app: Any, *, edge: EdgeLimits, **kwargs: Any) -> None:
        kwargs.setdefault("http", GuardedHttpToolsProtocol)
        super().__init__(app, **kwargs)
        self.edge = edge


class _HeadWithBody:
    """One request cycle's transport: its first write (uvicorn's answer head, or a ``100 Continue``)
    is held and sent with the cycle's next write in one ``writelines``, or alone by a callback at
    the end of the event-loop iteration it was made in (``loop.call_soon``), or before a
    :meth:`close`; whichever comes first. Then the cycle writes to ``transport`` itself again.

    The bytes and their order on the connection are what the two writes would have sent; only
    the system calls differ. A head held when the transport is already closing is dropped (a
    write would have been lost there too). Everything else is the transport's (``__getattr__``).
    """

    __slots__ = ("_cycle", "_flush", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._cycle = cycle
        self._loop = loop
        self._held: bytes | None = None
        self._flush: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is None:
            self._held = bytes(data)
            self._flush = self._loop.call_soon(self.flush)
            return
        self._release()
        self._transport.writelines((held, data))

    def flush(self) -> None:
        """Send the held write now, if any (the end-of-iteration callback; before a close)."""
        held = self._held
        if held is None:
            return
        self._release()
        if not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def _release(self) -> None:
        self._held = None
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self._cycle.transport = self._transport   # the cycle's later writes go straight through


class _Refused(httptools.HttpParserError):
    """Raised from a parser callback to stop parsing; the answer is in ``_refusal``."""


def _error_response(status: int, message: str, code: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    body = error_json(message, "invalid_request_error", code)
    head = [STATUS_LINE[status]]
    for name, value in default_headers:
        head += [name, b": ", value, b"\r\n"]
    head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
             b"connection: close\r\n", b"\r\n"]
    return b"".join(head) + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` plus header/body read timeouts and header limits (module docstring)."""

    def __init__(self, config: uvicorn.Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.edge: EdgeLimits = getattr(config, "edge", EdgeLimits())
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._in_head = False          # a request head has begun and is not complete
        self._head_bytes = 0           # exact bytes of the head parsed so far (URL + header lines)
        self._head_seen = 0            # bytes received while the head was incomplete (upper bound)
        self._header_count = 0
        self._refusal: tuple[int, str, str] | None = None

    # -- connection ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # The first request's clock starts at the connection: one that never sends is closed too.
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        super().data_received(data)
        if self._in_head and self._refusal is None and not self.transport.is_closing():
            # httptools buffers a header until it ends, so one endless header never reaches a
            # callback: bound what arrived while the head was still incomplete.
            self._head_seen += len(data)
            if self._head_seen > self.edge.max_header_bytes:
                self._refuse(431, f"request headers are over the {self.edge.max_header_bytes}-byte limit",
                             "request_header_fields_too_large")

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every parser error with 400; a limit raised from a callback answers its own.
        self._flush_head()
        if self._refusal is not None:
            status, message, code = self._refusal
            self._refusal = None
            self._refuse(status, message, code)
            return
        self._cancel_timers()
        super().send_400_response(msg)

    # -- parser callbacks ------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = self._head_seen = self._header_count = 0
        if self._head_timer is None:
            self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # Called once per request header: the two limits written out here rather than through
        # _count_head (one call fewer per header; the same checks in the same order).
        edge = self.edge
        self._header_count += 1
        if self._header_count > edge.max_headers:
            self._stop(431, f"more than {edge.max_headers} request headers", "request_header_fields_too_large")
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > edge.max_header_bytes:
            self._stop(431, f"request headers are over the {edge.max_header_bytes}-byte limit",
                       "request_header_fields_too_large")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel(self._head_timer)
        self._head_timer = None
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle is not before:   # a new request cycle (not an upgrade)
            # Duck-typed: the cycle calls write, close and is_closing on it (uvicorn's httptools_impl).
            cycle.transport = cast("asyncio.Transport", _HeadWithBody(self.transport, cycle, self.loop))
        self._body_timer = self.loop.call_later(self.edge.body_timeout_s, self._body_timeout)

    def on_message_complete(self) -> None:
        self._cancel(self._body_timer)
        self._body_timer = None
        super().on_message_complete()

    # -- limits ----------------------------------------------------------------------------------

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.edge.max_header_bytes:
            self._stop(431, f"request headers are over the {self.edge.max_header_bytes}-byte limit",
                       "request_header_fields_too_large")

    def _stop(self, status: int, message: str, code: str) -> None:
        self._refusal = (status, message, code)
        raise _Refused(message)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.edge.header_timeout_s, self._head_timeout)

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head waits behind an answer still being sent: its clock starts afresh.
            self._arm_head_timer()
            return
        if not self._in_head:
            self.transport.close()      # connected and silent: nothing to answer
            return
        self._refuse(408, f"request headers not received within {self.edge.header_timeout_s:g} s",
                     "request_timeout")

    def _body_timeout(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or not cycle.more_body:
            return
        if self.flow.read_paused:
            # uvicorn stopped reading because the application has not taken the body yet: the
            # client is not the slow party.
            self._body_timer = self.loop.call_later(self.edge.body_timeout_s, self._body_timeout)
            return
        if cycle.response_started:
            self._flush_head()
            self.transport.close()
            return
        self._refuse(408, f"request body not received within {self.edge.body_timeout_s:g} s", "request_timeout")

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Answer ``status`` in the OpenAI envelope, close, and tell a running request its client left."""
        self._cancel_timers()
        self._in_head = False
        self._flush_head()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.response_complete = True    # the application's own answer is not written
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.write(_error_response(status, message, code, self.server_state.default_headers))
        self.transport.close()

    def _flush_head(self) -> None:
        """Send the current cycle's held head before the protocol writes to the connection itself,
        so the bytes keep their order."""
        t = self.cycle.transport if self.cycle is not None else None
        if isinstance(t, _HeadWithBody):
            t.flush()

    def _cancel_timers(self) -> None:
        self._cancel(self._head_timer)
        self._cancel(self._body_timer)
        self._head_timer = self._body_timer = None

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()
