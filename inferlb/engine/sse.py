"""Server-sent events from a node, read incrementally and cheaply (pure: no I/O).

The gateway relays a node's stream byte for byte; on the side it needs three facts: how many
events went by, whether the stream ended with ``[DONE]`` or an in-band error, and the ``usage``
numbers. Parsing every chunk's JSON would cost a few µs per token, so:

- :class:`SSEDecoder` splits arbitrary byte chunks into complete ``data:`` payloads (the WHATWG
  event-stream rules: ``\\n``, ``\\r\\n`` or ``\\r`` line ends, a blank line ends an event, several
  ``data:`` lines join with ``\\n``, ``:`` comments and ``event:``/``id:``/``retry:`` fields pass).
  A line with no known field (for instance a JSON line missing its ``data:``) is an
  :class:`~inferlb.engine.errors.UpstreamProtocolError`, as is an event over ``max_event_bytes``.
- :func:`check_payload` is the cheap validity check: ``[DONE]`` or text that starts with ``{``
  and ends with ``}``. That catches cut or garbled lines, the usual failure, without a parse.
- :func:`extract_usage` parses only the ``usage`` value (``raw_decode`` from the key onwards),
  and only when the payload names it; :func:`extract_error` only when the payload names ``error``.
- :class:`StreamScanner` combines them. With ``strict_json=True`` it parses every payload fully.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .errors import UpstreamProtocolError

__all__ = [
    "DONE",
    "SSEDecoder",
    "StreamScanner",
    "Usage",
    "check_payload",
    "extract_error",
    "extract_usage",
]

DONE = b"[DONE]"
_FIELDS = frozenset({b"event", b"id", b"retry"})
_USAGE_KEY = re.compile(rb'"usage"\s*:\s*')
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts reported by a node."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class SSEDecoder:
    """Feed raw bytes with :meth:`feed`; get the ``data`` payload of each completed event.

    Bounded memory: an event (or a line) longer than ``max_event_bytes`` raises
    :class:`UpstreamProtocolError` instead of growing the buffer.
    """

    __slots__ = ("_buf", "_data", "_data_len", "max_event_bytes")

    def __init__(self, *, max_event_bytes: int = 8 * 1024 * 1024) -> None:
        self.max_event_bytes = max_event_bytes
        self._buf = b""
        self._data: list[bytes] = []
        self._data_len = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """Payloads of the events completed by ``chunk`` (possibly none), in order."""
        if not chunk:
            return []
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            # A trailing CR may be the first half of a CRLF split across chunks: keep it back.
            held = buf.endswith(b"\r")
            if held:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if held:
                buf += b"\r"
        lines = buf.split(b"\n")
        self._buf = lines.pop()  # the unfinished line (b"" when chunk ended on a line end)
        out: list[bytes] = []
        for line in lines:
            self._line(line, out)
        if len(self._buf) + self._data_len > self.max_event_bytes:
            raise UpstreamProtocolError(f"SSE event over {self.max_event_bytes} bytes")
        return out

    def close(self) -> list[bytes]:
        """End of stream: an event not closed by a blank line is dropped, per the SSE rules.

        Returns the payloads completed by a trailing lone CR, if any.
        """
        out: list[bytes] = []
        if self._buf.endswith(b"\r"):
            self._line(self._buf[:-1], out)
        self._buf = b""
        self._data.clear()
        self._data_len = 0
        return out

    @property
    def pending(self) -> bool:
        """True when bytes of an unfinished event are buffered (the stream stopped mid-event)."""
        return bool(self._buf.strip(b"\r")) or bool(self._data)

    def _line(self, line: bytes, out: list[bytes]) -> None:
        if not line:
            if self._data:
                out.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                self._data.clear()
                self._data_len = 0
            return
        if line.startswith(b"data:"):
            value = line[6:] if line.startswith(b"data: ") else line[5:]
            self._data.append(value)
            self._data_len += len(value) + 1
            return
        if line.startswith(b":"):
            return  # comment / keep-alive
        name = line.split(b":", 1)[0]
        if name not in _FIELDS:
            raise UpstreamProtocolError(f"malformed SSE line: {line[:80]!r}")


def check_payload(payload: bytes) -> None:
    """Cheap validity check of one ``data`` payload; :class:`UpstreamProtocolError` when broken."""
    body = payload.strip()
    if body == DONE:
        return
    if not (body.startswith(b"{") and body.endswith(b"}")):
        raise UpstreamProtocolError(f"malformed JSON in SSE data: {payload[:80]!r}")


def _loads(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UpstreamProtocolError(f"malformed JSON: {exc}") from exc


def _as_usage(value: Any) -> Usage | None:
    if not isinstance(value, dict):
        return None  # "usage": null on ordinary chunks
    prompt = value.get("prompt_tokens")
    completion = value.get("completion_tokens", 0)  # embeddings report prompt tokens only
    if isinstance(prompt, bool) or isinstance(completion, bool):
        raise UpstreamProtocolError("usage counts must be integers")
    if not isinstance(prompt, int) or not isinstance(completion, int) or prompt < 0 or completion < 0:
        raise UpstreamProtocolError("usage counts must be integers >= 0")
    return Usage(prompt, completion)


def extract_usage(payload: bytes) -> Usage | None:
    """``usage`` of an OpenAI stream chunk or JSON body, or None when absent / null.

    Only the value after the ``"usage"`` key is decoded; a payload that does not name it costs one
    substring search. An unescaped ``"usage"`` followed by ``:`` can only be a key, since quotes
    inside JSON strings are escaped. Raises :class:`UpstreamProtocolError` when the usage value is
    not valid JSON or not made of non-negative integers.
    """
    match = _USAGE_KEY.search(payload)
    if match is None:
        return None
    try:
        tail = payload[match.end():].decode()
        value, _ = _DECODER.raw_decode(tail)
    except ValueError as exc:
        raise UpstreamProtocolError(f"malformed usage JSON: {exc}") from exc
    return _as_usage(value)


def extract_error(payload: bytes) -> dict[str, Any] | None:
    """The ``error`` object of an in-band error event (``{"error": {...}}``), else None."""
    if b'"error"' not in payload:
        return None
    obj = _loads(payload)
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict | str):
        err = obj["error"]
        return err if isinstance(err, dict) else {"message": err}
    return None


class StreamScanner:
    """Watches a relayed stream: counts events, notes ``[DONE]``, in-band errors and usage.

    ``feed`` raises :class:`UpstreamProtocolError` on a malformed line or payload; the caller
    treats that like a cut (docs/reliability.md §5.6). After ``[DONE]`` further events are a protocol
    error too, since a client would never see them.
    """

    __slots__ = ("_decoder", "done", "error", "events", "strict_json", "usage")

    def __init__(self, *, strict_json: bool = False, max_event_bytes: int = 8 * 1024 * 1024) -> None:
        self._decoder = SSEDecoder(max_event_bytes=max_event_bytes)
        self.strict_json = strict_json
        self.events = 0                       # data events, [DONE] excluded
        self.done = False
        self.usage: Usage | None = None       # the last usage seen (vLLM may send it on every chunk)
        self.error: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        for payload in self._decoder.feed(chunk):
            self._payload(payload)

    def close(self) -> None:
        """End of body: processes a trailing event, if a lone CR completed one."""
        for payload in self._decoder.close():
            self._payload(payload)

    @property
    def complete(self) -> bool:
        """The stream ended properly: ``[DONE]`` seen and no error event."""
        return self.done and self.error is None

    def _payload(self, payload: bytes) -> None:
        if self.done:
            raise UpstreamProtocolError("data after [DONE]")
        if payload.strip() == DONE:
            self.done = True
            return
        self.events += 1
        if self.strict_json:
            obj = _loads(payload)
            if not isinstance(obj, dict):
                raise UpstreamProtocolError("SSE data is not a JSON object")
            if "usage" in obj and obj["usage"] is not None:
                self.usage = _as_usage(obj["usage"])
            err = obj.get("error")
            if isinstance(err, dict | str):
                self.error = err if isinstance(err, dict) else {"message": err}
            return
        check_payload(payload)
        usage = extract_usage(payload)
        if usage is not None:
            self.usage = usage
        error = extract_error(payload)
        if error is not None:
            self.error = error
