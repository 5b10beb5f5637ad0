"""Client-input validation at the parse level: docs/reliability.md §8 rows V-01..V-14 (body bytes →
JSON object, api/validation_json.py).

Every rejection must be a ClientError with the right status and ``param``, and its message must
carry no traceback, no Python repr and no long echo of client input (validation_support.CANARY).
"""

from __future__ import annotations

import json

import pytest

from inferlb.api.validation import (
    validate_chat,
)
from inferlb.errors import ClientError, InvalidRequest, PayloadTooLarge
from tests.api.validation_support import CANARY, MAX_BYTES, _assert_clean, _parse, _rows

# -- parse level: rows 1, 2, 3, 5, 9, 10, 11, 12, 13 ---------------------------------------------

DEEP_ARRAY = b"[" * 20_000 + b"]" * 20_000
DEEP_TOOL_SCHEMA = (
    b'{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":'
    b'{"name":"f","parameters":' + b'{"a":' * 1000 + b"1" + b"}" * 1000 + b"}}]}"
)

PARSE_CASES = [
    ("V-01-truncated", b'{"model":', 400, "invalid_json"),
    ("V-01-form-encoded", b"model=m&stream=true", 400, "invalid_json"),
    ("V-01-trailing-data", b'{"a": 1} trailing', 400, "invalid_json"),
    ("V-02-array", b"[]", 400, "invalid_type"),
    ("V-02-number", b"123", 400, "invalid_type"),
    ("V-02-null", b"null", 400, "invalid_type"),
    ("V-02-string", b'"s"', 400, "invalid_type"),
    ("V-02-bool", b"true", 400, "invalid_type"),
    ("V-03-empty", b"", 400, "invalid_json"),
    ("V-03-whitespace", b" \r\n\t", 400, "invalid_json"),
    ("V-05-over-cap", b'{"p":"' + b"x" * MAX_BYTES + b'"}', 413, "payload_too_large"),
    ("V-09-array-20000-deep", DEEP_ARRAY, 400, "json_too_deep"),
    ("V-09-array-100000-deep-unclosed", b"[" * 100_000, 400, "json_too_deep"),
    ("V-09-object-1000-deep-in-tool-params", DEEP_TOOL_SCHEMA, 400, "json_too_deep"),
    ("V-09-depth-65-over-64", b'{"a":' * 65 + b"1" + b"}" * 65, 400, "json_too_deep"),
    ("V-10-nan", b'{"t": NaN}', 400, "invalid_json"),
    ("V-10-infinity", b'{"t": Infinity}', 400, "invalid_json"),
    ("V-10-minus-infinity", b'{"t": -Infinity}', 400, "invalid_json"),
    ("V-10-overflow-to-inf", b'{"t": 1e999}', 400, "invalid_json"),
    ("V-10-million-digit-int", b'{"t": ' + b"9" * 1_000_000 + b"}", 400, "invalid_json"),
    ("V-10-million-digit-float", b'{"t": 0.' + b"1" * 1_000_000 + b"}", 400, "invalid_json"),
    ("V-11-invalid-utf8", b'{"model": "\xff\xfe"}', 400, "invalid_encoding"),
    ("V-11-bad-continuation", b'{"model": "\xc3\x28"}', 400, "invalid_encoding"),
    ("V-11-utf8-encoded-surrogate", b'{"model": "\xed\xa0\x80"}', 400, "invalid_encoding"),
    ("V-11-utf16-body", b"\xff\xfe{\x00}\x00", 400, "invalid_encoding"),
]


@pytest.mark.parametrize(("raw", "status", "code"), _rows(PARSE_CASES))
def test_parse_rejects(raw: bytes, status: int, code: str) -> None:
    with pytest.raises(ClientError) as info:
        _parse(raw)
    err = info.value
    assert type(err) is (PayloadTooLarge if status == 413 else InvalidRequest)
    assert err.status == status and err.code == code and err.param is None
    assert err.__context__ is None and err.__cause__ is None  # no chained error holding the body
    _assert_clean(err)


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        pytest.param(
            rb'{"messages":[{"role":"user","content":"a\ud800b"}]}',
            "messages[0].content",
            id="V-12-lone-high",
        ),
        pytest.param(rb'{"x":{"y":["ok","\uDFFF"]}}', "x.y[1]", id="V-12-lone-low-nested"),
        pytest.param(rb'{"s":"\ude00\ud83d"}', "s", id="V-12-reversed-pair"),
    ],
)
def test_lone_surrogates_rejected(raw: bytes, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        _parse(raw)
    assert info.value.param == param and info.value.code == "invalid_encoding"
    _assert_clean(info.value)


def test_surrogate_pair_and_escaped_backslash_accepted() -> None:
    body = _parse(rb'{"a":"\ud83d\ude00","b":"\\ud800 is text","c":"\u00e9"}')
    assert body == {"a": "\U0001f600", "b": "\\ud800 is text", "c": "é"}


def test_v13_duplicate_keys_rejected_by_default_last_wins_when_allowed() -> None:
    raw = b'{"model":"m","stream":false,"messages":[],"stream":true}'
    with pytest.raises(InvalidRequest) as info:
        _parse(raw)
    assert info.value.param == "stream" and info.value.code == "duplicate_key"
    _assert_clean(info.value)
    assert _parse(raw, reject_duplicate_keys=False)["stream"] is True


def test_v13_duplicate_long_key_is_clipped() -> None:
    raw = json.dumps({"x": 1}).replace('"x"', f'"{CANARY}": 1, "{CANARY}"').encode()
    with pytest.raises(InvalidRequest) as info:
        _parse(raw)
    _assert_clean(info.value)


def test_v14_nul_in_content_is_forwarded_but_not_in_model() -> None:
    body = _parse(rb'{"model":"m","messages":[{"role":"user","content":"a\u0000b"}]}')
    assert validate_chat(body).body["messages"][0]["content"] == "a\x00b"
    with pytest.raises(InvalidRequest) as info:
        validate_chat(_parse(rb'{"model":"m\u0000x","messages":[{"role":"user","content":"a"}]}'))
    assert info.value.param == "model"


def test_parse_edges_accepted() -> None:
    assert _parse(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}  # UTF-8 BOM tolerated
    assert _parse(b'{"a":' * 63 + b"[1]" + b"}" * 63) is not None  # depth exactly 64
    assert _parse(b'{"x": 1e308, "y": -0.0, "z": 1e-999}')["z"] == 0.0
    assert _parse(b'{"p":"' + b"x" * (MAX_BYTES - 8) + b'"}')  # exactly at the cap
    wide = b'{"a":[' + b",".join([b"[1]"] * 5000) + b"]}"  # many brackets, shallow
    assert len(_parse(wide)["a"]) == 5000
