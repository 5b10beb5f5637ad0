"""Shared by the tests of api/validation*.py: the canary, the error-cleanliness check, the
case-table rows and the request builders."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inferlb.api.validation_json import parse_json_body
from inferlb.errors import ClientError

__all__ = [
    "CANARY",
    "MAX_BYTES",
    "MAX_DEPTH",
    "_DROP",
    "_TOOL",
    "_assert_clean",
    "_assistant_calls",
    "_chat",
    "_fmt",
    "_fn",
    "_msgs",
    "_parse",
    "_parts",
    "_rows",
    "_tools",
    "_user",
]

CANARY = "canary-7f3a" + "Z" * 300  # must never come back in an error message
MAX_BYTES = 1 << 20
MAX_DEPTH = 64


def _assert_clean(err: ClientError) -> None:
    """The envelope is well formed and safe: no traceback, repr or long echo of the input."""
    env = err.envelope()["error"]
    assert set(env) == {"message", "type", "param", "code"}
    msg = env["message"]
    assert isinstance(msg, str) and 0 < len(msg) <= 300
    assert "Traceback" not in msg and 'File "' not in msg
    assert "<class" not in msg and "object at 0x" not in msg
    for text in (msg, env["param"] or ""):
        assert CANARY[:80] not in text
    json.dumps(err.envelope(), ensure_ascii=False).encode("utf-8")  # no lone surrogates either


def _parse(raw: bytes, **kw: Any) -> dict[str, Any]:
    return parse_json_body(raw, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, **kw)


def _chat(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"},
        ],
        "canary_field": CANARY,
    }
    body.update(over)
    return {k: v for k, v in body.items() if v is not _DROP}


_DROP: Any = object()


def _rows(rows: list[tuple[Any, ...]]) -> list[Any]:
    """Case tables are ``(id, *args)`` rows; the id doubles as the catalog row (V-nn)."""
    return [pytest.param(*args, id=case_id) for case_id, *args in rows]


_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def _msgs(*messages: Any) -> dict[str, Any]:
    return {"messages": list(messages)}


def _user(content: Any, **extra: Any) -> dict[str, Any]:
    return _msgs({"role": "user", "content": content, **extra})


def _parts(*parts: Any) -> dict[str, Any]:
    return _user(list(parts))


def _assistant_calls(calls: Any) -> dict[str, Any]:
    return _msgs({"role": "assistant", "tool_calls": calls})


def _fmt(**response_format: Any) -> dict[str, Any]:
    return {"response_format": response_format}


def _tools(*tools: Any, **over: Any) -> dict[str, Any]:
    return {"tools": list(tools), **over}


def _fn(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": function}
