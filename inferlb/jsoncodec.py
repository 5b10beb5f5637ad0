"""The JSON codec of the hot paths: orjson where it can, the standard library where it cannot.

Used where the gateway encodes or decodes JSON once or more per request (the audit log's lines and
the database's JSON columns, the body sent to a node, the node's answers and SSE events). orjson
is a compiled codec, several times faster than :mod:`json` on these small documents
(docs/benchmarks.md, "CPU per request by component").

Contract:

* :func:`dumps` returns compact JSON bytes (no spaces) equal in meaning to ``json.dumps(obj,
  separators=(",", ":"), default=default)``. Non-ASCII text is written as UTF-8, not ``\\uXXXX``
  escapes (both are JSON). Where orjson refuses a document (an int beyond 64 bits, a lone
  surrogate in a string, a dict key that is not a string, int, float, bool or None, a type
  ``default`` cannot turn into one it knows), the standard library writes it, ASCII-escaped, as
  before: the output is the same JSON document either way, and no input that encoded before
  fails now. ``NaN`` and infinities become ``null`` (orjson; JSON has no spelling for them).
* :func:`loads` decodes bytes or text like :func:`json.loads` (last duplicate key wins); a
  document orjson refuses (``NaN``, ``Infinity``) is decoded by the standard library, so what
  decoded before still decodes, and what :func:`json.loads` rejects raises :class:`ValueError`
  (``json.JSONDecodeError``) as before. orjson reads an integer beyond 64 bits as a float, so a
  document with a run of 19 or more digits anywhere goes to the standard library, which keeps it
  exact.

Request bodies from clients are *not* parsed here: their parser (api/validation_json.py) rejects
duplicate keys and NaN, which needs the standard library's hooks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["dumps", "loads"]

_OPTS = orjson.OPT_NON_STR_KEYS
# 2**63 has 19 digits: a shorter run of digits is an integer orjson reads exactly.
_LONG_DIGITS_B = re.compile(rb"[0-9]{19}")
_LONG_DIGITS_S = re.compile(r"[0-9]{19}")


def dumps(obj: Any, *, default: Callable[[Any], Any] | None = None) -> bytes:
    """Compact JSON bytes of ``obj`` (see the module docstring)."""
    try:
        return orjson.dumps(obj, default=default, option=_OPTS)
    except TypeError:   # orjson.JSONEncodeError: what it cannot write, the standard library can
        return json.dumps(obj, separators=(",", ":"), default=default).encode("ascii")


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """The document in ``data`` (see the module docstring); ValueError when it is not JSON."""
    if isinstance(data, memoryview):
        data = bytes(data)
    long = _LONG_DIGITS_S.search(data) if isinstance(data, str) else _LONG_DIGITS_B.search(data)
    if long is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)
