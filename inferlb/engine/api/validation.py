"""Client-input validation for the OpenAI-compatible endpoints (pure: no I/O, no FastAPI).

Contract (docs/architecture.md, "Contracts worth keeping"; docs/reliability.md §7, §8, §9.4):

* Validate the fields the gateway reads (``model``, ``messages`` / ``prompt`` / ``input``,
  ``max_tokens`` and its alias ``max_completion_tokens``, ``n``, ``stream``, ``stream_options``)
  and the well-known OpenAI fields whose malformed values crash nodes (sampling numbers, ``stop``,
  ``logit_bias``, ``response_format``, ``tools``, ``tool_choice``, ``seed``, ``user``).
* Pass every other field through untouched: :attr:`ValidatedRequest.body` *is* the client's
  dict, not a copy, so vLLM's ``ignore_eos``, ``top_k``, ``min_tokens``, ``priority``… reach the
  node exactly as sent.
* Never honour fields that redirect traffic or credentials: ``api_base``, ``base_url``,
  ``api_key``, ``extra_headers`` and the like are **rejected** with a 400 naming the field, at the
  top level and nested (catalog row 31 allows stripping too; rejecting tells the client its
  setting was not used, where stripping would silently drop it). JSON Schemas the client supplies
  (``tools[].function.parameters``, ``response_format.json_schema.schema``, legacy
  ``functions[].parameters``, vLLM's ``guided_json`` / ``structured_outputs.json``) are opaque
  data and not inspected: a tool may legitimately take a ``base_url`` argument.
* Every rejection is a :class:`~inferlb.engine.errors.ClientError` (400 ``InvalidRequest`` or
  413 ``PayloadTooLarge``) with ``param`` set to the field path (``messages[2].content``) and a
  message that names JSON types, never Python reprs or tracebacks, and echoes client text only
  clipped to ~64 characters. No other exception escapes, whatever the input.

Policies for the catalog rows that leave a choice (docs/reliability.md §8):

* Not body-level, so not here: rows 4 (Content-Type), 5 as a cap enforced while streaming the
  body, 6–8, 32–40 (HTTP layer), 16–18 (model registry: ``model`` is an opaque string here) and
  22 (context window: the caller has ``prompt_bytes``, ``prompt_token_ids`` and ``max_tokens``).
* Row 12, lone surrogates (``"\\ud800"``): 400. Valid surrogate *pairs* (``"\\ud83d\\ude00"``,
  what ``json.dumps`` emits for emoji) decode to one code point and are fine.
* Row 13, duplicate keys: 400 by default (the catalog's "safest"): the gateway validates the
  last value while a node or a log reader that sees the raw bytes may take the first, a classic
  parser differential. ``reject_duplicate_keys=False`` restores last-wins.
* Row 14, ``\\u0000`` in content: forwarded (models accept it; prompts are not stored by
  default, and the audit path stores lengths and hashes only). NUL and other control characters
  are rejected in ``model`` and ``user``, which do reach logs and the audit row.
* Row 23, ``max_tokens`` over the cap: 400, never clamped.
* ``tool_choice`` ``none``/``auto`` without ``tools`` pass; ``required`` or a named function
  without a matching tool is a 400.

Speed (it runs on every request). On a typical 355-byte streaming chat body with 3 messages,
measured as min of 7 x 50k runs: ``validate_chat`` takes about 9.6 µs. A strict pydantic v2
model of the same fields takes about 5.6 µs for ``model_validate`` alone. That model cannot
express the forbidden-field walk, the byte accounting, the alias and ``stream_options`` rules or
paths that echo nothing, and adding those around it gives about 13.6 µs. So the checks are
hand-written. ``parse_json_body`` takes about 10.6 µs on the same bytes; plain ``json.loads``
takes about 5 µs, and the duplicate-key hook is most of the difference. These were measured on a
2-core dev box that other jobs were loading (Python 3.11.7, pydantic 2.14), so compare the
ratios, not the absolute numbers. A quick check (its body is shorter than the one above)::

    /work/venv/bin/python -m timeit -s "from inferlb.engine.api.validation import validate_chat" \\
      -s "b={'model':'m','messages':[{'role':'system','content':'Be brief.'},\\
      {'role':'user','content':'Hi'},{'role':'assistant','content':'Hello'}],\\
      'max_tokens':64,'temperature':0.7,'stream':True,'stream_options':{'include_usage':True}}" \\
      "validate_chat(b)"
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal, NoReturn

from inferlb.engine.api import validation_fields as f
from inferlb.engine.errors import InvalidRequest, PayloadTooLarge

__all__ = [
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_MAX_MESSAGES",
    "DEFAULT_MAX_N",
    "ValidatedRequest",
    "parse_json_body",
    "validate_chat",
    "validate_completions",
    "validate_embeddings",
    "validate_predict",
]

DEFAULT_MAX_MESSAGES: Final = 2048
DEFAULT_MAX_ITEMS: Final = 2048  # batch size of a prompt / input list
DEFAULT_MAX_N: Final = 8   # Settings.max_n (INFERLB_MAX_N) overrides it per gateway
_NUMBER_MAX_CHARS: Final = 4300  # Python's default int_max_str_digits
_DIMENSIONS_MAX: Final = 65536
_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_MEDIA_PARTS: Final = frozenset({"image_url", "video_url", "audio_url"})
_OPAQUE_PARTS: Final = frozenset({"image_embeds", "file"})
_NO_CONTENT_OK: Final = ("tool_calls", "function_call", "audio", "refusal")  # assistant content may be null
_ENCODING_FORMATS: Final = frozenset({"float", "base64"})
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class ValidatedRequest:
    """What the gateway reads from a valid request; ``body`` is forwarded to the node.

    ``prompt_bytes`` counts the UTF-8 bytes of the text the model will read (message text, text
    parts, prompt strings, input strings; not images or audio). ``prompt_token_ids`` counts the
    tokens a client sent directly as ids (``prompt: [1, 2, 3]``); estimate the prompt as
    ``prompt_token_ids + tokens(prompt_bytes)``. ``prompt_text`` joins the text with newlines and
    is only built when asked for (a tokenizer, or an affinity router hashing the prompt's
    prefix); it must never be logged. ``include_usage`` is true only for a stream with
    ``stream_options.include_usage`` (non-streaming answers always carry usage). ``body`` is the
    client's own dict (not copied, nothing removed).
    """

    endpoint: Literal["chat", "completions", "embeddings", "responses"]
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    n: int
    prompt_bytes: int
    prompt_text: str | None
    body: dict[str, Any]
    prompt_token_ids: int = 0


def _fail(message: str, param: str | None = None, code: str = "invalid_value") -> NoReturn:
    raise InvalidRequest(message, param=param, code=code)


# -- parsing -------------------------------------------------------------------------------------


def _reject_constant(name: str) -> NoReturn:
    _fail(f"'{name}' is not valid JSON; numbers must be finite", None, "invalid_json")


def _parse_float(text: str) -> float:
    if len(text) > _NUMBER_MAX_CHARS:
        _fail("a number literal in the body is too long", None, "invalid_json")
    value = float(text)
    if not math.isfinite(value):
        _fail("a number in the body is out of range (must be finite)", None, "invalid_json")
    return value


def _parse_int(text: str) -> int:
    if len(text) > _NUMBER_MAX_CHARS:
        _fail("a number literal in the body is too long", None, "invalid_json")
    return int(text)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                _fail(f"duplicate key '{f.clip(key)}' in a JSON object", f.clip(key), "duplicate_key")
            seen.add(key)
    return obj


def _too_deep(root: dict[str, Any], max_depth: int) -> bool:
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return False


def _find_surrogate(root: dict[str, Any]) -> None:
    """400 naming the first string (or key) holding a lone surrogate; paths built only then."""
    stack: list[tuple[dict[str, Any] | list[Any], f.Link | None]] = [(root, None)]
    while stack:
        node, link = stack.pop()
        items: Iterable[tuple[str | int, Any]] = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if type(value) is str:
                if _SURROGATE.search(value):
                    where = f.render_path((link, key))
                    _fail(f"'{f.clip(where)}' contains a lone UTF-16 surrogate", where, "invalid_encoding")
            elif type(value) is dict or type(value) is list:
                stack.append((value, (link, key)))
            if type(key) is str and _SURROGATE.search(key):
                _fail("a key contains a lone UTF-16 surrogate", None, "invalid_encoding")


def parse_json_body(
    raw: bytes, *, max_bytes: int, max_depth: int, reject_duplicate_keys: bool = True
) -> dict[str, Any]:
    """Decode a request body into a JSON object, or raise a :class:`ClientError`.

    413 over ``max_bytes``. 400 for: an empty body, invalid UTF-8, invalid JSON, ``NaN`` /
    ``Infinity`` / ``-Infinity`` or a number that overflows to infinity, a number literal over
    4,300 characters, a top level that is not an object, nesting deeper than ``max_depth`` (the
    top-level object is depth 1; Python's ``RecursionError`` on absurd depths is caught), lone
    surrogate escapes, and duplicate keys unless ``reject_duplicate_keys`` is false. A leading
    UTF-8 BOM is tolerated (RFC 8259 §8.1).
    """
    if len(raw) > max_bytes:
        raise PayloadTooLarge(f"request body is larger than the limit of {max_bytes} bytes", code="payload_too_large")
    if not raw.strip():
        _fail("request body is empty; send a JSON object", None, "invalid_json")
    # Decode and parse errors are turned into messages here and raised *outside* the ``except``
    # blocks: UnicodeDecodeError.object and JSONDecodeError.doc hold the whole body, and must not
    # ride along as ``__context__`` into a logged traceback (docs/reliability.md §7, prompt privacy).
    problem: tuple[str, str] | None = None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = (f"request body is not valid UTF-8 (at byte {exc.start})", "invalid_encoding")
    if problem is not None:
        _fail(problem[0], None, problem[1])
    limit = sys.get_int_max_str_digits()
    try:
        obj = json.loads(
            text[1:] if text.startswith("\ufeff") else text,
            parse_constant=_reject_constant,
            parse_float=_parse_float,
            parse_int=int if 0 < limit <= _NUMBER_MAX_CHARS else _parse_int,
            object_pairs_hook=_unique_pairs if reject_duplicate_keys else None,
        )
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        problem = (f"request body is not valid JSON: {exc.msg} at {where}", "invalid_json")
    except RecursionError:
        problem = (f"request body is nested deeper than {max_depth} levels", "json_too_deep")
    except ValueError:  # int() over sys.int_info's digit limit
        problem = ("a number literal in the body is too long", "invalid_json")
    if problem is not None:
        _fail(problem[0], None, problem[1])
    if type(obj) is not dict:
        _fail(f"request body must be a JSON object, got {f.json_type(obj)}", None, "invalid_type")
    if raw.count(b"[") + raw.count(b"{") > max_depth and _too_deep(obj, max_depth):
        _fail(f"request body is nested deeper than {max_depth} levels", None, "json_too_deep")
    if b"\\ud" in raw or b"\\uD" in raw:
        _find_surrogate(obj)
    return obj


# -- text accounting -----------------------------------------------------------------------------


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


# -- entry points --------------------------------------------------------------------------------


def _check_common(body: dict[str, Any], max_tokens_cap: int | None, max_n: int) -> tuple[bool, bool, int | None, int]:
    stream, include_usage = f.check_stream(body)
    return stream, include_usage, f.check_max_tokens(body, max_tokens_cap), f.check_n(body, max_n)


def _schemas(body: dict[str, Any]) -> list[object]:
    """Client JSON Schemas outside ``tools`` / ``response_format``: vLLM's ``guided_json`` and
    ``structured_outputs.json``, and the legacy ``functions[].parameters``. Opaque data."""
    found: list[object] = []
    if "guided_json" in body:
        found.append(body["guided_json"])
    outputs = body.get("structured_outputs")
    if type(outputs) is dict and "json" in outputs:
        found.append(outputs["json"])
    functions = body.get("functions")
    if type(functions) is list:
        found += [fn["parameters"] for fn in functions if type(fn) is dict and "parameters" in fn]
    return found


def _require_object(body: object) -> dict[str, Any]:
    if type(body) is not dict:
        _fail(f"request body must be a JSON object, got {f.json_type(body)}", None, "invalid_type")
    return body


def validate_chat(
    body: dict[str, Any],
    *,
    want_text: bool = False,
    max_tokens_cap: int | None = None,
    max_n: int = DEFAULT_MAX_N,
    max_messages: int = DEFAULT_MAX_MESSAGES,
) -> ValidatedRequest:
    """Validate a ``/v1/chat/completions`` body (see the module docstring for the rules)."""
    body = _require_object(body)
    model = f.check_model(body)
    text = _Text(want_text)
    _check_messages(body, text, max_messages)
    stream, include_usage, max_tokens, n = _check_common(body, max_tokens_cap, max_n)
    f.check_sampling(body)
    opaque = _schemas(body)
    if "response_format" in body and (schema := f.check_response_format(body)) is not None:
        opaque.append(schema)
    if "tools" in body or "tool_choice" in body:
        names, schemas = f.check_tools(body)
        opaque += schemas
        f.check_tool_choice(body, names)
    f.find_forbidden(body, opaque)
    return ValidatedRequest("chat", model, stream, include_usage, max_tokens, n, text.nbytes, text.joined(), body)


def validate_completions(
    body: dict[str, Any],
    *,
    want_text: bool = False,
    max_tokens_cap: int | None = None,
    max_n: int = DEFAULT_MAX_N,
    max_items: int = DEFAULT_MAX_ITEMS,
) -> ValidatedRequest:
    """Validate a ``/v1/completions`` body: ``prompt`` is a non-empty string, array of strings,
    array of token ids or array of arrays of token ids; ``best_of`` (if given) ≥ ``n``."""
    body = _require_object(body)
    model = f.check_model(body)
    text = _Text(want_text)
    ids = _check_prompt(body, "prompt", text, max_items)
    stream, include_usage, max_tokens, n = _check_common(body, max_tokens_cap, max_n)
    f.check_sampling(body)
    best_of = f.opt_int(body, "best_of", 1, max_n)
    if best_of is not None and best_of < n:
        _fail("'best_of' must be greater than or equal to 'n'", "best_of")
    opaque = _schemas(body)
    opaque.append(body["prompt"])
    if "response_format" in body and (schema := f.check_response_format(body)) is not None:
        opaque.append(schema)
    f.find_forbidden(body, opaque)
    return ValidatedRequest(
        "completions", model, stream, include_usage, max_tokens, n, text.nbytes, text.joined(), body, ids
    )


def validate_embeddings(
    body: dict[str, Any], *, want_text: bool = False, max_items: int = DEFAULT_MAX_ITEMS
) -> ValidatedRequest:
    """Validate a ``/v1/embeddings`` body: ``input`` as for ``prompt``; ``encoding_format``
    ``float`` | ``base64``; ``dimensions`` an integer ≥ 1; ``user`` as for chat."""
    body = _require_object(body)
    model = f.check_model(body)
    text = _Text(want_text)
    ids = _check_prompt(body, "input", text, max_items)
    fmt = body.get("encoding_format")
    if fmt is not None and (type(fmt) is not str or fmt not in _ENCODING_FORMATS):
        _fail("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    f.opt_int(body, "dimensions", 1, _DIMENSIONS_MAX)
    f.check_user(body)
    f.find_forbidden(body, (body["input"],))
    return ValidatedRequest("embeddings", model, False, False, None, 1, text.nbytes, text.joined(), body, ids)


def validate_predict(body: dict[str, Any]) -> dict[str, Any]:
    """Validate a generic ``/v1/predict`` payload: only that it is an object with no field that
    would redirect traffic or credentials (size, depth, encoding: :func:`parse_json_body`).
    Returns ``body`` itself."""
    body = _require_object(body)
    f.find_forbidden(body)
    return body
