"""Server-sent events from a node, relayed to the client incrementally and cheaply (pure: no I/O).

The gateway relays a node's stream event by event; on the side it needs a few facts: how many
content events went by (the tokens sent when a stream is cut before its usage chunk), whether the
stream ended with ``[DONE]`` or an in-band error, and the ``usage`` numbers. Parsing every chunk's
JSON would cost a few µs per token, so:

- :class:`SSERelay` splits arbitrary byte chunks at event boundaries (a blank line) and returns
  the whole events to forward, keeping the partial tail. Line ends may be ``\n``, ``\r\n`` or
  ``\r`` (the WHATWG event-stream rules; forwarded as ``\n``); ``:`` comments and
  ``event:``/``id:``/``retry:`` fields pass; several ``data:`` lines of one event join with ``\n``.
  A line with no known field (for instance a JSON line missing its ``data:``) is an
  :class:`~inferlb.errors.UpstreamProtocolError`, and so is an event, or an unfinished tail,
  over ``max_event_bytes``: a node that never sends a blank line cannot grow the gateway's memory.
- :func:`check_payload` is the cheap validity check of each ``data`` payload: ``[DONE]`` or text
  that starts with ``{`` and ends with ``}``. That catches cut or garbled lines, the usual failure,
  without a parse.
- :func:`extract_usage` parses only the ``usage`` value (``raw_decode`` from the key onwards),
  and only when the payload names it; :func:`extract_error` only when the payload names ``error``.
- The usual read, one event of one ``data`` line naming none of ``error``, ``usage`` or ``role``,
  costs one scan for those three names and a search for ``finish_reason`` from the payload's
  end; nothing is split or parsed (docs/benchmarks.md, "Less CPU per streamed chunk").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from inferlb.errors import UpstreamProtocolError
from inferlb.jsoncodec import loads

__all__ = [
    "DONE",
    "MAX_EVENT_BYTES",
    "SSERelay",
    "Usage",
    "check_payload",
    "extract_error",
    "extract_usage",
]

DONE = b"[DONE]"
_FIELDS = frozenset({b"event", b"id", b"retry"})
_USAGE_KEY = re.compile(rb'"usage"\s*:\s*')
_FINISH_NULL = re.compile(rb'"finish_reason"\s*:\s*null')
# The names _data looks closer at: one scan finds whether any is there (a usual token chunk names
# none), where three substring searches each read the whole payload.
_NOTED = re.compile(rb'"(?:error|usage|role)"')
_DECODER = json.JSONDecoder()
MAX_EVENT_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts reported by a node."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def check_payload(payload: bytes) -> None:
    """Cheap validity check of one ``data`` payload; :class:`UpstreamProtocolError` when broken."""
    body = payload.strip()
    if body == DONE:
        return
    if not (body.startswith(b"{") and body.endswith(b"}")):
        raise UpstreamProtocolError(f"malformed JSON in SSE data: {payload[:80]!r}")


def _loads(payload: bytes) -> Any:
    try:
        return loads(payload)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UpstreamProtocolError(f"malformed JSON: {exc}") from exc


def _as_usage(value: Any) -> Usage | None:
    if not isinstance(value, dict):
        return None  # "usage": null on ordinary chunks
    if "prompt_tokens" not in value and "input_tokens" in value:   # the Responses API's names
        prompt, completion = value.get("input_tokens"), value.get("output_tokens", 0)
    else:
        prompt = value.get("prompt_tokens")
        completion = value.get("completion_tokens", 0)  # embeddings report prompt tokens only
    if isinstance(prompt, bool) or isinstance(completion, bool):
        raise UpstreamProtocolError("usage counts must be integers")
    if not isinstance(prompt, int) or not isinstance(completion, int) or prompt < 0 or completion < 0:
        raise UpstreamProtocolError("usage counts must be integers >= 0")
    return Usage(prompt, completion)


def extract_usage(payload: bytes) -> Usage | None:
    """``usage`` of an OpenAI stream chunk or JSON body, or None when absent / null. The
    Responses API's ``input_tokens`` / ``output_tokens`` count as prompt / completion tokens.

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
    """The ``error`` object of an in-band error event (``{"error": {...}}``, or the Responses API's
    ``error`` / ``response.failed`` events), else None."""
    if b'"error"' not in payload:
        return None
    obj = _loads(payload)
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("error"), dict | str):
        err = obj["error"]
        return err if isinstance(err, dict) else {"message": err}
    kind = obj.get("type")
    if kind == "error":   # the Responses API's error event: {"type": "error", "code", "message"}
        return {"message": obj.get("message"), "code": obj.get("code")}
    if kind == "response.failed":
        resp = obj.get("response")
        err = resp.get("error") if isinstance(resp, dict) else None
        return err if isinstance(err, dict) else {"message": "response.failed"}
    return None


