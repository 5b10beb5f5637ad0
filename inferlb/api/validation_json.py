"""Request-body decoding for :mod:`inferlb.api.validation` (pure, no I/O).

:func:`parse_json_body` turns the raw bytes of a request into a JSON object or raises a
:class:`~inferlb.errors.ClientError`; the rules and the policies behind them are in the
docstring of :mod:`inferlb.api.validation` (rows 12 and 13 of docs/reliability.md §8).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable
from typing import Any, Final, NoReturn

from inferlb.api import validation_fields as f
from inferlb.api.validation_fields import fail as _fail
from inferlb.errors import PayloadTooLarge

__all__ = ["parse_json_body"]

_NUMBER_MAX_CHARS: Final = 4300  # Python's default int_max_str_digits
_SURROGATE = re.compile("[\ud800-\udfff]")


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
