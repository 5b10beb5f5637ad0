"""Message and prompt checks for :mod:`inferlb.api.validation` (pure, no I/O).

``messages`` (chat) and ``prompt`` / ``input`` (completions, embeddings) are validated here while
the prompt text is counted in UTF-8 bytes (:class:`_Text`); the entry points in
:mod:`inferlb.api.validation` call :func:`_check_messages` and :func:`_check_prompt`.
"""

from __future__ import annotations

from typing import Any, Final, NoReturn

from inferlb.api import validation_fields as f
from inferlb.api.validation_fields import fail as _fail

# The underscored names are what validation.py calls; nothing outside api/validation*.py should.
__all__ = ["_Text", "_check_messages", "_check_prompt"]

_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_MEDIA_PARTS: Final = frozenset({"image_url", "video_url", "audio_url"})
_OPAQUE_PARTS: Final = frozenset({"image_embeds", "file"})
_NO_CONTENT_OK: Final = ("tool_calls", "function_call", "audio", "refusal")  # assistant content may be null


class _Text:
    """Counts UTF-8 bytes of prompt text; keeps the pieces only when a tokenizer wants them."""

    __slots__ = ("nbytes", "parts")

    def __init__(self, keep: bool) -> None:
        self.nbytes = 0
        self.parts: list[str] | None = [] if keep else None

    def add(self, text: str) -> bool:
        """Count ``text``; false if it holds a lone surrogate (not encodable as UTF-8)."""
        if text.isascii():
            self.nbytes += len(text)
        else:
            try:
                self.nbytes += len(text.encode("utf-8"))
            except UnicodeEncodeError:
                return False
        if self.parts is not None:
            self.parts.append(text)
        return True

    def joined(self) -> str | None:
        return None if self.parts is None else "\n".join(self.parts)


def _surrogate(param: str) -> NoReturn:
    _fail(f"'{f.clip(param)}' contains a lone UTF-16 surrogate", f.clip(param, 256), "invalid_encoding")


# -- messages ------------------------------------------------------------------------------------


def _need_str(obj: dict[str, Any], key: str, param: str, *, optional: bool = False) -> None:
    value = obj.get(key)
    if value is None and optional:
        return
    if type(value) is not str:
        if value is None:
            _fail(f"'{param}' is required", param, "missing_required_parameter")
        _fail(f"'{param}' must be a string, got {f.json_type(value)}", param, "invalid_type")


def _check_part(part: object, p: str, text: _Text) -> None:
    if type(part) is not dict:
        _fail(f"'{p}' must be a content part object, got {f.json_type(part)}", p, "invalid_type")
    kind = part.get("type")
    if type(kind) is not str:
        _need_str(part, "type", f"{p}.type")
    if kind == "text":
        _need_str(part, "text", f"{p}.text")
        if not text.add(part["text"]):
            _surrogate(f"{p}.text")
    elif kind == "refusal":
        _need_str(part, "refusal", f"{p}.refusal")
    elif kind in _MEDIA_PARTS:
        ref = part.get(kind)
        if type(ref) is not str:  # vLLM also takes the bare URL string
            if type(ref) is not dict:
                _fail(f"'{p}.{kind}' must be an object with a 'url'", f"{p}.{kind}", "invalid_type")
            _need_str(ref, "url", f"{p}.{kind}.url")
    elif kind == "input_audio":
        audio = part.get("input_audio")
        if type(audio) is not dict:
            _fail(f"'{p}.input_audio' must be an object", f"{p}.input_audio", "invalid_type")
        _need_str(audio, "data", f"{p}.input_audio.data")
        _need_str(audio, "format", f"{p}.input_audio.format")
    elif kind not in _OPAQUE_PARTS:
        _fail(f"'{p}.type' is not a known content part type: '{f.clip(str(kind))}'", f"{p}.type")


def _check_tool_calls(calls: object, p: str) -> None:
    if type(calls) is not list:
        _fail(f"'{p}' must be an array, got {f.json_type(calls)}", p, "invalid_type")
    for k, call in enumerate(calls):
        cp = f"{p}[{k}]"
        if type(call) is not dict:
            _fail(f"'{cp}' must be an object, got {f.json_type(call)}", cp, "invalid_type")
        fn = call.get("function")
        if type(fn) is not dict:
            _fail(f"'{cp}.function' must be an object", f"{cp}.function", "invalid_type")
        _need_str(fn, "name", f"{cp}.function.name")
        _need_str(fn, "arguments", f"{cp}.function.arguments", optional=True)