def _carries_no_token(payload: bytes) -> bool:
    """True for a closing chunk that only names its ``finish_reason`` (``"delta": {}`` or
    ``"text": ""``): llama.cpp ends every stream with one, while vLLM's last token chunk carries
    both the token and the reason. Only a chunk with a non-null ``finish_reason`` is parsed (one
    per choice per stream).

    Every token chunk of an OpenAI stream names ``"finish_reason": null`` near its end, so the key
    is looked for from the end (``rfind``: a few bytes scanned instead of the whole payload) and
    the value read where it stands; only when that last one is not ``null`` (a closing chunk, or
    several choices) does the regex look for a ``null`` one anywhere, as before."""
    at = payload.rfind(b'"finish_reason"')
    if at < 0:
        return False
    if _FINISH_NULL.match(payload, at) is not None or _FINISH_NULL.search(payload) is not None:
        return False
    try:
        doc = loads(payload)
    except ValueError:
        return False
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices:
        return False
    for c in choices:
        if not isinstance(c, dict):
            return False
        delta = c.get("delta")
        part = delta if isinstance(delta, dict) else c
        if part.get("text") or part.get("content") or part.get("tool_calls") or part.get("reasoning_content"):
            return False
    return True


def _no_choices(payload: bytes) -> bool:
    """True for a usage-only chunk (``"choices": []``), which the client did not ask for."""
    try:
        doc = loads(payload)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("choices") == []


