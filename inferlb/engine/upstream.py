"""The data-path HTTP client: one attempt against one node, with the streaming timers of docs/reliability.md §5.

Chosen by measurement: an aiohttp ``ClientSession`` costs the gateway about 1 ms of CPU per request
against 3.4–9.5 ms for httpx. aiohttp stays behind this module: every aiohttp / OS error is mapped
here (``raise … from exc``) into :mod:`inferlb.errors`, and nothing else imports aiohttp for
the data path.

Contract of :meth:`Upstream.open` (docs/reliability.md §5):

- It returns only once the node has answered 2xx **and** sent the first body chunk: the commit
  point. Until then nothing has reached the client, so every failure is an
  :class:`~inferlb.errors.UpstreamError` the caller may retry elsewhere.
- Timers: ``connect_s`` (TCP connect), ``first_token_s`` (request start → first body chunk, covering
  a wait for a pool slot too), ``idle_s`` (between later chunks) and ``total_s`` (request start →
  last byte; the earlier of it and the others wins, and then ``phase`` says ``total``).
- A non-2xx answer raises :class:`~inferlb.errors.UpstreamStatusError` with the body
  (≤ 64 KiB) and ``Retry-After`` in seconds (delay-seconds or HTTP-date). Redirects are not
  followed: a 3xx is a status error too, so a node can never redirect traffic or credentials.
- Headers go out as given, minus hop-by-hop ones; aiohttp adds only ``Host`` and
  ``Content-Length`` (no ``User-Agent``, ``Accept``, ``Accept-Encoding`` or ``Content-Type`` of its
  own). Bodies are not decompressed: the bytes are relayed as the node sent them.
- :meth:`UpstreamResponse.aclose` closes the TCP connection unless the body was read to the end,
  which is how a node (vLLM, SGLang, the emulator) learns that the client went away. Callers use
  ``async with response:`` so that cancellation closes it too.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import ssl
from collections.abc import AsyncIterator, Mapping
from datetime import UTC
from types import TracebackType

import aiohttp
from aiohttp.abc import AbstractResolver

from inferlb.config.netpolicy import redact_url
from inferlb.config.settings import TimeoutConfig
from inferlb.config.tls import NodeTLS
from inferlb.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from inferlb.fleet.netguard import GuardedResolver, PolicySource
from inferlb.types import Clock, SystemClock

__all__ = [
    "HOP_BY_HOP_HEADERS",
    "MAX_ERROR_BODY_BYTES",
    "Upstream",
    "UpstreamResponse",
    "parse_retry_after",
    "strip_hop_by_hop",
]

MAX_ERROR_BODY_BYTES = 64 * 1024
_MAX_BODY_BYTES = 64 * 1024 * 1024

# RFC 9110 §7.6.1 connection-specific fields, plus the two the client computes itself.
HOP_BY_HOP_HEADERS = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length",
})
_SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


def strip_hop_by_hop(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` without hop-by-hop fields, including those named in ``Connection``."""
    lowered = [(key, key.lower(), value) for key, value in headers.items()]
    named: frozenset[str] | set[str] = HOP_BY_HOP_HEADERS
    for _, low, value in lowered:
        if low == "connection":
            named = set(named)
            named.update(token.strip().lower() for token in value.split(",") if token.strip())
    return {key: value for key, low, value in lowered if low not in named}


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from ``Retry-After`` (delay-seconds or an HTTP-date), or None if unusable.

    ``now`` is the wall clock (epoch seconds) an HTTP-date is measured against. The result is
    never negative; a date in the past means "now" (0.0).
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)  # RFC says integer; some servers send "1.5", which is harmless
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def _tls_reason(exc: BaseException) -> str:
    cert_error = getattr(exc, "certificate_error", None)   # aiohttp's ClientConnectorCertificateError
    inner = cert_error if isinstance(cert_error, ssl.SSLError) else getattr(exc, "os_error", exc)
    if isinstance(inner, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {inner.verify_message}"
    if isinstance(inner, ssl.SSLError):
        return str(inner.reason or inner)
    return str(exc)


def _map_error(exc: BaseException, node: str) -> UpstreamError:
    """The one mapping from aiohttp / OS errors to inferlb's (timeouts are handled by the callers)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamTimeout(f"connect timeout: {exc}", phase="connect", node=node)
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        shown = redact_url(str(exc.url) if isinstance(exc, aiohttp.InvalidURL) else str(exc))   # no query token
        return UpstreamConnectError(f"unusable node URL: {shown}", node=node)
    if isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError):
        # Certificate not trusted, name mismatch, client certificate refused: the node's TLS and its
        # tls block disagree. OpenSSL's reason names which; no certificate or key is in it.
        return UpstreamConnectError(f"TLS with the node failed: {_tls_reason(exc)}", node=node)
    if isinstance(exc, aiohttp.ClientResponseError):
        # Raised for a response aiohttp cannot parse (bad status line, bad headers).
        return UpstreamProtocolError(f"malformed HTTP response: {exc.message}", node=node)
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientConnectionError | OSError):
        return UpstreamConnectError(f"connection failed: {exc!r}", node=node)
    return UpstreamProtocolError(f"HTTP client error: {exc!r}", node=node)


_FOREIGN = (aiohttp.ClientError, OSError)


def _release_or_close(resp: aiohttp.ClientResponse) -> None:
    """Give a fully read connection back to the pool; close one with unread bytes."""
    if resp.content.at_eof():
        resp.release()
    else:
        resp.close()


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while size < cap:  # bounded: each pass reads ≥ 1 byte or ends
        data = await resp.content.read(cap - size)
        if not data:
            break
        parts.append(data)
        size += len(data)
    return b"".join(parts)


def _buffered(content: aiohttp.StreamReader) -> bytes:
    """What ``content`` had received when its connection was lost. aiohttp's reader raises the
    lost connection before it hands over bytes it had already buffered (``readany`` checks its
    exception first), so a stream cut right after its last chunk would lose that chunk; this reads
    them through the reader's own buffered-read (no public call returns them once it has failed)."""
    read_nowait = getattr(content, "_read_nowait", None)
    if not getattr(content, "_buffer", None) or read_nowait is None:
        return b""
    try:
        return bytes(read_nowait(-1))
    except Exception:   # a reader of another shape: nothing to add
        return b""


class UpstreamResponse:
    """A 2xx response whose headers and first chunk have arrived (the commit point).

    ``started_at``, ``headers_at`` and ``first_chunk_at`` are ``clock.monotonic()`` readings
    (TTFT = ``first_chunk_at - started_at``). Use as ``async with response:`` so it is always
    closed; :meth:`aclose` is idempotent.
    """

    __slots__ = (
        "_closed", "_cut", "_eof", "_loop", "_read_at", "_resp", "_timed_out", "_timeouts", "_timer",
        "_total_deadline", "first_chunk", "first_chunk_at", "headers", "headers_at", "node", "started_at", "status",
    )

    def __init__(
        self, resp: aiohttp.ClientResponse, first_chunk: bytes, *, node: str, timeouts: TimeoutConfig,
        total_deadline: float, started_at: float, headers_at: float, first_chunk_at: float,
    ) -> None:
        self._resp = resp
        self._timeouts = timeouts
        self._total_deadline = total_deadline  # event-loop time
        self._eof = not first_chunk
        self._closed = False
        self._loop = asyncio.get_running_loop()
        self._read_at: float | None = None           # loop time the pending read started
        self._timer: asyncio.TimerHandle | None = None
        self._timed_out: str | None = None           # "idle" | "total" once the watchdog fired
        self._cut: BaseException | None = None       # a cut held back while its last bytes are relayed
        self.status: int = resp.status
        self.headers: Mapping[str, str] = resp.headers
        self.first_chunk = first_chunk
        self.node = node
        self.started_at = started_at
        self.headers_at = headers_at
        self.first_chunk_at = first_chunk_at
        if self._eof:
            _release_or_close(resp)

    @property
    def eof(self) -> bool:
        """True once the whole body has been read."""
        return self._eof

    def chunks(self) -> AsyncIterator[bytes]:
        """The rest of the body (after ``first_chunk``), chunk by chunk as received.

        Raises :class:`UpstreamTimeout` (``idle`` / ``total``) or :class:`UpstreamConnectError`
        (cut) and closes the connection when it does.
        """
        return _ChunkIterator(self)

    async def read_rest(self, *, max_bytes: int = _MAX_BODY_BYTES) -> bytes:
        """``first_chunk`` plus the rest of the body (non-stream), under the same timers.

        A body over ``max_bytes`` is an :class:`UpstreamProtocolError`.
        """
        parts = [self.first_chunk]
        size = len(self.first_chunk)
        while size <= max_bytes:  # bounded by total_s and max_bytes
            data = await self.next_chunk()
            if not data:
                return b"".join(parts)
            size += len(data)
            parts.append(data)
        await self.aclose()
        raise UpstreamProtocolError(f"response body over {max_bytes} bytes", node=self.node)

    async def next_chunk(self) -> bytes:
        """The next body chunk, or b"" at the end of the body; raises as :meth:`chunks` does. The
        gateway's relay calls it directly: one coroutine frame fewer to resume per chunk than
        :meth:`chunks`' iterator, and no ``StopAsyncIteration`` at the end.

        The idle and total timers are one watchdog per response (:meth:`_watchdog`), not a timeout
        context per chunk: a read only notes when it started, and the watchdog, when it fires,
        closes the connection if a read has waited ``idle_s`` (or the total deadline passed).
        """
        if self._eof:
            return b""
        if self._cut is not None:   # the bytes before the cut went out at the last read: now the cut
            exc, self._cut = self._cut, None
            await self.aclose()
            raise _map_error(exc, self.node) from exc
        if self._closed:
            if self._timed_out is not None:
                raise UpstreamTimeout(f"{self._timed_out} timeout", phase=self._timed_out, node=self.node)
            raise UpstreamConnectError("response already closed", node=self.node)
        loop = self._loop
        now = loop.time()
        if now >= self._total_deadline:
            await self.aclose()
            raise UpstreamTimeout("total timeout", phase="total", node=self.node)
        self._read_at = now
        if self._timer is None:
            self._timer = loop.call_at(min(now + self._timeouts.idle_s, self._total_deadline), self._watchdog)
        try:
            data = await self._resp.content.readany()
        except _FOREIGN as exc:
            self._read_at = None
            left = _buffered(self._resp.content) if self._timed_out is None else b""
            if left:
                self._cut = exc   # relay what the node sent before it cut; raise at the next read
                return left
            if self._timed_out is not None:
                raise UpstreamTimeout(f"{self._timed_out} timeout", phase=self._timed_out, node=self.node) from exc
            await self.aclose()
            raise _map_error(exc, self.node) from exc
        except BaseException:
            self._read_at = None
            raise
        self._read_at = None
        if self._timed_out is not None:   # closed by the watchdog as the read returned
            raise UpstreamTimeout(f"{self._timed_out} timeout", phase=self._timed_out, node=self.node)
        if not data:
            self._eof = True
            self._disarm()
            self._resp.release()  # the body is complete: the connection can be reused
        return data

    def _watchdog(self) -> None:
        """The idle / total timer: closes the connection when a read has waited too long."""
        self._timer = None
        if self._closed or self._eof:
            return
        started = self._read_at
        if started is None:
            return   # no read waiting (the client is slow to take the last chunk): re-armed by the next read
        idle_at = started + self._timeouts.idle_s
        due = min(idle_at, self._total_deadline)
        now = self._loop.time()
        if now < due:
            self._timer = self._loop.call_at(due, self._watchdog)
            return
        self._timed_out = "idle" if idle_at < self._total_deadline else "total"
        self.close()

    def _disarm(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def close(self) -> None:
        """Close the connection now, unless the body was read to the end (then it is pooled).

        Safe to call while another task waits in :meth:`chunks`: that read then fails with
        :class:`UpstreamConnectError` (how the gateway stops streams at shutdown)."""
        if self._closed:
            return
        self._closed = True
        self._disarm()
        _release_or_close(self._resp)

    async def aclose(self) -> None:
        """:meth:`close`, for ``async with`` and awaiting callers."""
        self.close()

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class _ChunkIterator:
    """A plain iterator object (not an async generator): nothing to finalise if abandoned."""

    __slots__ = ("_response",)

    def __init__(self, response: UpstreamResponse) -> None:
        self._response = response

    def __aiter__(self) -> _ChunkIterator:
        return self

    async def __anext__(self) -> bytes:
        data = await self._response.next_chunk()
        if not data:
            raise StopAsyncIteration
        return data


class Upstream:
    """The pooled client for all nodes; ``start()`` once, ``open()`` per attempt, ``close()`` at exit.

    ``keepalive_timeout_s`` is kept below uvicorn's 5 s default (vLLM, SGLang) so the client, not
    the node, retires an idle pooled connection, avoiding the race where a request is written to a
    socket the node is closing.
    """

    def __init__(self, *, limit: int = 4096, limit_per_host: int = 1024, clock: Clock | None = None,
                 keepalive_timeout_s: float = 4.0, guard: PolicySource | None = None,
                 resolver: AbstractResolver | None = None) -> None:
        self._limit = limit
        # The network policy at connect time (fleet/netguard.py; None: unchecked) over ``resolver``
        # (default: aiohttp's threaded getaddrinfo).
        self._guard = guard
        self._resolver = resolver
        self._limit_per_host = limit_per_host
        self._keepalive_timeout_s = keepalive_timeout_s
        self._clock: Clock = clock or SystemClock()
        self._session: aiohttp.ClientSession | None = None
        # The last attempt's aiohttp timeout (frozen, so shared): attempts mostly repeat the
        # configured connect timeout; one cut by a near deadline makes its own.
        self._client_timeout_last = aiohttp.ClientTimeout(total=None, sock_connect=None)

    async def start(self) -> None:
        """Create the session and its connection pool (idempotent)."""
        if self._session is not None:
            return
        connector = aiohttp.TCPConnector(
            limit=self._limit,
            limit_per_host=self._limit_per_host,
            keepalive_timeout=self._keepalive_timeout_s,
            ttl_dns_cache=10,
            resolver=GuardedResolver(self._guard, self._resolver) if self._guard is not None else self._resolver,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),  # a node must not plant state in the gateway
            auto_decompress=False,                # relay bytes as sent; the client decompresses
            trust_env=False,                      # no proxy / netrc from the environment
            timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=_SKIP_AUTO_HEADERS,
            raise_for_status=False,
        )

    async def close(self) -> None:
        """Close the pool and every connection in it (idempotent)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __aenter__(self) -> Upstream:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _client_timeout(self, connect_s: float) -> aiohttp.ClientTimeout:
        t = self._client_timeout_last
        if t.sock_connect != connect_s:
            t = self._client_timeout_last = aiohttp.ClientTimeout(total=None, sock_connect=connect_s)
        return t

    async def open(self, url: str, body: bytes, *, headers: Mapping[str, str], timeouts: TimeoutConfig,
                   node: str, method: str = "POST", tls: NodeTLS | None = None) -> UpstreamResponse:
        """Send one request and wait for the commit point (2xx status and first body chunk).

        ``tls``: the node's block (config/tls.py): its cached context and ``server_name`` for an
        https URL (None: the system CAs). The pool keys connections by context, so nodes with
        different certificates never share one.

        Raises :class:`UpstreamConnectError`, :class:`UpstreamTimeout` (``connect``,
        ``first_token`` or ``total``), :class:`UpstreamStatusError` or
        :class:`UpstreamProtocolError`; never an aiohttp exception.
        """
        session = self._session
        if session is None:
            raise RuntimeError("Upstream.start() was not called")
        loop = asyncio.get_running_loop()
        started_at = self._clock.monotonic()
        now = loop.time()
        total_deadline = now + timeouts.total_s
        first_deadline = now + timeouts.first_token_s
        phase = "first_token" if first_deadline <= total_deadline else "total"
        resp: aiohttp.ClientResponse | None = None
        done = False
        try:
            try:
                async with asyncio.timeout_at(min(first_deadline, total_deadline)) as tmo:
                    resp = await session.request(
                        method, url, data=body or None, headers=strip_hop_by_hop(headers), allow_redirects=False,
                        timeout=self._client_timeout(timeouts.connect_s),
                        ssl=tls.context if tls is not None else True,
                        server_hostname=tls.server_name if tls is not None else None,
                    )
                    headers_at = self._clock.monotonic()
                    if not 200 <= resp.status < 300:
                        err_body = await _read_capped(resp, MAX_ERROR_BODY_BYTES)
                        raise UpstreamStatusError(
                            resp.status, err_body, node=node,
                            retry_after_s=parse_retry_after(resp.headers.get("Retry-After"),
                                                            now=self._clock.time()),
                        )
                    first = await resp.content.readany()
                    first_at = self._clock.monotonic()
            except TimeoutError as exc:
                if isinstance(exc, aiohttp.ConnectionTimeoutError) or not tmo.expired():
                    raise _map_error(exc, node) from exc
                raise UpstreamTimeout(f"no first chunk within the {phase} timeout", phase=phase,
                                      node=node) from exc
            except _FOREIGN as exc:
                error = _map_error(exc, node)
                dropped = isinstance(exc, aiohttp.ClientOSError | aiohttp.ServerDisconnectedError)
                if dropped and url.startswith("https:") and (tls is None or tls.cert_file is None):
                    # TLS 1.3: a node refusing a client without a certificate does so after the
                    # handshake, and the client only sees the connection dropped.
                    error = UpstreamConnectError(f"{error} (an https node that drops the connection after the "
                                                 "handshake may require a client certificate: tls.cert_file)",
                                                 node=node)
                raise error from exc
            response = UpstreamResponse(
                resp, first, node=node, timeouts=timeouts, total_deadline=total_deadline,
                started_at=started_at, headers_at=headers_at, first_chunk_at=first_at,
            )
            done = True
            return response
        finally:
            # Any failure (cancellation included) before the commit point leaves nothing open.
            if not done and resp is not None:
                _release_or_close(resp)