def _check_message(msg: object, i: int, text: _Text) -> None:
    """One message; paths are only formatted on failure (this runs per message per request)."""
    if type(msg) is not dict:
        _fail(f"'messages[{i}]' must be an object, got {f.json_type(msg)}", f"messages[{i}]", "invalid_type")
    role = msg.get("role")
    if type(role) is not str or role not in _ROLES:
        _need_str(msg, "role", f"messages[{i}].role")
        _fail(f"'messages[{i}].role' must be one of {', '.join(sorted(_ROLES))}", f"messages[{i}].role")
    content = msg.get("content")
    if type(content) is str:
        if not text.add(content):
            _surrogate(f"messages[{i}].content")
    elif type(content) is list:
        cp = f"messages[{i}].content"
        if not content:
            _fail(f"'{cp}' must not be an empty array", cp, "empty_array")
        for j, part in enumerate(content):
            _check_part(part, f"{cp}[{j}]", text)
    elif content is not None:
        got = f.json_type(content)
        cp = f"messages[{i}].content"
        _fail(f"'{cp}' must be a string or an array of content parts, got {got}", cp, "invalid_type")
    elif role != "function" and not (role == "assistant" and any(msg.get(k) is not None for k in _NO_CONTENT_OK)):
        cp = f"messages[{i}].content"
        _fail(f"'{cp}' is required for a '{role}' message", cp, "missing_required_parameter")
    if len(msg) != 2 or "content" not in msg:  # most messages are just role + content
        if "name" in msg:
            _need_str(msg, "name", f"messages[{i}].name", optional=True)
        if "tool_call_id" in msg:
            _need_str(msg, "tool_call_id", f"messages[{i}].tool_call_id", optional=True)
        if msg.get("tool_calls") is not None:
            _check_tool_calls(msg["tool_calls"], f"messages[{i}].tool_calls")


def _check_messages(body: dict[str, Any], text: _Text, max_messages: int) -> None:
    messages = body.get("messages")
    if messages is None:
        _fail("'messages' is required", "messages", "missing_required_parameter")
    if type(messages) is not list:
        _fail(f"'messages' must be an array, got {f.json_type(messages)}", "messages", "invalid_type")
    if not messages:
        _fail("'messages' must not be empty", "messages", "empty_array")
    if len(messages) > max_messages:
        _fail(f"'messages' has more than {max_messages} items", "messages", "array_above_max_length")
    for i, msg in enumerate(messages):
        _check_message(msg, i, text)


# -- prompt / input ------------------------------------------------------------------------------


def _check_ids(ids: list[Any], p: str) -> int:
    """Token ids: a non-empty list of integers in [0, 2³¹−1]; returns the count."""
    if not ids:
        _fail(f"'{p}' must not be empty", p, "empty_array")
    if set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) > f.INT32_MAX:  # bool is not int
        k = next(k for k, t in enumerate(ids) if type(t) is not int or not 0 <= t <= f.INT32_MAX)
        _fail(f"'{p}[{k}]' must be a token id (integer from 0 to {f.INT32_MAX})", f"{p}[{k}]")
    return len(ids)


def _check_prompt(body: dict[str, Any], key: str, text: _Text, max_items: int) -> int:
    """``prompt`` / ``input``: string | [string] | [int] | [[int]], non-empty, no empty items.

    Returns the number of tokens given as ids."""
    value = body.get(key)
    if type(value) is str:
        if not value:
            _fail(f"'{key}' must not be empty", key, "empty_string")
        if not text.add(value):
            _surrogate(key)
        return 0
    if value is None:
        _fail(f"'{key}' is required", key, "missing_required_parameter")
    if type(value) is not list:
        _fail(f"'{key}' must be a string or an array, got {f.json_type(value)}", key, "invalid_type")
    if not value:
        _fail(f"'{key}' must not be empty", key, "empty_array")
    first = value[0]
    if type(first) is int:
        return _check_ids(value, key)
    if len(value) > max_items:
        _fail(f"'{key}' has more than {max_items} items", key, "array_above_max_length")
    if type(first) is str:
        for i, item in enumerate(value):
            if type(item) is not str:
                _fail(f"'{key}[{i}]' must be a string, got {f.json_type(item)}", f"{key}[{i}]", "invalid_type")
            if not item:
                _fail(f"'{key}[{i}]' must not be empty", f"{key}[{i}]", "empty_string")
            if not text.add(item):
                _surrogate(f"{key}[{i}]")
        return 0
    if type(first) is list:
        total = 0
        for i, item in enumerate(value):
            if type(item) is not list:
                _fail(f"'{key}[{i}]' must be an array of token ids", f"{key}[{i}]", "invalid_type")
            total += _check_ids(item, f"{key}[{i}]")
        return total
    _fail(f"'{key}' must be a string, an array of strings or of token ids", f"{key}[0]", "invalid_type")