class SSERelay:
    """Feed a node's body chunks with :meth:`feed`; get back the whole events to forward.

    Per event: comments and ``event:``/``id:``/``retry:`` lines pass unchecked; a ``data`` payload
    gets :func:`check_payload`; only payloads that name ``"error"`` or ``"usage"`` are parsed. A
    usage-only chunk is dropped when ``hide_usage`` (the gateway asked for usage on the client's
    behalf). After the stream: :attr:`done` (``[DONE]`` seen), :attr:`usage` (the last usage
    seen), :attr:`content_events` (data events other than ``[DONE]``, usage-only chunks and the
    role-only opening chunk: about one per token on vLLM / SGLang / the emulator, plus the closing
    ``finish_reason`` chunk), :attr:`incomplete` (bytes of an unfinished event are held back).

    :meth:`feed` raises :class:`UpstreamProtocolError` on a malformed line or payload, an in-band
    error event, or an event over ``max_event_bytes``; the good events of the same chunk that came
    before the bad one are then in :attr:`unsent`, still to forward.

    ``responses=True`` reads a Responses API stream (typed events, no ``[DONE]``): it is done at
    ``response.completed`` or ``response.incomplete``, its content events are the
    ``response.output_text.delta`` ones, and its usage comes with the final response.
    """

    __slots__ = ("_parts", "_size", "content_events", "done", "hide_usage", "max_event_bytes", "responses",
                 "unsent", "usage")

    def __init__(self, *, hide_usage: bool = False, responses: bool = False,
                 max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.hide_usage = hide_usage
        self.responses = responses
        self.max_event_bytes = max_event_bytes
        self._parts: list[bytes] = []    # the unfinished tail, in pieces (joined once a line ends)
        self._size = 0
        self.done = False
        self.usage: Usage | None = None
        self.content_events = 0
        self.unsent = b""

    @property
    def incomplete(self) -> bool:
        """True when bytes of an unfinished event are held (the stream stopped mid-event)."""
        return any(p.strip() for p in self._parts)

    def feed(self, chunk: bytes) -> bytes:
        """The events completed by ``chunk`` (possibly b""), each ending in a blank line."""
        if not self._parts and chunk.endswith(b"\n\n") and b"\r" not in chunk:
            # The usual case: the chunk is whole events (a node writes one event per write).
            return self._relay(chunk)
        if not chunk:
            return b""
        self._size += len(chunk)
        if b"\n" not in chunk and b"\r" not in chunk:
            # No line end: nothing can complete; keep the piece (linear, however small the chunks).
            self._parts.append(chunk)
            if self._size > self.max_event_bytes:
                raise UpstreamProtocolError(f"SSE event over {self.max_event_bytes} bytes")
            return b""
        if self._parts:
            self._parts.append(chunk)
            buf = b"".join(self._parts)
            self._parts = []
        else:
            buf = chunk
        if b"\r" in buf:
            # A trailing CR may be the first half of a CRLF split across chunks: keep it back.
            held = buf.endswith(b"\r")
            if held:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if held:
                buf += b"\r"
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            tail, events = buf, b""
        else:
            tail, events = buf[cut + 2:], buf[:cut + 2]
        if tail:
            self._parts.append(tail)
        self._size = len(tail)
        if self._size > self.max_event_bytes:
            raise UpstreamProtocolError(f"SSE event over {self.max_event_bytes} bytes")
        if not events:
            return b""
        return self._relay(events)

    def finish(self) -> bytes:
        """End of the body: the events a held trailing CR completes (a lone-CR stream), if any.
        Whatever is still held afterwards is an unfinished event (:attr:`incomplete`)."""
        if not self._parts or not self._parts[-1].endswith(b"\r"):
            return b""
        return self.feed(b"\n")

    def _relay(self, events: bytes) -> bytes:
        """Check each event of ``events`` (whole events); returns what to forward: ``events``
        itself unless an event is dropped."""
        if events.startswith(b"data: ") and events.find(b"\n") == len(events) - 2:
            # One event of one data line, the usual read (a node writes an event per token): no split.
            try:
                if len(events) - 2 > self.max_event_bytes:
                    raise UpstreamProtocolError(f"SSE event over {self.max_event_bytes} bytes")
                return events if self._data(events[6:-2]) else b""
            except UpstreamProtocolError:
                self.unsent = b""
                raise
        parts = events.split(b"\n\n")
        kept: list[bytes] | None = None      # built only once an event is dropped
        for i in range(len(parts) - 1):      # the last part is b"" (events end with a blank line)
            ev = parts[i]
            if not ev:
                continue
            try:
                if len(ev) > self.max_event_bytes:
                    raise UpstreamProtocolError(f"SSE event over {self.max_event_bytes} bytes")
                if ev.startswith(b"data: ") and b"\n" not in ev:   # the usual event: one data line
                    forward = self._data(ev[6:])
                else:
                    payload = self._payload(ev)
                    forward = True if payload is None else self._data(payload)
            except UpstreamProtocolError:
                good = parts[:i] if kept is None else kept
                self.unsent = b"".join(e + b"\n\n" for e in good if e)
                raise
            if not forward and kept is None:
                kept = parts[:i]
            elif forward and kept is not None:
                kept.append(ev)
        if kept is None:
            return events
        return b"".join(e + b"\n\n" for e in kept if e)

    @staticmethod
    def _payload(ev: bytes) -> bytes | None:
        """The event's data (None for an event without data lines); checks every line's field."""
        if b"\n" not in ev:   # the usual case: one line
            if ev.startswith(b"data:"):
                return ev[6:] if ev.startswith(b"data: ") else ev[5:]
            if ev.startswith(b":") or ev.split(b":", 1)[0] in _FIELDS:
                return None
            raise UpstreamProtocolError(f"malformed SSE line: {ev[:80]!r}")
        data: list[bytes] = []
        for line in ev.split(b"\n"):
            if line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
            elif line.startswith(b":") or line.split(b":", 1)[0] in _FIELDS:
                continue
            else:
                raise UpstreamProtocolError(f"malformed SSE line: {line[:80]!r}")
        return b"\n".join(data) if data else None

    def _data(self, payload: bytes) -> bool:
        """Notes what ``payload`` says; False when its event is not forwarded."""
        if payload.strip() == DONE:
            self.done = True
            return True
        check_payload(payload)
        if self.responses:
            return self._responses_data(payload)
        if _NOTED.search(payload) is None:   # no error, usage or role: the usual token chunk
            if not _carries_no_token(payload):
                self.content_events += 1
            return True
        if b'"error"' in payload and extract_error(payload) is not None:
            raise UpstreamProtocolError("the node sent an in-band error event")
        if b'"usage"' in payload:
            usage = extract_usage(payload)
            if usage is not None:
                self.usage = usage
                if _no_choices(payload):
                    return not self.hide_usage
        # A chat stream's opening chunk carries the role, no token; llama.cpp's closing chunk only
        # its finish_reason.
        if b'"role"' not in payload and not _carries_no_token(payload):
            self.content_events += 1
        return True

    def _responses_data(self, payload: bytes) -> bool:
        if b'"response.output_text.delta"' in payload:
            self.content_events += 1
            return True
        if b'"error"' in payload and extract_error(payload) is not None:
            raise UpstreamProtocolError("the node sent an in-band error event")
        if b'"response.completed"' in payload or b'"response.incomplete"' in payload:
            self.done = True
            usage = extract_usage(payload)
            if usage is not None:
                self.usage = usage
        return True
